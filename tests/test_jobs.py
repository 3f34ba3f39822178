"""Normalize jobs: every row exactly once (also after a real kill -9), rejects, ambiguity, Parquet,
refusals to resume over another index/model, the jobs table's migration, and Ray vs local.

Assertions do not depend on the bundled model being good, except that a real variant of a sample
address finds its catalog entry among the alternatives.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from mgeo_index import settings, store
from mgeo_index.jobs import ADMIN_COLUMNS, JobError, Policy, decide, normalize_file
from mgeo_index.runtime.plan import plan
from conftest import copy_index

CHUNK, BATCH, TOP_K = 25, 10, 2
VARIANT = "深圳南山中山路７５号东方科技园９号楼"  # P0001 without province/city, full-width digits


@pytest.fixture(scope="module")
def index_dir(sample_index, tmp_path_factory) -> Path:
    """This module's copy of the session's sample index (jobs are recorded in its store)."""
    return copy_index(sample_index, tmp_path_factory.mktemp("jobs") / "idx")


def _catalog_rows() -> list[dict]:
    return list(csv.DictReader(settings.SAMPLE_CATALOG.open(encoding="utf-8")))


def _write_input(path: Path, n: int) -> list[tuple[str, str]]:
    """n rows of (store_id, address): variants of catalog addresses, a duplicate and bad rows."""
    catalog = _catalog_rows()
    rows: list[tuple[str, str]] = [("S-variant", VARIANT)]
    for i in range(n - 5):
        address = catalog[i % len(catalog)]["address"]
        rows.append((f"S{i}", address[3:] if i % 2 else address))
    rows[3:3] = [("S-empty", ""), ("S-punct", "！！！"), ("S-dup", rows[1][1]), ("S-long", "路" * 300)]
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["store_id", "address", "note"])
        for sid, address in rows:
            writer.writerow([sid, address, f"note {sid}"])
    return rows


def _read_csv(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def job_input(tmp_path_factory) -> tuple[Path, list[tuple[str, str]]]:
    path = tmp_path_factory.mktemp("input") / "stores.csv"
    return path, _write_input(path, 120)


@pytest.fixture(scope="module")
def reference(index_dir, job_input, tmp_path_factory) -> tuple[Path, object]:
    """An uninterrupted run: the output every other run of the same job must reproduce."""
    out = tmp_path_factory.mktemp("ref") / "stores.out.csv"
    result = normalize_file(job_input[0], out, index_dir, device="cpu", chunk_size=CHUNK, batch_size=BATCH, top_k=TOP_K)
    return out, result


# --------------------------------------------------------------------------- decisions


def _m(id_, exact, partial, label=None, prob=None):
    probs = {"exact_match": exact, "partial_match": partial, "not_match": 1 - exact - partial}
    label = label or max(probs, key=probs.get)
    return {"id": id_, "source_id": f"P{id_}", "address": f"addr {id_}", "score": 0.9, "label": label,
            "probability": prob if prob is not None else probs[label], "probabilities": probs}


def test_decide_matched_ambiguous_unmatched_and_the_status_never_contradicts_the_label():
    policy = Policy(min_probability=0.5, margin=0.1, top_k=3)
    matched = decide([_m(1, 0.9, 0.05), _m(2, 0.2, 0.1)], policy)
    assert (matched["status"], matched["match_id"], matched["match_address"]) == ("matched", "P1", "addr 1")
    assert [a["id"] for a in json.loads(matched["alternatives"])] == ["P1", "P2"]
    # runner-up's P(exact) + ½P(partial) = 0.75 + 0.05 within 0.1 of 0.8 + 0.05
    ambiguous = decide([_m(1, 0.8, 0.1), _m(2, 0.75, 0.1)], policy)
    assert ambiguous["status"] == "ambiguous" and ambiguous["match_id"] == "P1"
    assert decide([_m(1, 0.8, 0.1), _m(2, 0.75, 0.1)], Policy(margin=0.0))["status"] == "matched"
    assert decide([_m(1, 0.05, 0.05)], policy)["status"] == "unmatched"  # best label not_match
    low = decide([_m(1, 0.45, 0.2)], policy)  # exact_match at 0.45 < min_probability: a match, but unsure
    assert (low["status"], low["match_id"], low["label"]) == ("ambiguous", "P1", "exact_match")
    assert decide([], policy)["status"] == "unmatched"
    assert len(json.loads(decide([_m(i, 0.9, 0.0) for i in range(5)], policy)["alternatives"])) == 3


# --------------------------------------------------------------------------- local engine


def test_every_row_once_in_order_with_rejects(index_dir, job_input, reference):
    _, rows = job_input
    out, result = reference
    got = _read_csv(out)
    assert [r["store_id"] for r in got] == [sid for sid, _ in rows]
    assert list(got[0]) == ["store_id", "address", "note", "status", "match_id", "match_address", "label",
                            "probability", "alternatives", "reason", "admin_province", "admin_province_code",
                            "admin_city", "admin_city_code", "admin_district", "admin_district_code"]
    by_id = {r["store_id"]: r for r in got}
    assert "empty address" in by_id["S-empty"]["reason"]
    assert "no letters or digits" in by_id["S-punct"]["reason"]
    assert "longer than the model's limit" in by_id["S-long"]["reason"]
    assert {by_id[s]["status"] for s in ("S-empty", "S-punct", "S-long")} == {"rejected"}
    assert by_id["S-dup"]["status"] != "rejected"  # repeated addresses are legitimate input rows
    assert by_id["S-dup"]["alternatives"] == by_id[rows[1][0]]["alternatives"]
    for r in got:
        assert r["status"] in ("matched", "ambiguous", "unmatched", "rejected")
        if r["status"] != "rejected":
            assert r["reason"] == "" and len(json.loads(r["alternatives"])) == TOP_K
            assert 0 <= float(r["probability"]) <= 1
        if r["status"] in ("matched", "ambiguous"):
            assert r["match_id"] == json.loads(r["alternatives"])[0]["id"]
    assert "P0001" in [a["id"] for a in json.loads(by_id["S-variant"]["alternatives"])]
    # standardized admin levels of the input address; 深圳南山… names neither 广东省 nor 深圳市 in full
    variant = by_id["S-variant"]
    assert (variant["admin_province"], variant["admin_province_code"]) == ("广东省", "440000")
    assert (variant["admin_city_code"], variant["admin_district"], variant["admin_district_code"]) == ("440300", "南山区", "440305")
    assert by_id["S-empty"]["admin_province"] == ""
    full = [r for r in got if r["address"].startswith("广东省深圳市")]
    assert full and all(r["admin_city_code"] == "440300" for r in full)

    assert result.rows == len(rows) and result.counts["rejected"] == 3
    assert sum(result.counts.values()) == len(rows)
    job = store.get_job(store.connect(settings.database_url(index_dir)), result.job_id)
    assert job["status"] == "complete" and job["rows_done"] == len(rows)
    assert job["parts_done"] == -(-len(rows) // CHUNK)
    assert job["input_fingerprint"].startswith("sha256:") and job["build_id"] and job["cross_model_fingerprint"]
    assert job["params"]["backend"] == plan().backend  # the inference backend the job ran with
    assert not list(out.parent.glob(".*parts"))  # parts removed once complete


def _job_in_store(index_dir: Path, out: Path) -> dict | None:
    engine = create_engine(settings.database_url(index_dir))
    try:
        return store.latest_job(engine, str(out.resolve()))
    except Exception:  # noqa: BLE001 - table not created yet
        return None
    finally:
        engine.dispose()


@pytest.mark.slow
def test_kill_9_mid_job_then_resume_gives_every_row_exactly_once(index_dir, job_input, reference, tmp_path):
    path, rows = job_input
    out = tmp_path / "killed.csv"
    cmd = [sys.executable, "-m", "mgeo_index.cli", "normalize", str(path), "--index-dir", str(index_dir),
           "--out", str(out), "--chunk-size", str(CHUNK), "--batch-size", str(BATCH), "--top-k", str(TOP_K),
           "--device", "cpu"]
    # killed by itself once its second part is recorded (a crash point: the same place every run, however fast)
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300,
                          env={**os.environ, "MGEO_INDEX_CRASH_AT": "job-part:2"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    job = _job_in_store(index_dir, out)
    assert 0 < job["rows_done"] < len(rows), "killed too late to test resuming"
    assert not out.exists()

    from mgeo_index.jobs import list_jobs

    assert {j["id"]: j["state"] for j in list_jobs(index_dir)}[job["id"]] == "stale"
    resumed = normalize_file(path, out, index_dir, device="cpu", chunk_size=CHUNK, batch_size=BATCH, top_k=TOP_K)
    assert resumed.job_id == job["id"] and resumed.resumed_from >= job["rows_done"]
    assert out.read_bytes() == reference[0].read_bytes()
    assert [r["store_id"] for r in _read_csv(out)] == [sid for sid, _ in rows]
    assert store.get_job(store.connect(settings.database_url(index_dir)), job["id"])["runs"] == 2


def _interrupt_after_first_chunk():
    calls = []

    def on_progress(n, total):
        calls.append(n)
        raise KeyboardInterrupt

    return on_progress


def test_resume_refused_over_another_model_or_parameters(index_dir, job_input, tiny_model_dirs, tmp_path):
    path, _ = job_input
    out = tmp_path / "out.csv"
    args = dict(device="cpu", chunk_size=CHUNK, batch_size=BATCH, top_k=1)
    with pytest.raises(KeyboardInterrupt):
        normalize_file(path, out, index_dir, on_progress=_interrupt_after_first_chunk(), **args)
    job = _job_in_store(index_dir, out)
    assert (job["status"], job["rows_done"]) == ("interrupted", CHUNK)

    with pytest.raises(JobError) as refused:
        normalize_file(path, out, index_dir, cross_model=tiny_model_dirs[1], **args)
    message = str(refused.value)
    assert job["cross_model_fingerprint"] in message and "--restart" in message
    from mgeo_index.model.manifest import fingerprint

    assert fingerprint(tiny_model_dirs[1]) in message
    with pytest.raises(JobError, match=r"min_probability 0\.5 → 0\.9"):
        normalize_file(path, out, index_dir, min_probability=0.9, **args)
    other = "int8" if settings.DEFAULT_CPU_BACKEND == "torch" else "torch"
    with pytest.raises(JobError, match=f"backend '{settings.DEFAULT_CPU_BACKEND}' → '{other}'") as refused:  # no mixed outputs
        normalize_file(path, out, index_dir, backend=other, **args)
    assert f"give its backend: --backend {settings.DEFAULT_CPU_BACKEND}" in str(refused.value)  # e.g. another machine's default

    changed = tmp_path / "changed.csv"
    changed.write_text("address\n北京市海淀区东风路127号\n", encoding="utf-8")
    with pytest.raises(JobError, match="input file changed"):
        normalize_file(changed, out, index_dir, **args)

    # the index changed under the job: building again makes a new build id and index file
    from mgeo_index.catalog.build import build

    rebuilt = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device="cpu")
    with pytest.raises(JobError) as refused:
        normalize_file(path, out, index_dir, **args)
    message = str(refused.value)
    assert f"index build {job['build_id']} ({job['index_file']})" in message
    assert f"index build {rebuilt.build_id} (index-{rebuilt.build_id}.faiss)" in message
    assert _job_in_store(index_dir, out)["status"] == "interrupted"  # refusals leave the job as it was


def test_restart_discards_the_unfinished_job(index_dir, tmp_path):
    path = tmp_path / "in.csv"
    _write_input(path, 12)
    out = tmp_path / "out.csv"
    args = dict(device="cpu", chunk_size=4, batch_size=4, top_k=1)
    with pytest.raises(KeyboardInterrupt):
        normalize_file(path, out, index_dir, on_progress=_interrupt_after_first_chunk(), **args)
    first = _job_in_store(index_dir, out)
    with pytest.raises(JobError):
        normalize_file(path, out, index_dir, **{**args, "top_k": 2})
    result = normalize_file(path, out, index_dir, restart=True, **{**args, "top_k": 2})
    assert result.job_id != first["id"] and result.resumed_from == 0
    assert store.get_job(store.connect(settings.database_url(index_dir)), first["id"])["status"] == "abandoned"
    assert len(_read_csv(out)) == 12


def test_ambiguous_margin(index_dir, tmp_path):
    path = tmp_path / "in.csv"
    rows = _write_input(path, 14)
    out = tmp_path / "out.tsv"
    normalize_file(path, out, index_dir, device="cpu", top_k=2, min_probability=0.0, margin=1.0)
    got = list(csv.DictReader(out.open(encoding="utf-8"), delimiter="\t"))
    assert len(got) == len(rows)
    for r in got:
        if r["status"] != "rejected":  # every runner-up is within a margin of 1
            assert r["status"] == "ambiguous" and r["match_id"] == json.loads(r["alternatives"])[0]["id"]


def test_the_backend_is_a_job_parameter_not_process_state(index_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mgeo_index.query import resolver as resolver_mod
    from mgeo_index.cli import app

    monkeypatch.delenv("MGEO_INDEX_BACKEND", raising=False)
    opened = []
    real_open = resolver_mod.open_resolver

    def spy(*args, **kwargs):
        opened.append(kwargs.get("backend"))
        return real_open(*args, **kwargs)

    monkeypatch.setattr(resolver_mod, "open_resolver", spy)
    path = tmp_path / "in.csv"
    _write_input(path, 14)
    out = tmp_path / "torch.csv"
    result = CliRunner().invoke(app, ["normalize", str(path), "--out", str(out), "--index-dir", str(index_dir),
                                      "--device", "cpu", "--top-k", "2", "--backend", "torch"])
    assert result.exit_code == 0, result.output
    assert opened == ["torch"]  # the resolver the job ran was opened with it
    assert "MGEO_INDEX_BACKEND" not in os.environ  # nothing left behind for the rest of the process
    job = store.latest_job(store.connect(settings.database_url(index_dir)), str(out.resolve()))
    assert job["params"]["backend"] == "torch"
    normalize_file(path, tmp_path / "default.csv", index_dir, device="cpu", top_k=2)
    assert opened[-1] == settings.DEFAULT_CPU_BACKEND  # named by the driver, not left to each resolver's environment
    with pytest.raises(ValueError, match="backend must be one of"):
        normalize_file(path, tmp_path / "x.csv", index_dir, device="cpu", backend="tensorrt")
    with pytest.raises(ValueError, match="GPU actors"):
        normalize_file(path, tmp_path / "x.csv", index_dir, runner="ray", gpus_per_worker=1, backend="int8")


def test_parquet_in_and_out_keeps_types(index_dir, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    catalog = _catalog_rows()[:10]
    table = pa.table({
        "shop": pa.array(list(range(10)), type=pa.int64()),
        "地址": [r["address"][3:] for r in catalog[:9]] + [None],
    })
    src = tmp_path / "in.parquet"
    pq.write_table(table, src, row_group_size=4)
    out = tmp_path / "out.parquet"
    result = normalize_file(src, out, index_dir, device="cpu", top_k=1, chunk_size=3)
    got = pq.read_table(out)
    assert got.column_names == ["shop", "地址", "status", "match_id", "match_address", "label", "probability",
                                "alternatives", "reason", *ADMIN_COLUMNS]
    assert got.schema.field("shop").type == pa.int64() and got.schema.field("probability").type == pa.float64()
    assert got.column("shop").to_pylist() == list(range(10))
    status = got.column("status").to_pylist()
    assert status[-1] == "rejected" and "empty address" in got.column("reason").to_pylist()[-1]
    assert "rejected" not in status[:-1] and result.rows == 10

    # CSV in, Parquet out (by --format): the same rows as the CSV output
    csv_src = tmp_path / "in.csv"
    _write_input(csv_src, 8)
    as_csv, as_parquet = tmp_path / "o.csv", tmp_path / "o.data"
    normalize_file(csv_src, as_csv, index_dir, device="cpu", top_k=1)
    normalize_file(csv_src, as_parquet, index_dir, device="cpu", top_k=1, output_format="parquet")
    parquet_rows = pq.read_table(as_parquet).to_pylist()
    csv_rows = _read_csv(as_csv)
    assert [r["store_id"] for r in parquet_rows] == [r["store_id"] for r in csv_rows]
    assert [r["alternatives"] for r in parquet_rows] == [r["alternatives"] for r in csv_rows]


def test_output_columns_get_a_prefix_when_the_input_has_them(index_dir, tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("address,status\n北京市海淀区东风路127号,open\n", encoding="utf-8")
    out = tmp_path / "out.csv"
    normalize_file(path, out, index_dir, device="cpu", top_k=1)
    row = _read_csv(out)[0]
    assert row["status"] == "open" and row["mgeo_status"] in ("matched", "ambiguous", "unmatched")


def test_jobs_cli_lists_jobs(index_dir, reference):
    from typer.testing import CliRunner

    from mgeo_index.cli import app

    result = CliRunner().invoke(app, ["jobs", "--index-dir", str(index_dir), "--json"])
    assert result.exit_code == 0, result.output
    jobs = [json.loads(line) for line in result.stdout.splitlines()]
    ref = next(j for j in jobs if j["id"] == reference[1].job_id)
    assert ref["state"] == "complete" and ref["rows_done"] == reference[1].rows
    table = CliRunner().invoke(app, ["jobs", "--index-dir", str(index_dir)])
    assert table.exit_code == 0 and "complete" in table.stdout


# --------------------------------------------------------------------------- Ray engine


@pytest.mark.slow
def test_ray_engine_identical_to_local_engine(index_dir, tmp_path):
    pytest.importorskip("ray.data", reason="ray[data] is not installed")
    import ray

    path = tmp_path / "in.csv"
    rows = _write_input(path, 2000)
    local, remote = tmp_path / "local.csv", tmp_path / "ray.csv"
    args = dict(device="cpu", chunk_size=250, batch_size=125, top_k=1, backend="torch")
    normalize_file(path, local, index_dir, **args)
    try:
        result = normalize_file(path, remote, index_dir, runner="ray", workers=2, **args)
    finally:
        ray.shutdown()
    assert result.runner == "ray" and result.rows == len(rows)
    # the same rows, decisions and matches; probabilities agree within 1e-6 (FP32 is batch-independent to
    # ~1e-7, and the two engines batch repeated addresses differently: the printed 6th digit may differ)
    with local.open(encoding="utf-8") as a, remote.open(encoding="utf-8") as b:
        pairs = list(zip(csv.DictReader(a), csv.DictReader(b), strict=True))
    assert len(pairs) == len(rows)
    for mine, theirs in pairs:
        assert {k: v for k, v in mine.items() if k not in ("probability", "alternatives")} == \
            {k: v for k, v in theirs.items() if k not in ("probability", "alternatives")}
        if mine["probability"]:
            assert abs(float(mine["probability"]) - float(theirs["probability"])) <= 2e-6
        alternatives = [json.loads(row["alternatives"] or "[]") for row in (mine, theirs)]
        assert [(x["id"], x["label"]) for x in alternatives[0]] == [(x["id"], x["label"]) for x in alternatives[1]]
        assert all(abs(x["probability"] - y["probability"]) <= 2e-6 for x, y in zip(*alternatives))


def test_a_job_is_recorded_only_once_its_engine_is_available(index_dir, tmp_path, monkeypatch):
    """--engine ray (the older name of --runner) where Ray is not installed: the one-line install hint, and no job in the store."""
    from typer.testing import CliRunner

    from mgeo_index.cli import app

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if Ray were not installed
    path = tmp_path / "in.csv"
    _write_input(path, 8)
    out = tmp_path / "out.csv"
    with pytest.raises(ImportError, match=r"pip install 'mgeo-index\[ray\]'"):
        normalize_file(path, out, index_dir, device="cpu", runner="ray")
    assert _job_in_store(index_dir, out) is None
    result = CliRunner().invoke(app, ["normalize", str(path), "--out", str(out), "--index-dir", str(index_dir),
                                      "--engine", "ray"])
    assert result.exit_code == 1
    assert "Error: the Ray runner (--runner ray) needs Ray Data: pip install 'mgeo-index" in " ".join(result.output.split())
    assert _job_in_store(index_dir, out) is None


# --------------------------------------------------------------------------- migration 0002


def _migrate_0001_to_head(url: str) -> None:
    store.upgrade(url, "0001")
    engine = create_engine(url)
    try:
        assert "jobs" not in inspect(engine).get_table_names()
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO catalogs (name, created_at) VALUES ('kept', CURRENT_TIMESTAMP)"))
        store.upgrade(url, "0002")  # the jobs tables come with 0002; a job recorded then survives the later revisions
        assert store.current_revision(url) == "0002"
        assert {"jobs", "job_checkpoints"} <= set(inspect(engine).get_table_names())
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO jobs (kind, status, input_path, input_fingerprint, input_format, output_path, output_format, "
                "engine, started_at, updated_at) VALUES ('normalize', 'complete', 'old.csv', 'sha256:o', 'csv', "
                "'/old.csv', 'csv', 'local', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
        store.upgrade(url)
        assert store.latest_job(engine, "/old.csv")["runner"] == "local"
        job_id = store.create_job(engine, status="running", input_path="a.csv", input_fingerprint="sha256:x",
                                  input_format="csv", output_path="/o.csv", output_format="csv", runner="local")
        store.add_checkpoint(engine, job_id, seq=1, rows_end=10, rows=10, part_file="part-000001.csv",
                             part_bytes=123, counts={"matched": 7, "rejected": 3})
        job = store.get_job(engine, job_id)
        assert (job["rows_done"], job["parts_done"], job["matched"], job["rejected"]) == (10, 1, 7, 3)
        with pytest.raises(LookupError):  # a checkpoint out of sequence is refused
            store.add_checkpoint(engine, job_id, seq=3, rows_end=20, rows=10, part_file="p3", part_bytes=1, counts={})
        store.downgrade(url, "0001")
        assert "jobs" not in inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name FROM catalogs")).scalar_one() == "kept"
    finally:
        engine.dispose()


def test_jobs_migration_sqlite(tmp_path):
    _migrate_0001_to_head(f"sqlite:///{tmp_path / 'm.db'}")


def test_jobs_migration_postgresql(pg_url):
    _migrate_0001_to_head(pg_url)


def test_repeated_addresses_are_resolved_once_per_job_with_the_same_answers():
    from mgeo_index.jobs.policy import Policy, resolve_outcomes

    class Counting:
        def __init__(self):
            self.seen: list[str] = []
            self.parsed: list[str] = []
            self.names: list[str] = []

        def resolve(self, batch, top_k, rerank, parses, numbers=None, names=None, explain=False):
            self.seen += batch
            self.names += names
            self.parsed += [p["text"] for p in parses]  # the job's one parse of each address, handed over
            return [[{"id": len(q), "source_id": q, "address": q, "score": 0.9, "label": "exact_match",
                      "probability": 0.9, "probabilities": {"exact_match": 0.9, "partial_match": 0.05,
                                                            "not_match": 0.05}}] for q in batch]

    resolver, memo = Counting(), {}
    first = resolve_outcomes(resolver, ["北京朝阳建国路88号", "北京朝阳建国路８８号", "上海徐汇1号"], Policy(), 2, memo)
    assert resolver.seen == ["北京朝阳建国路88号", "上海徐汇1号"]  # full-width digits normalize to the same key
    assert first[0] == first[1] and first[0] is not first[1]  # one answer, separate rows
    assert resolver.parsed == resolver.seen
    assert (first[0]["admin_province"], first[0]["admin_district"]) == ("北京市", "朝阳区")  # from that same parse
    later = resolve_outcomes(resolver, ["上海徐汇1号", "深圳南山2号"], Policy(), 2, memo)
    assert resolver.seen[2:] == ["深圳南山2号"] and later[0] == first[2]
    # a name makes another query: the address with the name after it, the name handed over as a field
    named = resolve_outcomes(resolver, ["上海徐汇1号", "上海徐汇1号", "上海徐汇1号"], Policy(), 2, memo,
                             names=["星巴克", "", "星巴克"])
    assert resolver.seen[3:] == ["上海徐汇1号星巴克"] and resolver.names[3:] == ["星巴克"]
    assert named[0] == named[2] and named[1] == first[2]


def _chunk(addresses: list[str | None]):
    from mgeo_index.jobs.inputs import Chunk, Record

    return Chunk([Record(i, {}, a or "", None if a else "empty address") for i, a in enumerate(addresses)])


class _SpreadRunner:
    """A runner of several workers that computes in this process: items must be micro-batches."""

    name, device, workers, gpus_per_worker = "spread", "cpu", 3, 0.0

    def __init__(self):
        self.items: list[list[str]] = []

    def map(self, items, task):
        compute = task.local()
        for item in items:
            self.items.append(item)
            yield item, compute(item)


def test_chunks_come_back_whole_and_in_order_however_finely_they_are_cut():
    """With several workers a chunk is cut into micro-batches (chunks without valid rows among them) and put back
    together; one worker gets whole chunks. Both give every chunk its rows' outcomes, in order."""
    from mgeo_index.compute.local import LocalRunner
    from mgeo_index.compute.task import Task
    from mgeo_index.jobs.resolving import resolve_chunks

    task = Task(local=lambda: lambda queries: [{"address": a} for a in queries[0]], actor=object,
                pack=dict, unpack=lambda item, row: row)
    chunks = [_chunk(["甲", "乙", "丙", "丁", "戊"]), _chunk([None, None]), _chunk(["己"]), _chunk([None]),
              _chunk(["庚", None, "辛"])]
    spread = _SpreadRunner()
    for runner in (spread, LocalRunner("cpu")):
        got = list(resolve_chunks(runner, iter(chunks), task, batch_size=2))
        assert [c for c, _ in got] == chunks
        assert [[o["address"] for o in outcomes] for _, outcomes in got] == [c.valid_queries()[0] for c in chunks]
    # three workers: a chunk of five is cut in ones (two items a worker at least), within the batch size of two
    assert [a for a, _ in spread.items] == [["甲"], ["乙"], ["丙"], ["丁"], ["戊"], ["己"], ["庚"], ["辛"]]
    assert all(names == [""] for _, names in spread.items)
    spread.workers, spread.items = 1 + 1, []
    list(resolve_chunks(spread, iter([_chunk(list("甲乙丙丁戊己庚辛壬癸"))]), task, batch_size=2))
    assert [len(addresses) for addresses, _ in spread.items] == [2, 2, 2, 2, 2]


