"""The command line without optional extras, and what its commands import."""
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mgeo_index.measure import bench
from mgeo_index.runtime import backends
from mgeo_index.cli import app

runner = CliRunner()
HEAVY = ("faiss", "transformers", "fastapi", "uvicorn")

# Runs the CLI in a fresh interpreter and reports, on its last stderr line, which heavy stacks it loaded.
_PROBE = """
import json, sys
from mgeo_index.cli import app
try:
    app(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r)), file=sys.stderr)
""" % (HEAVY,)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def said(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("args", [["--help"], ["parse", "北京市朝阳区建国路88号", "--json"], ["jobs", "--db", "sqlite://"],
                                  ["db", "current", "--db", "sqlite://"]], ids=" ".join)
def test_light_commands_load_no_faiss_transformers_or_service(args):
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    if args[0] == "parse":
        assert json.loads(done.stdout)["admin"]["district_code"] == "110105"


def test_normalize_options_default_to_the_library_constants():
    import typer.main

    from mgeo_index import jobs as normalize

    command = typer.main.get_command(app).commands["normalize"]
    defaults = {p.name: p.default() if callable(p.default) else p.default for p in command.params}  # read when needed
    assert (defaults["min_probability"], defaults["ambiguous_margin"], defaults["top_k"], defaults["chunk_size"],
            defaults["batch_size"]) == (normalize.DEFAULT_MIN_PROBABILITY, normalize.DEFAULT_MARGIN, normalize.DEFAULT_TOP_K,
                                        normalize.DEFAULT_CHUNK_SIZE, normalize.DEFAULT_BATCH_SIZE)


def test_a_missing_backend_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(backends.MissingExtra, match=r"pip install 'mgeo-index\[onnx\]'"):
        backends.require("onnx")
    assert backends.require("int8") == "int8"  # no extra needed
    with pytest.raises(ValueError, match="backend must be one of"):
        backends.require("tensorrt")


def test_backend_onnx_without_its_extra_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert "pip install 'mgeo-index[onnx]'" in said(run("bench", "--backend", "onnx", "--backends", ""))  # before any work
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\n北京朝阳建国路88号\t北京市朝阳区建国路88号\n", encoding="utf-8")
    assert "pip install 'mgeo-index[onnx]'" in said(run("match", "--file", pairs, "--out", tmp_path / "o.tsv", "--backend", "onnx"))


def test_bench_skips_a_backend_whose_extra_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    rows = bench.bench_backends(["onnx"], ["北京朝阳建国路88号"], ["北京市朝阳区建国路88号"])
    assert [row["backend"] for row in rows] == ["onnx"] and set(rows[0]) == {"backend", "skipped"}
    assert rows[0]["skipped"].startswith("the onnx backend needs onnxruntime")
    assert rows[0]["skipped"].endswith("pip install 'mgeo-index[onnx]'")
    result = run("bench", "--limit", "4", "--naive", "1", "--backend", "torch", "--backends", "onnx")
    assert result.exit_code == 0, result.output
    assert "backend onnx skipped: the onnx backend needs onnxruntime" in " ".join(result.output.split())
    assert "pip install 'mgeo-index[onnx]'" in result.output


def test_missing_ray_extra_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    stores = tmp_path / "stores.csv"
    stores.write_text("address\n北京朝阳建国路88号\n", encoding="utf-8")
    text = said(run("normalize", stores, "--out", tmp_path / "out.csv", "--engine", "ray", "--index-dir", tmp_path / "idx"))
    assert "pip install 'mgeo-index[ray]'" in text


def test_missing_eval_extra_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\tlabel\n北京朝阳建国路88号\t北京市朝阳区建国路88号\t1\n上海徐汇漕溪北路1号\t广州天河中山大道西1号\t0\n",
                     encoding="utf-8")
    assert "pip install 'mgeo-index[eval]'" in said(run("eval", "pairs", pairs, "--plot", tmp_path / "r.png"))


def test_missing_serve_extra_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert "pip install 'mgeo-index[serve]'" in said(run("serve", "--index-dir", tmp_path))


def test_error_text_is_printed_as_written(tmp_path):
    missing = tmp_path / "[brackets]" / "nope.txt"
    assert f"--file {missing} does not exist" in said(run("parse", "--file", missing))
