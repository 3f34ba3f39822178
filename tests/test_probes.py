"""What an attacker's probes and a newcomer's trial broke, kept as regression tests: a user's files survive a build,
nothing is answered silently wrong, and every output reads back as written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgeo_index import settings
from mgeo_index.catalog.build import build
from mgeo_index.catalog.ownership import NotAnIndexDirectory
from conftest import copy_index


def _cli(*args):
    from typer.testing import CliRunner

    from mgeo_index.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


# --------------------------------------------------------------------------- a build never loses a user's files

def _users_directory(path):
    path.mkdir()
    files = {"index-backup.faiss": b"my backup", "sparse-features.npz": b"my features",
             "index.json": b'{"project": "mine"}', "rejects.tsv": b"my rejects\n"}
    for name, content in files.items():
        (path / name).write_bytes(content)
    return files


def test_build_refuses_a_directory_holding_a_users_files_and_touches_none(tmp_path):
    target = tmp_path / "work"
    files = _users_directory(target)
    for force in (False, True):  # index.json and rejects.tsv bear a build's names: never written over
        with pytest.raises(NotAnIndexDirectory, match=r"index\.json, rejects\.tsv\); a build never writes over"):
            build(settings.SAMPLE_CATALOG, target, id_column="poi_id", device="cpu", force=force)
        assert {p.name: p.read_bytes() for p in target.iterdir()} == files
    (target / "index.json").unlink(), (target / "rejects.tsv").unlink()
    del files["index.json"], files["rejects.tsv"]
    result = _cli("build", settings.SAMPLE_CATALOG, "--index-dir", target, "--id-column", "poi_id")
    assert result.exit_code != 0 and "--force" in result.output and "index-backup.faiss" in result.output
    assert {p.name: p.read_bytes() for p in target.iterdir()} == files


@pytest.mark.parametrize("force", [False, True])
def test_files_named_as_a_build_writes_them_are_a_users_when_no_build_of_ours_wrote_them(tmp_path, force):
    target = tmp_path / "d"
    target.mkdir()
    files = {"rejects.tsv": b"mine\n", "index-1.faiss": b"mine\n", "sparse-1.npz": b"mine\n"}
    for name, content in files.items():
        (target / name).write_bytes(content)
    args = ("--force",) if force else ()
    result = _cli("build", settings.SAMPLE_CATALOG, "--index-dir", target, "--id-column", "poi_id", *args)
    assert result.exit_code == 1 and "never writes over them" in result.output
    assert {p.name: p.read_bytes() for p in target.iterdir()} == files


def test_a_forced_build_and_its_clean_up_delete_only_files_mgeo_index_wrote(sample_index, tmp_path):
    target = tmp_path / "work"
    files = _users_directory(target)
    (target / "index.json").unlink()  # a foreign index.json is overwritten by a forced build: keep the rest
    del files["index.json"]
    files.pop("rejects.tsv")
    (target / "rejects.tsv").unlink()
    files["index-7.faiss.bak"] = b"look-alike"
    (target / "index-7.faiss.bak").write_bytes(b"look-alike")
    build(settings.SAMPLE_CATALOG, target, id_column="poi_id", device="cpu", force=True)
    for _ in range(3):  # new generations; the old ones are collected
        (target / "extra.csv").write_text("poi_id,address\nX1,北京市朝阳区建国路88号\n", encoding="utf-8")
        build(target / "extra.csv", target, id_column="poi_id", device="cpu", catalog="extra")
    for name, content in files.items():
        assert (target / name).read_bytes() == content, name
    # the collected generations' own files are gone, the current ones are there
    descriptor = json.loads((target / "index.json").read_text(encoding="utf-8"))
    assert (target / descriptor["index_file"]).exists()


def test_an_index_directory_mgeo_index_made_is_built_into_again(sample_index, tmp_path):
    index_dir = copy_index(sample_index, tmp_path / "idx")
    (index_dir / "notes.txt").write_text("the user's own notes\n", encoding="utf-8")  # beside our index.json
    build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device="cpu")
    assert (index_dir / "notes.txt").read_text(encoding="utf-8") == "the user's own notes\n"


# --------------------------------------------------------------------------- a fresh server takes its largest request

def test_a_fresh_server_answers_its_own_largest_request(sample_index, tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    import time

    from fastapi.testclient import TestClient

    from mgeo_index.service.app import ServeConfig, create_app

    index_dir = copy_index(sample_index, tmp_path / "idx")
    config = ServeConfig(index_dir=index_dir, api_key="K")
    headers = {"X-API-Key": "K"}
    queries = [f"浙江省杭州市西湖区文三路{i}号" for i in range(config.max_items)]  # the documented --max-items
    with TestClient(create_app(config)) as client:
        deadline = time.monotonic() + 300
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        first = client.post("/v1/resolve", json={"queries": queries, "rerank": False}, headers=headers)
        assert first.status_code == 200, first.text
        assert len(first.json()["results"]) == config.max_items
        for _ in range(2):  # slower work measured: cheaper work is still taken
            assert client.post("/v1/resolve", json={"queries": queries[:3], "top_k": 100},
                               headers=headers).status_code == 200
        for _ in range(3):
            again = client.post("/v1/resolve", json={"queries": queries, "rerank": False}, headers=headers)
            assert again.status_code == 200, again.text


# --------------------------------------------------------------------------- the address column, chosen by content

_ADDRESSES = ["广东省深圳市南山区南山街道中山路75号东方科技园9号楼", "江苏省南京市鼓楼区下关街道中山路89号星河广场14栋",
              "浙江省杭州市西湖区文三路478号华星时代广场", "北京市朝阳区建国路88号SOHO现代城", "上海市浦东新区世纪大道100号",
              "广州市天河区体育西路1号", "深圳市福田区深南大道6008号", "成都市武侯区人民南路4段1号"]


@pytest.mark.parametrize("header", [("id", "name", "location"), ("编号", "名称", "位置")])
def test_the_address_column_is_the_one_holding_addresses_and_a_column_named_id_is_the_id(tmp_path, header):
    catalog = tmp_path / "shops.csv"
    catalog.write_text(",".join(header) + "\n" + "".join(f"{i},site {i},{a}\n" for i, a in enumerate(_ADDRESSES)),
                       encoding="utf-8")
    result = _cli("build", catalog, "--index-dir", tmp_path / "idx")
    assert result.exit_code == 0, result.output
    assert f"address {header[2]!r}, id {header[0]!r}" in result.output and "look most like addresses" in result.output
    answer = _cli("resolve", "北京朝阳建国路88号", "--index-dir", tmp_path / "idx", "--json", "--top-k", "1")
    best = json.loads(answer.output)["matches"][0]
    assert best["address"] == "北京市朝阳区建国路88号SOHO现代城" and best["source_id"] == "3"
    again = _cli("build", catalog, "--index-dir", tmp_path / "idx", "--id-column", header[0])  # as it was chosen
    assert again.exit_code == 0, again.output


def test_two_columns_of_addresses_stop_the_build_naming_the_option(tmp_path):
    catalog = tmp_path / "routes.csv"
    catalog.write_text("code,from,to\n" + "".join(f"{i},{a},{_ADDRESSES[-1 - i]}\n" for i, a in enumerate(_ADDRESSES)),
                       encoding="utf-8")
    result = _cli("build", catalog, "--index-dir", tmp_path / "idx")
    assert result.exit_code != 0 and "--address-column" in result.output and "'from'" in result.output
    assert not (tmp_path / "idx" / "mgeo.db").exists()
    chosen = _cli("build", catalog, "--index-dir", tmp_path / "idx", "--address-column", "to")
    assert chosen.exit_code == 0, chosen.output


# --------------------------------------------------------------------------- CSV outputs read back as written

def test_the_table_writer_round_trips_values_and_neutralises_formulas():
    import csv
    import io

    from mgeo_index.tables import TableWriter

    values = ["a\rb", 'say "hi"', "x,y", "line\nbreak", "=HYPERLINK(\"http://evil\")", "+1+2", "-2层", "@SUM(A1)",
              "-1.5", "0.123456", "普通地址"]
    for raw in (False, True):
        out = io.StringIO(newline="")
        writer = TableWriter(out, ",", raw=raw)
        writer.writerow(values)
        writer.writerow(["next", "row"])
        rows = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
        assert len(rows) == 2 and rows[1] == ["next", "row"]  # no phantom row from the bare \r
        expected = values if raw else [("'" + v if v[0] in "=+-@" and v != "-1.5" else v) for v in values]
        assert rows[0] == expected


def test_normalize_and_match_outputs_have_no_phantom_rows_and_no_live_formulas(sample_index, tmp_path):
    import csv

    index_dir = copy_index(sample_index, tmp_path / "idx")
    source = tmp_path / "stores.csv"
    with open(source, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([["store_id", "address", "note"], ["S1", "深圳南山中山路75号\r东方科技园", "=1+1"],
                                  ["S2", "@南京鼓楼中山路89号", "+cmd"], ["S3", "杭州西湖文三路478号", "plain"]])
    out = tmp_path / "out.csv"
    result = _cli("normalize", source, "--index-dir", index_dir, "--out", out)
    assert result.exit_code == 0, result.output
    with open(out, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["store_id"] for r in rows] == ["S1", "S2", "S3"]
    assert rows[0]["address"] == "深圳南山中山路75号\r东方科技园" and rows[0]["note"] == "'=1+1"
    assert rows[1]["address"] == "'@南京鼓楼中山路89号" and rows[1]["note"] == "'+cmd"
    raw_out = tmp_path / "raw.csv"
    assert _cli("normalize", source, "--index-dir", index_dir, "--out", raw_out, "--raw-values").exit_code == 0
    with open(raw_out, encoding="utf-8", newline="") as fh:
        assert [r["note"] for r in csv.DictReader(fh)] == ["=1+1", "+cmd", "plain"]

    pairs = tmp_path / "pairs.tsv"
    with open(pairs, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh, delimiter="\t").writerows([["a", "b"], ["=cmd|' /C calc'!A0", "北京市朝阳区建国路88号\r3号楼"],
                                                  ["北京朝阳建国路88号", "北京市朝阳区建国路88号"]])
    scored = tmp_path / "scored.tsv"
    assert _cli("match", "--file", pairs, "--out", scored).exit_code == 0
    with open(scored, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == 2 and rows[0]["a"].startswith("'=") and rows[0]["b"] == "北京市朝阳区建国路88号\r3号楼"


def test_labels_export_writes_quotes_and_reads_back(sample_index, tmp_path):
    from mgeo_index.measure.evaluate import read_labeled_pairs

    index_dir = copy_index(sample_index, tmp_path / "idx")
    labels = tmp_path / "in.tsv"
    labels.write_text('a\tb\tlabel\n北京"朝阳"建国路88号\t北京市朝阳区建国路88号\texact_match\n'
                      '=1+1\t上海市浦东新区世纪大道100号\tnot_match\n', encoding="utf-8")
    assert _cli("labels", "import", labels, "--index-dir", index_dir).exit_code == 0
    out = tmp_path / "out.tsv"
    result = _cli("labels", "export", "--index-dir", index_dir, "--out", out)
    assert result.exit_code == 0, result.output
    a, b, gold = read_labeled_pairs(out)
    assert sorted(a) == sorted(["'=1+1", '北京"朝阳"建国路88号'])
    assert _cli("labels", "export", "--index-dir", index_dir, "--out", out, "--raw-values").exit_code == 0
    assert sorted(read_labeled_pairs(out)[0]) == sorted(["=1+1", '北京"朝阳"建国路88号'])


# --------------------------------------------------------------------------- serve without a key: Origin and Host

def test_serve_refuses_cross_origin_posts_and_unknown_hosts(sample_index, tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from mgeo_index.cli.serve_commands import allowed_hosts
    from mgeo_index.service.app import ServeConfig, create_app

    index_dir = copy_index(sample_index, tmp_path / "idx")
    config = ServeConfig(index_dir=index_dir, allowed_hosts=allowed_hosts("127.0.0.1", None))  # as `serve` starts
    local = {"Host": "127.0.0.1:8000"}
    with TestClient(create_app(config)) as client:
        evil = client.post("/v1/admin/reload?force=true", headers={**local, "Origin": "http://evil.example"})
        assert evil.status_code == 403
        assert client.post("/v1/admin/reload", headers={**local, "Origin": "null"}).status_code == 403
        rebound = client.get("/healthz", headers={"Host": "evil.example:8000"})  # DNS rebinding: another name
        assert rebound.status_code == 400
        assert client.get("/healthz", headers=local).status_code == 200
        same = client.post("/v1/admin/reload", headers={**local, "Origin": "http://127.0.0.1:8000"})
        assert same.status_code != 403  # this server's own page (or a client sending no Origin) is served
        assert client.post("/v1/admin/reload", headers=local).status_code != 403
    assert allowed_hosts("0.0.0.0", None) is None and allowed_hosts("0.0.0.0", ["api.example"]) == ("api.example",)


# --------------------------------------------------------------------------- review: overflow, key guessing, sessions

def test_review_refuses_huge_ids_throttles_wrong_keys_and_ends_sessions_at_logout(sample_index, tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from mgeo_index.api import AddressIndex
    from mgeo_index.review import queue as review_queue
    from mgeo_index.review.app import SESSION_COOKIE, THROTTLE_FAILURES, ReviewState, create_app, parse_api_keys

    index_dir = copy_index(sample_index, tmp_path / "idx")
    queries = tmp_path / "queries.txt"
    queries.write_text("深圳南山中山路75号东方科技园\n南京鼓楼中山路89号星河广场\n", encoding="utf-8")
    with AddressIndex.open(index_dir, device="cpu") as index:
        info = review_queue.open_queue(index, file=queries)
        state = ReviewState(engine=index.resolver.engine, queue=info.name, model_version=review_queue.model_version(index),
                            keys=parse_api_keys(["alice:s3cret-a"]))
        client = TestClient(create_app(state))
        json_key = {"Accept": "application/json", "X-API-Key": "s3cret-a"}
        item = client.get("/", headers=json_key).json()["item"]
        for field in ("item_id", "version"):
            data = {"item_id": item["id"], "version": item["version"], "model_version": item["model_version"],
                    "decision": "skip", field: 2**70}
            answer = client.post("/decide", data=data, headers=json_key)
            assert answer.status_code == 422 and "between" in answer.json()["detail"]
        assert client.get("/", headers=json_key).status_code == 200  # the connection and the app are fine

        login = client.post("/login", data={"key": "s3cret-a"}, follow_redirects=False)
        token = login.cookies.get(SESSION_COOKIE) or client.cookies.get(SESSION_COOKIE)
        assert token and "s3cret-a" not in token
        assert client.get("/", headers={"Accept": "application/json"}).status_code == 200
        visited = client.get("/logout", follow_redirects=False)  # a typed URL: back to the page, still logged in
        assert visited.status_code == 303 and visited.headers["location"] == "/"
        assert client.get("/", headers={"Accept": "application/json"}).status_code == 200
        client.post("/logout")
        client.cookies.set(SESSION_COOKIE, token)  # the old cookie, kept by an attacker
        assert client.get("/", headers={"Accept": "application/json"}).status_code == 401

        reviewer = TestClient(create_app(state))  # logged in before the guessing starts (the same client address)
        reviewer.post("/login", data={"key": "s3cret-a"}, follow_redirects=False)
        guesser = TestClient(create_app(state))
        state.throttle.seen.clear()  # the dead cookie above counted as one wrong try: start the count afresh
        codes = [guesser.post("/login", data={"key": f"guess-{i}"}).status_code for i in range(THROTTLE_FAILURES + 5)]
        assert codes[:THROTTLE_FAILURES] == [401] * THROTTLE_FAILURES and set(codes[THROTTLE_FAILURES:]) == {429}
        refused = guesser.post("/login", data={"key": "s3cret-a"})  # even the right key waits out the window
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert guesser.get("/", headers=json_key).status_code == 429  # a key in a header is a try too
        # one client's wrong keys lock out no reviewer: a live session and the health check go on
        assert reviewer.get("/", headers={"Accept": "application/json"}).status_code == 200
        assert guesser.get("/healthz").status_code == 200


def test_review_reads_no_forwarded_header_unless_told_which_proxies_send_it(sample_index, tmp_path, monkeypatch):
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    import uvicorn

    queries = tmp_path / "queries.txt"
    queries.write_text("深圳南山中山路75号东方科技园\n", encoding="utf-8")
    index_dir = copy_index(sample_index, tmp_path / "idx")
    runs = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: runs.append(options))
    for extra in ((), ("--forwarded-allow-ips", "10.0.0.5")):
        result = _cli("review", "--index-dir", index_dir, "--file", queries, "--port", "8731", *extra)
        assert result.exit_code == 0, result.output
    assert [(r["proxy_headers"], r["forwarded_allow_ips"]) for r in runs] == [(False, None), (True, "10.0.0.5")]


# --------------------------------------------------------------------------- read-only indexes

@pytest.fixture
def read_only(tmp_path):
    """Make a directory read-only for this process, as a read-only mount or another user's copy is: mode bits when
    not root, the immutable attribute (chattr) as root; undone afterwards."""
    import os
    import subprocess

    made: list = []

    def make(path):
        if os.geteuid() != 0:
            for p in [path, *path.rglob("*")]:
                p.chmod(p.stat().st_mode & ~0o222)
            made.append(("chmod", path))
            return path
        done = subprocess.run(["chattr", "-R", "+i", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make a directory read-only as root here (chattr: {done.stderr.decode().strip()})")
        made.append(("chattr", path))
        return path

    yield make
    for how, path in made:
        if how == "chattr":
            subprocess.run(["chattr", "-R", "-i", str(path)], check=True)
        else:
            for p in [path, *path.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)


def test_a_read_only_index_resolves_and_checks_and_a_build_there_says_what_it_cannot_write(
        sample_index, tmp_path, read_only):
    index_dir = read_only(copy_index(sample_index, tmp_path / "idx"))
    answer = _cli("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "--top-k", "1")
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.output)["matches"][0]["source_id"] == "P0001"
    checked = _cli("check", "--index-dir", index_dir)
    assert checked.exit_code == 0 and "clean" in checked.output, checked.output
    built = _cli("build", settings.SAMPLE_CATALOG, "--index-dir", index_dir, "--id-column", "poi_id")
    assert built.exit_code != 0 and "read-only" in built.output and "Traceback" not in built.output
    assert len(built.output.strip().splitlines()) <= 3
    stores = tmp_path / "stores.csv"
    stores.write_text("id,addr\n1,深圳南山中山路75号东方科技园9号楼\n", encoding="utf-8")
    normalized = _cli("normalize", stores, "--index-dir", index_dir, "--out", tmp_path / "out.csv")
    assert normalized.exit_code == 1 and "read-only" in normalized.output and "--db" in normalized.output
    assert "readonly database" not in normalized.output and not (tmp_path / "out.csv").exists()


# --------------------------------------------------------------------------- nothing dropped silently

def test_blank_lines_of_a_normalize_input_keep_their_place_as_rejected_rows(sample_index, tmp_path):
    import csv

    index_dir = copy_index(sample_index, tmp_path / "idx")
    source = tmp_path / "stores.csv"
    source.write_text("store_id,address\nS1,深圳南山中山路75号东方科技园\n\nS2,南京鼓楼中山路89号星河广场\n   \n"
                      "S3,杭州西湖文三路478号\n", encoding="utf-8")
    out = tmp_path / "out.csv"
    assert _cli("normalize", source, "--index-dir", index_dir, "--out", out).exit_code == 0
    with open(out, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(source.read_text(encoding="utf-8").splitlines()) - 1  # every line after the header
    assert [(r["store_id"].strip(), r["status"] == "rejected") for r in rows] == [
        ("S1", False), ("", True), ("S2", False), ("", True), ("S3", False)]
    assert {r["reason"] for r in rows if r["status"] == "rejected"} == {"blank line (no fields)"}


def test_invisible_characters_and_full_width_copies_are_the_same_entry_and_counted_alike(tmp_path):
    from mgeo_index.text import normalize

    assert normalize("文三路\u200b478号") == normalize("\ufeff文三路\u202e478号\u200d") == normalize("文三路478号")
    catalog = tmp_path / "c.csv"
    catalog.write_text("address\n浙江省杭州市西湖区文三路478号\n浙江省杭州市西湖区文三路\u200b478号\n"
                       "浙江省杭州市西湖区文三路４７８号\n浙江省杭州市西湖区文三路478号\n\n", encoding="utf-8")
    result = build(catalog, tmp_path / "idx", device="cpu")
    assert (result.rows_inserted, result.rows_rejected, result.blank_lines) == (1, 3, 1)
    rejects = (tmp_path / "idx" / "rejects.tsv").read_text(encoding="utf-8")
    assert rejects.count("duplicate of line 2") == 3


def test_match_names_the_line_that_holds_undecodable_bytes(tmp_path):
    lines = ["a\tb"] + [f"北京朝阳建国路{i}号\t北京市朝阳区建国路{i}号" for i in range(1, 10)]
    data = ("\n".join(lines) + "\n").encode() + "上海".encode() + b"\xff\xfe" + "浦东\t上海市浦东新区\n杭州\t杭州市\n".encode()
    pairs = tmp_path / "pairs.tsv"
    pairs.write_bytes(data)
    out = tmp_path / "out.tsv"
    result = _cli("match", "--file", pairs, "--out", out)
    assert result.exit_code == 0, result.output
    assert "line 11: undecodable bytes" in " ".join(result.output.split())
    rows = out.read_text(encoding="utf-8").splitlines()
    assert len(rows) == 12 and rows[10].startswith("上海\ufffd\ufffd浦东") and rows[11].startswith("杭州")


# --------------------------------------------------------------------------- parse says what it knows

def test_parse_names_the_level_of_its_coordinates_one_name_per_level_and_the_users_letters():
    from mgeo_index.api import parse

    shown = parse("深圳市龙华区民治街道B栋3单元")
    assert shown.admin["district"] == "龙华区" and shown.admin["coordinates_level"] == "city"  # no centre for 龙华区
    building, = [e for e in shown.elements if e.label == "houseno"]
    assert (building.text, building.display) == ("b栋", "B栋")
    assert all(e.display is None for e in shown.elements if e.label != "houseno")
    table = _cli("parse", "深圳市龙华区民治街道B栋3单元", "广东省深圳市龙华区")
    assert table.exit_code == 0 and "B栋" in table.output and "the city's centre" in table.output
    assert " prov " not in table.output and "province" in table.output  # written or inferred: one name


# --------------------------------------------------------------------------- one-line errors, a terminal not driven

@pytest.mark.parametrize("size", ["0", "-1"])
def test_resolve_refuses_a_batch_size_below_one(sample_index, size):
    from mgeo_index.api import AddressIndex

    result = _cli("resolve", "建国路88号", "--index-dir", sample_index, "--batch-size", size, "--json")
    assert result.exit_code == 2 and "--batch-size" in result.output and not result.stdout.strip().startswith("{")
    with AddressIndex.open(sample_index, device="cpu", rerank=False) as idx, pytest.raises(ValueError, match="at least 1"):
        idx.resolve(["建国路88号"], batch_size=int(size))


def test_match_into_a_directory_is_one_line(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\n建国路88号\t建国路88号\n", encoding="utf-8")
    result = _cli("match", "--file", pairs, "--out", tmp_path)
    assert result.exit_code == 1 and "is a directory" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_escape_sequences_in_input_never_reach_the_terminal(sample_index, tmp_path):
    queries = tmp_path / "q.txt"
    queries.write_text("北京\x1b]0;PWNED\x07\x1b[2J朝阳建国路88号\n", encoding="utf-8")
    result = _cli("resolve", "--file", queries, "--index-dir", sample_index, "-k", "1", "--no-rerank")
    assert result.exit_code == 0 and "\x1b" not in result.output and "\x07" not in result.output
    assert "\\x1b]0;PWNED\\x07\\x1b[2J" in result.output
    missing = _cli("build", tmp_path / "no\x1b[2Jsuch.csv", "--index-dir", tmp_path / "idx")
    assert missing.exit_code == 1 and "\x1b" not in missing.output


@pytest.mark.parametrize("module, extra", [("psycopg2", "postgres"), ("redis", "serve"), ("pymilvus", "milvus"),
                                           ("transformers", "train"), ("triton", "gpu")])
def test_a_missing_optional_module_names_the_extra_that_installs_it(module, extra):
    from mgeo_index.cli.errors import explain

    assert explain(ModuleNotFoundError(f"No module named '{module}'", name=module)) == (
        "Error", f"{module} is not installed: pip install 'mgeo-index[{extra}]'")


# --------------------------------------------------------------------------- every row accounted for

def test_an_unclosed_quote_rejects_its_line_and_the_rows_after_it_are_read(sample_index, tmp_path):
    import csv

    catalog = tmp_path / "quote.csv"
    catalog.write_text('id,addr\n1,"北京市朝阳区建国路88号\n2,上海市徐汇区漕溪北路1号\n3,深圳市南山区科苑路15号\n'
                       '4,"杭州市西湖区文三路478号\n', encoding="utf-8")
    built = build(catalog, tmp_path / "idx", id_column="id", device="cpu")
    assert (built.rows_read, built.rows_inserted, built.rows_rejected) == (4, 3, 1)  # the last row's quote: one cell
    rejects = (tmp_path / "idx" / "rejects.tsv").read_text(encoding="utf-8").splitlines()
    assert [r.split("\t")[0] for r in rejects[1:]] == ["2"]
    assert "a quote opened on line 2 does not close" in rejects[1] and rejects[1].endswith('1,"北京市朝阳区建国路88号')
    out = tmp_path / "out.csv"
    ran = _cli("normalize", catalog, "--index-dir", sample_index, "--out", out, "--address-column", "addr")
    assert ran.exit_code == 0, ran.output
    with open(out, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["id"], r["status"] == "rejected") for r in rows] == [("1", True), ("2", False), ("3", False), ("4", False)]
    # a quoted cell that holds a line break closes: one record (an address with a line break is rejected as such)
    fine = tmp_path / "fine.csv"
    fine.write_text('id,addr\n1,"北京市朝阳区\n建国路88号"\n2,上海市徐汇区漕溪北路1号\n', encoding="utf-8")
    assert build(fine, tmp_path / "idx2", id_column="id", device="cpu").rows_read == 2
    assert "control character U+000A" in (tmp_path / "idx2" / "rejects.tsv").read_text(encoding="utf-8")


def test_a_huge_first_row_is_rejected_as_too_long_and_the_rest_is_read(tmp_path):
    from mgeo_index.catalog.reader import MAX_RAW

    catalog = tmp_path / "long.csv"
    with open(catalog, "w", encoding="utf-8") as fh:
        fh.write("id,addr\n1,北京市朝阳区建国路" + "8" * 300_000 + "号\n")
        fh.write("2,北京市朝阳区建国路88号\n3,上海市徐汇区漕溪北路1号\n")
    built = build(catalog, tmp_path / "idx", id_column="id", device="cpu")
    assert (built.rows_read, built.rows_inserted, built.rows_rejected) == (3, 2, 1)
    line, reason, raw = (tmp_path / "idx" / "rejects.tsv").read_text(encoding="utf-8").splitlines()[1].split("\t")
    assert line == "2" and "a field longer than 131,072 characters" in reason
    assert len(raw) < MAX_RAW + 40 and raw.endswith("… (300,012 characters in all)")


@pytest.mark.parametrize("variable, message", [("PROFILE", "MGEO_INDEX_PROFILE must be one of"),
                                               ("NUMBERS", "MGEO_INDEX_NUMBERS must be one of"),
                                               ("DEVICE", "MGEO_INDEX_DEVICE must be cpu"),
                                               ("BACKEND", "MGEO_INDEX_BACKEND must be one of")])
def test_a_wrong_environment_variable_is_named_as_such(sample_index, monkeypatch, variable, message):
    monkeypatch.setenv(f"MGEO_INDEX_{variable}", "bogus")
    result = _cli("resolve", "建国路88号", "--index-dir", sample_index)
    assert result.exit_code == 1 and message in result.output and "--" + variable.lower() not in result.output


def test_a_failed_build_leaves_nothing_and_a_directory_is_called_one(tmp_path):
    for missing, said in ((tmp_path / "nosuch.csv", "does not exist"), (tmp_path, "is a directory")):
        result = _cli("build", missing, "--index-dir", tmp_path / "x-idx")
        assert result.exit_code == 1 and said in result.output
        assert not (tmp_path / "x-idx").exists()
    normalized = _cli("normalize", tmp_path, "--index-dir", tmp_path / "x-idx", "--out", tmp_path / "o.csv")
    assert normalized.exit_code == 1 and "is a directory" in normalized.output and "input file" in normalized.output


def test_a_phone_number_is_no_address(sample_index, tmp_path):
    import csv

    rows = tmp_path / "rows.csv"
    rows.write_text("id,addr\n1,+86 138-0000-0000\n2,+86-755-8888 6666\n3,深圳南山中山路75号东方科技园9号楼\n",
                    encoding="utf-8")
    out = tmp_path / "out.csv"
    assert _cli("normalize", rows, "--index-dir", sample_index, "--out", out).exit_code == 0
    with open(out, encoding="utf-8", newline="") as fh:
        got = [(r["status"], r["reason"]) for r in csv.DictReader(fh)]
    assert [s for s, _ in got] == ["rejected", "rejected", "matched"]
    assert all("only digits" in reason and "phone number" in reason for _, reason in got[:2])


def test_the_jobs_table_reads_whole_at_80_columns():
    from datetime import datetime

    from rich.console import Console

    from mgeo_index.cli.render import jobs_table
    from mgeo_index.jobs import STATUSES

    job = {"id": 12, "state": "running", "rows_total": 250_000, "rows_done": 16_384, "matched": 1_600, "ambiguous": 12,
           "unmatched": 11_000, "rejected": 3, "updated_at": datetime(2026, 12, 7, 5, 36),
           "input_path": "/data/very/long/folder/name/of/the/team/stores-of-the-whole-province.csv",
           "output_path": "/data/very/long/folder/name/of/the/team/stores-of-the-whole-province.matched.csv"}
    console = Console(width=80, record=True)
    console.print(jobs_table([job], "/srv/indexes/shops", STATUSES))
    text = console.export_text()
    assert "…" not in text and all(n in text for n in ("running 7%", "16,384", "1,600", "11,000", "12-07 05:36"))
    assert "stores-of-the-whole-province.matched.csv" in text.replace("\n", "")


# --------------------------------------------------------------------------- files a spreadsheet opens

def test_a_job_writes_the_format_its_output_is_named_for_and_review_reads_it(sample_index, tmp_path):
    from mgeo_index.jobs import normalize_file
    from mgeo_index.query.resolver import open_resolver
    from mgeo_index.review.queue import _job_rows

    suffixes = [".csv", ".tsv", ".jsonl"]
    for suffix, module in ((".parquet", "pyarrow"), (".xlsx", "openpyxl")):
        try:
            __import__(module)
            suffixes.append(suffix)
        except ImportError:  # its extra is not installed: the other formats are still checked
            pass
    rows = tmp_path / "rows.csv"
    rows.write_text("id,addr\n1,深圳南山中山路75号东方科技园9号楼\n2,=cmd()\n3,\n", encoding="utf-8")
    resolver = open_resolver(sample_index, device="cpu")  # one resolver for every output (models loaded once)
    try:
        for suffix in suffixes:
            out = tmp_path / f"out{suffix}"
            result = normalize_file(rows, out, sample_index, resolver=resolver, device="cpu")
            got = list(_job_rows(out, result.output_format, "addr", "utf-8"))
            assert [s for _, _, s, _ in got] == ["matched", "unmatched", "rejected"], suffix
            assert got[0][:2] == ("深圳南山中山路75号东方科技园9号楼", None)  # no name column: no name
    finally:
        resolver.close()
    if ".xlsx" in suffixes:
        from openpyxl import load_workbook

        sheet = load_workbook(tmp_path / "out.xlsx").active
        assert sheet.cell(2, 6).value == "exact_match" and isinstance(sheet.cell(2, 7).value, float)
        assert sheet.cell(3, 2).value == "'=cmd()" and sheet.cell(3, 2).data_type == "s"  # text, not a formula


def test_an_output_keeps_the_inputs_encoding_or_the_one_asked_for_and_unknown_suffixes_are_refused(
        sample_index, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_bytes("\ufeffid,addr\n1,深圳南山中山路75号东方科技园9号楼\n".encode("utf-8"))
    out = tmp_path / "out.csv"
    assert _cli("normalize", rows, "--index-dir", sample_index, "--out", out).exit_code == 0
    assert out.read_bytes().startswith(b"\xef\xbb\xbfid,addr,status") and "东方科技园" in out.read_text("utf-8-sig")
    gb = tmp_path / "gb.csv"
    assert _cli("normalize", rows, "--index-dir", sample_index, "--out", gb, "--encoding", "gb18030").exit_code == 0
    assert "东方科技园" in gb.read_bytes().decode("gb18030") and not gb.read_bytes().startswith(b"\xef\xbb\xbf")
    for args, said in ((("--out", tmp_path / "out.txt"), "no known format for the suffix '.txt'"),
                       (("--out", tmp_path / "o.csv", "--encoding", "latin-1"), "--encoding must be one of"),
                       (("--out", tmp_path / "o.jsonl", "--encoding", "gb18030"), "--encoding is for CSV and TSV")):
        refused = _cli("normalize", rows, "--index-dir", sample_index, *args)
        assert refused.exit_code == 1 and said in refused.output and not Path(args[1]).exists()


def test_coordinates_come_from_the_matched_entry_else_an_admin_centre_with_its_level(tmp_path):
    import csv

    catalog = tmp_path / "geo.csv"
    catalog.write_text("poi_id,address,name,经度,纬度\nG1,深圳市福田区文明路564号,名仕之家,114.0579,22.5431\n"
                       "G2,深圳市福田区文明路564号,21世纪不动产,,\nG3,深圳市南山区科苑路15号,星巴克,200.5,22.54\n"
                       "G4,深圳市南山区科苑路16号,喜茶,abc,22.54\n", encoding="utf-8")
    built = _cli("build", catalog, "--index-dir", tmp_path / "idx", "--id-column", "poi_id", "--name-column", "name")
    assert built.exit_code == 0, built.output
    rejects = (tmp_path / "idx" / "rejects.tsv").read_text(encoding="utf-8")
    assert "longitude '200.5' in column '经度' is not a number from -180 to 180" in rejects and "'abc'" in rejects
    stores = tmp_path / "stores.csv"
    stores.write_text("store,addr,shop\nA,福田区文明路564号,名仕之家\nB,福田区文明路564号,21世纪不动产\n"
                      "C,深圳市南山区粤海街道某某路99号,某店\nD,,x\n", encoding="utf-8")
    out = tmp_path / "out.csv"
    ran = _cli("normalize", stores, "--index-dir", tmp_path / "idx", "--out", out, "--address-column", "addr",
               "--name-column", "shop", "--coordinates")
    assert ran.exit_code == 0, ran.output
    with open(out, encoding="utf-8", newline="") as fh:
        rows = {r["store"]: r for r in csv.DictReader(fh)}
    assert (rows["A"]["lon"], rows["A"]["lat"], rows["A"]["coordinates_precision"]) == ("114.057900", "22.543100", "entry")
    # matched, but its entry has no coordinates: the address's admin centre, its level named
    assert rows["B"]["status"] == "matched" and rows["B"]["coordinates_precision"] == "district"
    assert rows["C"]["status"] != "matched" and rows["C"]["coordinates_precision"] == "district"
    assert float(rows["C"]["lon"]) == pytest.approx(113.93, abs=0.01)  # 南山区's centre
    assert (rows["D"]["status"], rows["D"]["lon"], rows["D"]["coordinates_precision"]) == ("rejected", "", "")


def test_coordinate_columns_named_at_build_are_checked_recorded_and_read(tmp_path):
    import csv

    catalog = tmp_path / "xy.csv"
    catalog.write_text("poi_id,address,X坐标,Y坐标\nG1,深圳市福田区文明路564号名仕之家,114.0579,22.5431\n"
                       "G2,深圳市南山区科苑路15号星巴克,114.1,95.0\n", encoding="utf-8")
    half = _cli("build", catalog, "--index-dir", tmp_path / "idx", "--id-column", "poi_id", "--lon-column", "X坐标")
    assert half.exit_code == 1 and "name both coordinate columns" in half.output
    built = _cli("build", catalog, "--index-dir", tmp_path / "idx", "--id-column", "poi_id", "--lon-column", "x坐标",
                 "--lat-column", "Y坐标")
    assert built.exit_code == 0, built.output
    assert "latitude '95.0' in column 'Y坐标' is not a number from -90 to 90" in (tmp_path / "idx" / "rejects.tsv").read_text(encoding="utf-8")
    again = _cli("build", catalog, "--index-dir", tmp_path / "idx", "--id-column", "poi_id")  # kept: still checked
    assert again.exit_code == 0 and "'95.0'" in (tmp_path / "idx" / "rejects.tsv").read_text(encoding="utf-8")
    stores = tmp_path / "stores.csv"
    stores.write_text("store,addr\nA,福田区文明路564号名仕之家\n", encoding="utf-8")
    out = tmp_path / "out.csv"
    ran = _cli("normalize", stores, "--index-dir", tmp_path / "idx", "--out", out, "--coordinates")
    assert ran.exit_code == 0, ran.output
    with open(out, encoding="utf-8", newline="") as fh:
        row = next(csv.DictReader(fh))
    assert (row["status"], row["lon"], row["lat"], row["coordinates_precision"]) == ("matched", "114.057900", "22.543100", "entry")


def test_wide_reports_print_whole_at_80_columns(monkeypatch):
    from rich.console import Console

    from mgeo_index.cli import render

    console = Console(width=80, record=True)
    monkeypatch.setattr(render, "console", console)
    speed = {"batched_per_s": 1234.5, "naive_per_s": 456.0, "ratio": 2.7, "linear_share": 0.81, "ceiling_ratio": 3.4}
    backend = {"backend": "int8", "encode_per_s": 2345.0, "encode_vs_torch": 1.9, "pairs_per_s": 800.0,
               "pairs_vs_torch": 1.75, "embedding_cosine_min": 0.99912, "macro_f1": 0.734, "macro_f1_delta": -0.0016,
               "setup_s": 3.4}
    built = {"rows": 1_000_000, "seconds": 857.2, "rows_per_s": 1166.0, "rows_per_cpu_s": 600.0, "peak_rss_mib": 2764.0,
             "structure": "IVF4096,SQ8", "nprobe": 32, "recall_at_10_vs_flat": 0.985, "vectors_mib": 260.0,
             "ngrams_mib": 310.0, "store_mib": 900.0,
             "resolve": {"p50_ms": 45.1, "p99_ms": 68.2, "resolver_rss_mib": 1500.0, "resolver_anon_mib": 700.0}}
    render.print_bench({"torch_threads": 2, "backend": "torch", "encode": speed, "score_pairs": speed,
                        "backends": [backend], "build": [built]})
    text = console.export_text()
    assert "…" not in text and all(v in text for v in ("1,234", "0.99912", "-0.0016", "1,000,000", "45.1 / 68.2"))
