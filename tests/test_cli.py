"""The command line, invoked in-process, on the bundled sample catalog."""
import csv
import json
import re

import pytest
from typer.testing import CliRunner

from mgeo_index import settings, store
from mgeo_index.cli import app
from mgeo_index.runtime.plan import plan, torch_plan
from conftest import copy_index

runner = CliRunner()


def run(*args, input=None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    return result


@pytest.fixture(scope="module")
def index_dir(sample_index, tmp_path_factory):
    """This module's copy of the session's sample index, rebuilt through the CLI (nothing new to embed)."""
    path = copy_index(sample_index, tmp_path_factory.mktemp("cli") / "idx")
    result = run("build", settings.SAMPLE_CATALOG, "--index-dir", path, "--id-column", "poi_id")
    assert result.exit_code == 0, result.output
    assert re.search(r"entries in store\s*│\s*300", result.output)
    assert re.search(r"vectors in index\s*│\s*300", result.output)
    assert re.search(r"profile\s*│\s*\w+ \(", result.output) and re.search(r"numbers\s*│\s*\w+ \(", result.output)
    return path


def test_resolve_json_lines_in_input_order(index_dir):
    queries = ["深圳南山中山路７５号东方科技园９号楼", "北京海淀燕园街道东风路127号东方大厦"]
    result = run("resolve", *queries, "--index-dir", index_dir, "--json", "--top-k", "3")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [obj["query"] for obj in lines] == queries
    for obj in lines:
        assert len(obj["matches"]) == 3
        assert {"id", "address", "score", "label", "probability"} <= set(obj["matches"][0])
    assert lines[0]["matches"][0]["source_id"] == "P0001"


def test_resolve_reads_stdin_and_file(index_dir, tmp_path):
    file = tmp_path / "queries.txt"
    file.write_text("深圳南山中山路75号东方科技园\n\n北京海淀东风路127号\n", encoding="utf-8")
    from_file = run("resolve", "--file", file, "--index-dir", index_dir, "--json", "--no-rerank")
    from_stdin = run("resolve", "--index-dir", index_dir, "--json", "--no-rerank", input=file.read_text(encoding="utf-8"))
    assert from_file.exit_code == from_stdin.exit_code == 0
    assert from_file.stdout == from_stdin.stdout
    assert len(from_file.stdout.splitlines()) == 2
    assert "label" not in json.loads(from_file.stdout.splitlines()[0])["matches"][0]


def test_resolve_table(index_dir):
    result = run("resolve", "北京海淀东风路127号东方大厦", "--index-dir", index_dir, "--top-k", "2")
    assert result.exit_code == 0, result.output
    for header in ("#", "id", "address", "score", "label", "confidence"):
        assert header in result.stdout


@pytest.mark.parametrize("columns", [80, 120])
def test_tables_break_no_label_number_or_path(index_dir, tmp_path, monkeypatch, columns):
    """At 80 and 120 columns only addresses wrap: every label, confidence, score and id is printed whole, and a
    normalize job's output path is one unbroken line (the terminal wraps it, no newline inside)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    result = runner.invoke(app, ["resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", str(index_dir), "--explain",
                                 "--top-k", "3"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= columns
    answers = json.loads(run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "--explain",
                             "--top-k", "3").stdout)["matches"]
    for m in answers:
        for whole in (m["label"], f"{m['probability']:.3f}", f"{m['score']:.3f}", m["source_id"]):
            assert whole in result.stdout, (whole, result.stdout)
    assert "confidence" in result.stdout and "✓ agree" in result.stdout
    rows = tmp_path / ("stores-with-a-long-file-name-" * 3 + ".csv")
    rows.write_text("id,address\n1,深圳南山中山路75号东方科技园9号楼\n", encoding="utf-8")
    out = tmp_path / ("normalized-output-with-a-long-name-" * 3 + ".csv")
    job = runner.invoke(app, ["normalize", str(rows), "--index-dir", str(index_dir), "--out", str(out)],
                        env={"COLUMNS": str(columns)})
    assert job.exit_code == 0, job.output
    assert f"output: {out}" in job.stdout


def test_help_usage_names_arguments_and_tags_no_flag():
    build = run("build", "--help").stdout
    assert "Usage: mgeo-index build [OPTIONS] CATALOG" in build and "{catalog}" not in build
    assert "<bool>" not in build and "<path>" in build  # options that take a value keep their type
    assert "Usage: mgeo-index parse [OPTIONS] [TEXTS]..." in run("parse", "--help").stdout
    assert "<bool>" not in run("--help").stdout
    missing = run("build")
    assert missing.exit_code != 0 and "Missing argument 'CATALOG'" in missing.output


def test_resolve_without_an_index_says_how_to_build(tmp_path):
    result = run("resolve", "北京", "--index-dir", tmp_path / "nothing")
    assert result.exit_code == 1
    assert "mgeo-index build" in result.output


def test_build_missing_column_names_it(tmp_path):
    result = run("build", settings.SAMPLE_CATALOG, "--index-dir", tmp_path / "x", "--address-column", "addr_line")
    assert result.exit_code == 1
    assert "addr_line" in result.output and "address" in result.output


def test_match_scores_pairs_in_input_order(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "pair_id\ta\tb\n"
        "1\t北京市朝阳区建国路88号\t北京朝阳建国路88号\n"
        "2\t北京市朝阳区建国路88号\t\n"
        "3\t上海市徐汇区漕溪北路1号\t广州市天河区中山大道西1号\n",
        encoding="utf-8",
    )
    out = tmp_path / "scored.tsv"
    result = run("match", "--file", pairs, "--out", out)
    assert result.exit_code == 0, result.output
    assert "line 3: no letter or digit in column 'b'" in result.output
    rows = list(csv.DictReader(out.open(encoding="utf-8"), delimiter="\t"))
    assert [r["pair_id"] for r in rows] == ["1", "2", "3"]
    assert list(rows[0])[-4:] == ["label", "p_exact_match", "p_partial_match", "p_not_match"]
    assert rows[1]["label"] == ""
    for r in (rows[0], rows[2]):
        probs = [float(r[f"p_{label}"]) for label in settings.LABELS]
        assert abs(sum(probs) - 1) < 1e-4
        assert r["label"] == settings.LABELS[probs.index(max(probs))]
    assert float(rows[0]["p_exact_match"]) > float(rows[2]["p_exact_match"])


def test_match_explain_writes_both_values_of_each_element(tmp_path):
    """match --explain writes the explanation resolve --json and the API give: state, both values, the sentence."""
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\n特区报业大厦1201室\t特区报业大厦12楼02\n北京朝阳建国路88号\t北京市朝阳区建国路88号\n",
                     encoding="utf-8")
    out = tmp_path / "scored.tsv"
    result = run("match", "--file", pairs, "--out", out, "--explain", "--pairwise")
    assert result.exit_code == 0, result.output
    rows = [json.loads(r["explain"]) for r in csv.DictReader(out.open(encoding="utf-8"), delimiter="\t")]
    assert rows[0]["room"] == {"state": "differ", "query": "1201室", "candidate": "12楼02",  # the room with its floor
                               "text": "room differs: 1201室 vs 12楼02"}
    assert rows[1]["roadno"] == {"state": "agree", "query": "88号", "candidate": "88号", "text": "roadno agrees: 88号"}


def test_match_requires_columns_a_and_b(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("x\ty\n北京\t上海\n", encoding="utf-8")
    result = run("match", "--file", pairs, "--out", tmp_path / "o.tsv")
    assert result.exit_code == 1
    assert "'a'" in result.output and "found: ['x', 'y']" in result.output


def test_db_commands(tmp_path):
    assert "empty" in run("db", "current", "--index-dir", tmp_path).stdout
    assert store.alembic_head() in run("db", "upgrade", "--index-dir", tmp_path).stdout
    assert "revision base (no migrations applied)" in run("db", "downgrade", "base", "--index-dir", tmp_path).stdout


def _commands(group, prefix=()):
    import typer.main

    click_group = typer.main.get_command(group)
    for name, command in click_group.commands.items():
        if hasattr(command, "commands"):
            for sub in command.commands:
                yield (*prefix, name, sub)
        else:
            yield (*prefix, name)


@pytest.mark.parametrize("command", list(_commands(app)), ids=" ".join)
def test_every_command_has_help_with_an_example_and_is_documented(command):
    result = run(*command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.stdout
    readme = (settings.PACKAGE_DIR.parent / "README.md").read_text(encoding="utf-8")
    assert f"mgeo-index {' '.join(command)}" in readme


def test_the_profile_and_number_policy_are_shown_wherever_answers_are(index_dir, monkeypatch):
    """build's summary, check, resolve's table footer and --json say what answers are made with, and where each
    setting comes from (flag > environment > the index's > default)."""
    monkeypatch.delenv("MGEO_INDEX_NUMBERS", raising=False)
    monkeypatch.delenv("MGEO_INDEX_PROFILE", raising=False)
    facts = json.loads(run("check", "--index-dir", index_dir, "--json").stdout)["facts"]
    assert facts["profile"] == "default (default)" and facts["numbers"] == "strict (default)"
    monkeypatch.setenv("MGEO_INDEX_NUMBERS", "loose")
    facts = json.loads(run("check", "--index-dir", index_dir, "--json").stdout)["facts"]
    assert facts["numbers"] == "loose (MGEO_INDEX_NUMBERS)"
    answer = json.loads(run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "-k", "1").stdout)
    assert (answer["profile"], answer["numbers"]) == ("default", "loose")
    answer = json.loads(run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "-k", "1",
                            "--numbers", "strict").stdout)
    assert answer["numbers"] == "strict"  # the flag before the environment
    table = run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "-k", "1").stdout
    assert "profile default · numbers loose · plan " in table
    assert answer["plan"] == str(plan(queries=1))  # a one-shot's: NumPy where the CPU's default is FP32 torch
    assert facts["plan (queries here)"] == str(plan())  # a service's, a job's, an index opened in Python
    assert facts["plan (vectors)"] == str(torch_plan())  # the build embedded on the CPU's default