def test_the_oldest_answers_are_forgotten_past_the_limit_but_not_those_still_needed(monkeypatch):
    from mgeo_index.jobs import policy

    monkeypatch.setattr(policy, "MEMO_LIMIT", 3)
    memo = {key: {"answer": key} for key in "abcde"}
    policy.forget_oldest(memo, keep={"a"})
    assert list(memo) == ["a", "d", "e"]
    policy.forget_oldest(memo)
    assert list(memo) == ["a", "d", "e"]  # within the limit: nothing goes


def test_several_workers_resolve_each_distinct_address_once_across_chunks():
    """Repeats go to no worker twice: the first chunk's distinct addresses are computed, a later chunk's rows get
    the answers already in hand (a chunk of repeats alone is handed to no worker), and every row its address's
    answer, the same one a single worker gives."""
    from mgeo_index.compute.local import LocalRunner
    from mgeo_index.compute.task import Task
    from mgeo_index.jobs.resolving import resolve_chunks

    computed: list[str] = []

    def compute(queries):
        addresses, _ = queries
        computed.extend(addresses)
        return [{"address": a, "answer": f"answer {a.strip()}"} for a in addresses]

    task = Task(local=lambda: compute, actor=object, pack=dict, unpack=lambda item, row: row)
    chunks = [_chunk(["甲", "乙", "甲 ", None, "丙"]), _chunk(["乙", "丁"]), _chunk(["甲", "丙"]), _chunk(["戊", "丁"])]
    spread = _SpreadRunner()
    got = list(resolve_chunks(spread, iter(chunks), task, batch_size=8))
    assert sorted(computed) == ["丁", "丙", "乙", "戊", "甲"]  # 甲 and "甲 " read the same: one of them computed
    assert [[o["answer"] for o in outcomes] for _, outcomes in got] == [
        ["answer 甲", "answer 乙", "answer 甲", "answer 丙"], ["answer 乙", "answer 丁"], ["answer 甲", "answer 丙"],
        ["answer 戊", "answer 丁"]]
    assert [c for c, _ in got] == chunks
    computed.clear()
    one = list(resolve_chunks(LocalRunner("cpu"), iter(chunks), task, batch_size=8))
    assert [[o["answer"] for o in outcomes] for _, outcomes in one] == [[o["answer"] for o in outcomes] for _, outcomes in got]


