"""Crash safety for real: a build and an add are SIGKILLed (``MGEO_INDEX_CRASH_AT``) at every named kill
point in a child process; then (a) resolve answers from the previous generation exactly as before, (b)
re-running the command completes, (c) ``check`` is clean."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
from killed_writer import killed_writer

from mgeo_index import settings, store
from mgeo_index.catalog.build import build
from mgeo_index.catalog.crashpoints import POINTS
from mgeo_index.query.resolver import open_resolver
from mgeo_index.catalog.update import add, check, gc

pytestmark = pytest.mark.slow  # every test kills a writer process and re-runs it

QUERIES = ["深圳南山中山路75号东方科技园", "北京海淀东风路127号东方大厦", "南京鼓楼中山路89号星河广场"]


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _answers(index_dir: Path, bi_dir: Path) -> tuple[int, list[list[tuple[int, str]]]]:
    resolver = open_resolver(index_dir, model=bi_dir, rerank=False, device="cpu")
    try:
        results = resolver.resolve(QUERIES, top_k=5, rerank=False)
        return resolver.descriptor["generation_id"], [[(m["id"], m["address"]) for m in row] for row in results]
    finally:
        resolver.engine.dispose()


@pytest.mark.parametrize("command", ["build", "add"])
@pytest.mark.parametrize("point", POINTS)
def test_kill_9_leaves_the_previous_generation_and_a_rerun_completes(tmp_path, tiny_model_dirs, command, point):
    bi_dir, _ = tiny_model_dirs
    lines = settings.SAMPLE_CATALOG.read_text(encoding="utf-8").splitlines()
    index_dir = tmp_path / "idx"
    build(_write_lines(tmp_path / "head.csv", lines[:151]), index_dir, id_column="poi_id", model=bi_dir, device="cpu")
    if command == "build":  # 150 more rows
        change = _write_lines(tmp_path / "full.csv", lines)
    else:  # 40 new rows and 10 updated addresses (same id, new address)
        updated = [line.replace("号", "号之一", 1) for line in lines[1:11]]
        change = _write_lines(tmp_path / "delta.csv", [lines[0]] + updated + lines[151:191])
    before = _answers(index_dir, bi_dir)

    killed = killed_writer(command, change, index_dir, bi_dir, point)
    assert killed == -signal.SIGKILL

    assert _answers(index_dir, bi_dir) == before  # (a) same generation, same answers
    if command == "build":  # (b) the same command completes
        result = build(change, index_dir, id_column="poi_id", model=bi_dir, device="cpu")
        expected_entries = 300
    else:
        result = add(change, index_dir, model=bi_dir, device="cpu")
        expected_entries = 190
    assert result.entries_total == result.vectors_total == expected_entries
    generation, _ = _answers(index_dir, bi_dir)
    assert generation == result.generation_id > before[0]
    report = check(index_dir)  # (c)
    assert report.clean, report.problems
    assert report.facts["live entries in store"] == report.facts["vectors in index"] == expected_entries
    gc(index_dir, keep=1)
    assert check(index_dir).notes == []  # files of the interrupted write are gone too


def test_kill_9_during_the_first_build_then_rerun(tmp_path, tiny_model_dirs):
    bi_dir, _ = tiny_model_dirs
    index_dir = tmp_path / "idx"
    killed = killed_writer("build", settings.SAMPLE_CATALOG, index_dir, bi_dir, "index-write")
    assert killed == -signal.SIGKILL
    with pytest.raises(FileNotFoundError, match="no complete index generation yet"):
        open_resolver(index_dir, model=bi_dir, rerank=False, device="cpu")
    engine = store.connect(settings.database_url(index_dir))
    assert store.count_entries(engine, store.catalog_id(engine, settings.DEFAULT_CATALOG)) == 300  # rows kept
    engine.dispose()
    result = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", model=bi_dir, device="cpu")
    assert (result.rows_inserted, result.vectors_added, result.vectors_total) == (0, 300, 300)
    assert check(index_dir).clean