def test_the_plan_is_recorded_with_the_build_and_the_job(index_dir, tmp_path):
    descriptor = json.loads((index_dir / "index.json").read_text(encoding="utf-8"))
    assert descriptor["plan"] == str(torch_plan())
    stores = tmp_path / "stores.csv"
    stores.write_text("address\n深圳南山中山路75号东方科技园9号楼\n", encoding="utf-8")
    assert run("normalize", stores, "--index-dir", index_dir, "--out", tmp_path / "out.csv").exit_code == 0
    job = json.loads(run("jobs", "--index-dir", index_dir, "--json").stdout.splitlines()[0])
    assert job["params"]["plan"] == str(torch_plan()) and job["params"]["backend"] == torch_plan().backend


def test_resolve_explain_in_json_and_table(index_dir):
    result = run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "--explain", "--top-k", "2")
    assert result.exit_code == 0, result.output
    best = json.loads(result.stdout)["matches"][0]
    assert best["explain"]["roadno"] == {"state": "agree", "query": "75号", "candidate": "75号", "text": "roadno agrees: 75号"}
    table = run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--explain", "--top-k", "1")
    assert "✓roadno" in table.stdout


@pytest.mark.slow
def test_bench_reports_ratios_and_latency(index_dir):
    result = run("bench", "--limit", "40", "--naive", "8", "--index-dir", index_dir, "--queries", "5", "--json",
                 "--backend", "torch", "--backends", "torch,int8")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for part in ("encode", "score_pairs"):
        assert report[part]["ratio"] > 0 and report[part]["n"] == 40 and report[part]["naive_n"] == 8
    assert report["encode"]["max_abs_diff"] < 1e-3  # padding to 64 one at a time gives the same vectors
    for part in ("encode", "score_pairs"):  # torch's Linear layers run as addmm: part of the time, never all
        assert 0 < report[part]["linear_share"] < 1 and report[part]["ceiling_ratio"] > report[part]["ratio"]
    resolve = report["resolve"]["torch"]
    assert resolve["queries"] == 5 and 0 < resolve["p50_ms"] <= resolve["p99_ms"]
    torch_row, int8_row = report["backends"]
    assert (torch_row["backend"], int8_row["backend"]) == ("torch", "int8")
    assert torch_row["encode_vs_torch"] == 1.0 and int8_row["encode_per_s"] > 0
    assert 0.98 < int8_row["embedding_cosine_min"] <= 1.0 + 1e-6