@pytest.mark.slow
def test_worker_processes_write_the_rows_of_one_process(index_dir, job_input, reference, tmp_path):
    """``--workers 2`` on the local runner: two worker processes, each with its own resolver, write the very
    bytes of the job computed in this process (the default backend is batch-independent)."""
    out = tmp_path / "workers.csv"
    result = normalize_file(job_input[0], out, index_dir, device="cpu", chunk_size=CHUNK, batch_size=BATCH,
                            top_k=TOP_K, workers=2)
    assert result.rows == reference[1].rows
    assert out.read_bytes() == reference[0].read_bytes()
    # interrupted with two workers, resumed in this process: the job is the same job, the output the same bytes
    again = tmp_path / "interrupted.csv"
    with pytest.raises(KeyboardInterrupt):
        normalize_file(job_input[0], again, index_dir, device="cpu", chunk_size=CHUNK, batch_size=BATCH,
                       top_k=TOP_K, workers=2, on_progress=_interrupt_after_first_chunk())
    assert _job_in_store(index_dir, again)["rows_done"] == CHUNK
    resumed = normalize_file(job_input[0], again, index_dir, device="cpu", chunk_size=CHUNK, batch_size=BATCH,
                             top_k=TOP_K)
    assert resumed.resumed_from == CHUNK and again.read_bytes() == reference[0].read_bytes()


def test_worker_processes_give_results_in_order_and_raise_a_workers_error(tmp_path):
    """The process pool: results in input order whatever finishes first, an actor's exception raised here as
    it was raised there, and a worker that dies named as such."""
    from mgeo_index.compute.processes import in_processes
    from mgeo_index.compute.task import Task

    task = Task(local=lambda: None, actor=_SlowEcho, pack=lambda item: {"item": item},
                unpack=lambda item, row: row["item"], kwargs={"fail_on": 7})
    got = []
    with pytest.raises(ValueError, match="no 7 here"):
        for item, result in in_processes(task, range(10), workers=2):
            got.append((item, result))
    assert got == [(i, i * 10) for i in range(7)]
    dying = Task(local=lambda: None, actor=_SlowEcho, pack=lambda item: {"item": item},
                 unpack=lambda item, row: row["item"], kwargs={"fail_on": -1, "die_on": 1})
    with pytest.raises(RuntimeError, match="worker process died"):
        list(in_processes(dying, range(3), workers=2))


class _SlowEcho:
    """A worker's actor: ten times its item, the early items slowest (so later ones finish first)."""

    def __init__(self, fail_on: int, die_on: int = -1) -> None:
        self.fail_on, self.die_on = fail_on, die_on

    def __call__(self, batch: dict) -> dict:
        import os
        import time

        item = int(batch["item"][0])
        if item == self.die_on:
            os._exit(3)
        if item == self.fail_on:
            raise ValueError(f"no {item} here")
        time.sleep(0.05 * max(0, 3 - item))
        return {"seq": batch["seq"], "item": [item * 10]}