def test_bench_refuses_an_unknown_backend():
    result = run("bench", "--limit", "10", "--backends", "torch,tensorrt")
    assert result.exit_code == 1 and "tensorrt" in result.output


def test_backend_option_is_validated_and_used(index_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MGEO_INDEX_CACHE", str(tmp_path / "cache"))
    result = run("resolve", "深圳南山中山路75号", "--index-dir", index_dir, "--backend", "tensorrt")
    assert result.exit_code == 1 and "torch, bf16, compile, int8, onnx" in result.output
    plain = run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "--top-k", "3")
    fast = run("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "--top-k", "3", "--backend", "onnx")
    assert fast.exit_code == 0, fast.output
    ours, theirs = json.loads(plain.stdout)["matches"], json.loads(fast.stdout)["matches"]
    assert [m["id"] for m in ours] == [m["id"] for m in theirs]  # ONNX Runtime computes what torch computes
    assert abs(ours[0]["probability"] - theirs[0]["probability"]) < 1e-4
    result = run("normalize", tmp_path / "in.csv", "--out", tmp_path / "out.csv", "--index-dir", index_dir, "--backend", "gpu")
    assert result.exit_code == 1 and "backend must be one of" in result.output  # before the input is even opened


def test_a_resolve_of_a_few_addresses_starts_without_torch_where_the_default_is_fp32(index_dir, tmp_path, monkeypatch):
    """Where the CPU's default is FP32 torch, a resolve of a few addresses runs the numpy backend, which computes the
    same numerics without importing torch, and gives the same answers; more addresses (a batch) keep the default
    backend, and so do int8 / bf16 CPUs, whose rounding the numpy backend does not repeat bit for bit."""
    from mgeo_index.api import AddressIndex
    from mgeo_index.runtime import plan as plan_module

    opened = []
    real_open = AddressIndex.open.__func__

    def spy(cls, *args, **kwargs):
        idx = real_open(cls, *args, **kwargs)
        opened.append(type(idx.resolver.cross).__module__.rsplit(".", 1)[1])
        return idx

    monkeypatch.setattr(AddressIndex, "open", classmethod(spy))
    monkeypatch.delenv("MGEO_INDEX_BACKEND", raising=False)
    monkeypatch.setattr(settings, "cpu_flags", lambda: frozenset({"avx2"}))  # a CPU whose default is FP32 torch
    monkeypatch.setattr(plan_module, "ONE_SHOT_QUERIES", 2)
    query = "深圳南山中山路75号东方科技园9号楼"
    one_shot = run("resolve", query, "--index-dir", index_dir, "--json")
    torch_backend = run("resolve", query, "--index-dir", index_dir, "--json", "--backend", "torch")
    few, many = tmp_path / "few.txt", tmp_path / "many.txt"
    few.write_text(f"{query}\n深圳南山\n", encoding="utf-8")
    many.write_text(f"{query}\n深圳南山\n北京朝阳\n", encoding="utf-8")
    from_few, from_many = (run("resolve", "--file", f, "--index-dir", index_dir, "--json") for f in (few, many))
    monkeypatch.setattr(settings, "cpu_flags", lambda: frozenset({"avx2", "avx512_vnni"}))  # int8 by default
    on_int8 = run("resolve", query, "--index-dir", index_dir, "--json")
    assert all(r.exit_code == 0 for r in (one_shot, torch_backend, from_few, from_many, on_int8))
    assert opened == ["numpy_backend", "cross_encoder", "numpy_backend", "cross_encoder", "cross_encoder"]
    ours, theirs = json.loads(one_shot.stdout)["matches"], json.loads(torch_backend.stdout)["matches"]
    assert [(m["id"], m["label"]) for m in ours] == [(m["id"], m["label"]) for m in theirs]
    assert max(abs(a["probability"] - b["probability"]) for a, b in zip(ours, theirs)) <= 2e-6
    assert plan_module.plan("int8", None, queries=1).backend == "int8"


def test_the_numpy_backend_set_in_the_environment_leaves_batch_work_on_the_default(tmp_path, monkeypatch):
    """MGEO_INDEX_BACKEND=numpy, set for one-shot commands, must not stop a build, an update or bench: what runs as
    a torch module runs on the CPU's default (build failed with an internal message, bench with a traceback)."""
    monkeypatch.setenv("MGEO_INDEX_BACKEND", "numpy")
    catalog, more = tmp_path / "catalog.csv", tmp_path / "more.csv"
    catalog.write_text("id,address\n1,浙江省杭州市西湖区文三路478号\n2,北京市朝阳区建国路88号\n", encoding="utf-8")
    more.write_text("id,address\n3,上海市浦东新区世纪大道100号\n", encoding="utf-8")
    built = run("build", catalog, "--index-dir", tmp_path / "idx")
    assert built.exit_code == 0, built.output
    added = run("add", more, "--index-dir", tmp_path / "idx")
    assert added.exit_code == 0, added.output
    answer = run("resolve", "上海世纪大道100号", "--index-dir", tmp_path / "idx", "--json")
    assert answer.exit_code == 0 and json.loads(answer.stdout)["matches"][0]["id"] == 3
    timed = run("bench", "--limit", "12", "--naive", "4", "--backends", "numpy", "--json")
    assert timed.exit_code == 0, timed.output
    report = json.loads(timed.stdout)
    assert report["backend"] == settings.DEFAULT_CPU_BACKEND
    assert "skipped" in report["backends"][0] and "one-shot" in report["backends"][0]["skipped"]  # not the default under numpy's name


def test_parse_json_and_table(tmp_path):
    result = run("parse", "北京朝阳建国路八十八号三单元", "长春市朝阳区", "--json")
    assert result.exit_code == 0, result.output
    beijing, changchun = [json.loads(line) for line in result.stdout.splitlines()]
    assert beijing["text"] == "北京朝阳建国路88号3单元"
    assert (beijing["admin"]["province"], beijing["admin"]["district"], beijing["admin"]["district_code"]) == ("北京市", "朝阳区", "110105")
    assert {"label": "roadno", "text": "88号", "start": 7, "end": 10} in beijing["elements"]
    assert (changchun["admin"]["district_code"], changchun["admin"]["inferred"]) == ("220104", ["province"])
    addresses = tmp_path / "addresses.txt"
    addresses.write_text("海淀区中关村大街1号\n\n", encoding="utf-8")
    table = run("parse", "--file", addresses)
    assert table.exit_code == 0 and "北京市 (inferred)" in table.stdout and "110108" in table.stdout


def test_database_trouble_is_one_clear_line(tmp_path):
    result = run("db", "current", "--db", "postgresql://nobody@127.0.0.1:1/nowhere")  # nothing listens on port 1
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "Database error:" in said and "Traceback" not in said and "Check --db" in said
    result = run("db", "current", "--db", "not a url")
    assert result.exit_code == 1 and "invalid --db URL" in result.output


def test_an_index_built_on_a_database_server_is_not_read_from_a_new_sqlite_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MGEO_INDEX_DB", raising=False)
    index_dir = tmp_path / "idx"
    index_dir.mkdir()
    (index_dir / "index.json").write_text(json.dumps({"catalog": "default", "database": "postgresql+psycopg2://app:***@db:5432/geo"}))
    result = run("resolve", "北京朝阳建国路88号", "--index-dir", index_dir)
    said = " ".join(result.output.split())  # rich wraps long lines
    assert result.exit_code == 1 and "was built with the database postgresql+psycopg2://app:***@db:5432/geo" in said
    assert "pass --db" in said and not (index_dir / settings.DB_FILENAME).exists()  # nothing created
    assert settings.database_url(index_dir, "sqlite:////elsewhere.db") == "sqlite:////elsewhere.db"  # told: used
    (index_dir / settings.DB_FILENAME).touch()  # an SQLite store left from before it moved to the server
    with pytest.raises(settings.DatabaseNotGiven, match="whose password index.json does not keep"):
        settings.database_url(index_dir)
    # a URL recorded whole (the password from PGPASSWORD or ~/.pgpass): the index opens from it
    (index_dir / "index.json").write_text(json.dumps({"catalog": "default", "database": "postgresql://app@db:5432/geo"}))
    assert settings.database_url(index_dir).endswith("://app@db:5432/geo")
    # a directory moved with its own SQLite store records its old path: its store is read
    (index_dir / "index.json").write_text(json.dumps({"catalog": "default", "database": "sqlite:////old/place/mgeo.db"}))
    assert settings.database_url(index_dir) == f"sqlite:///{index_dir.resolve() / settings.DB_FILENAME}"


def test_db_upgrade_creates_the_folder_of_a_new_sqlite_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'new' / 'folder' / 'store.db'}"
    result = run("db", "upgrade", "--db", url)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "new" / "folder" / "store.db").exists()