def test_local_workers_are_checked():
    from mgeo_index.compute.runners import make_runner

    runner = make_runner("local", device="cpu", workers=2, threads=1)
    assert (runner.workers, runner.threads) == (2, 1) and runner.describe()["workers"] == 2
    assert make_runner("local", device="cpu").workers == 1
    with pytest.raises(ValueError, match="at least 1"):
        make_runner("local", device="cpu", workers=0)


def test_the_ray_actor_resolves_as_this_process_does_with_the_jobs_policy(index_dir):
    """The resolving task's actor, built here from its kwargs as Ray would build it, gives the same outcomes as
    the local function, and decides by the job's whole policy (the number policy included)."""
    from mgeo_index.jobs.job import Resolving
    from mgeo_index.jobs.resolving import resolve_task

    resolving = Resolving(index_dir=index_dir, device="cpu", db=settings.database_url(index_dir), model=str(settings.DEFAULT_BI_MODEL),
                          cross_model=str(settings.DEFAULT_CROSS_MODEL), backend="torch",
                          policy=Policy(top_k=TOP_K, numbers="loose"), batch_size=BATCH)
    task = resolve_task(resolving, chunk_size=CHUNK)
    assert task.kwargs["policy"]["numbers"] == "loose"
    addresses = ([VARIANT, _catalog_rows()[1]["address"], VARIANT], ["", "", ""])
    row = task.actor(**task.kwargs)({"seq": [0], **{k: [v] for k, v in task.pack(addresses).items()}})
    assert task.unpack(addresses, {k: v[0] for k, v in row.items()}) == task.local()(addresses)
    # several workers: the driver keeps the answers (resolve_chunks), so an actor keeps none of its own
    spread = resolve_task(resolving, chunk_size=CHUNK, workers=2)
    actor = spread.actor(**spread.kwargs)
    row = actor({"seq": [0], **{k: [v] for k, v in spread.pack(addresses).items()}})
    assert actor.memo is None and task.kwargs["remember"] and not spread.kwargs["remember"]
    assert spread.unpack(addresses, {k: v[0] for k, v in row.items()}) == task.local()(addresses)