def test_postgresql_urls_without_a_driver_get_the_installed_one():
    import importlib.util

    has_v3 = importlib.util.find_spec("psycopg") is not None
    expected = "postgresql://u@h/db" if has_v3 else "postgresql+psycopg2://u@h/db"
    if not has_v3 and importlib.util.find_spec("psycopg2") is None:
        pytest.skip("no PostgreSQL driver installed")
    assert settings.with_driver("postgresql://u@h/db") == expected
    assert settings.with_driver("postgres://u@h/db") == expected
    assert settings.with_driver("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert settings.with_driver("sqlite:///x.db") == "sqlite:///x.db"


def test_bad_paths_and_options_are_one_clear_line(index_dir, tmp_path):
    def said(result) -> str:
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output
        return " ".join(result.output.split())  # rich wraps long lines

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert "is a file, not a directory" in said(run("resolve", "北京", "--index-dir", a_file))
    assert "is a file, not a directory" in said(run("build", settings.SAMPLE_CATALOG, "--index-dir", a_file))
    missing = tmp_path / "no-such-index"
    assert "no index directory" in said(run("resolve", "北京", "--index-dir", missing))
    assert "no index directory" in said(run("check", "--index-dir", missing))
    assert not missing.exists()  # a reader leaves nothing behind
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\n北京朝阳建国路88号\t北京市朝阳区建国路88号\n", encoding="utf-8")
    assert "--device must be cpu, cuda or cuda:N" in said(run("match", "--file", pairs, "--out", tmp_path / "o.tsv", "--device", "gpu"))
    assert "--out must not be the input file" in said(run("match", "--file", pairs, "--out", pairs))
    assert pairs.read_text(encoding="utf-8").startswith("a\tb\n")  # untouched
    assert "does not exist or is not a file" in said(run("parse", "--file", tmp_path / "nope.txt"))
    assert "--split must be one of holdout, dev, calib, train, all" in said(run("eval", "pairs", pairs, "--split", "foo"))
    empty = tmp_path / "ids.txt"
    empty.write_text("\n")
    assert "holds no ids" in said(run("remove", "--file", empty, "--index-dir", index_dir))


def test_serve_says_when_its_port_is_taken(index_dir):
    import socket

    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--index-dir", index_dir, "--port", port)
    assert result.exit_code == 1 and f"port {port} on 127.0.0.1 is in use" in " ".join(result.output.split())


def test_the_cli_reference_in_docs_is_every_commands_own_help():
    """docs/cli.md is generated from the commands' --help: change a command, regenerate it
    (python -m mgeo_index.cli.reference > docs/cli.md)."""
    from mgeo_index.cli.reference import commands, reference

    written = (settings.PACKAGE_DIR.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    assert written == reference(), "docs/cli.md is out of date: python -m mgeo_index.cli.reference > docs/cli.md"
    assert len(list(commands())) == len(list(_commands(app)))  # every command, groups' included


def test_rerank_depth_help_states_the_shipped_network_depth_and_gap():
    from mgeo_index.cli.options import RerankDepth
    from mgeo_index.query.resolver import NETWORK_DEPTH, NETWORK_GAP, RERANK_DEPTH

    text = RerankDepth.__metadata__[0].help
    assert f"first {NETWORK_DEPTH} of them within {NETWORK_GAP} of the best" in text
    assert f"[default: {RERANK_DEPTH}]" in text.replace("\\[", "[")
