"""Incremental updates, generations, gc, check/repair and the writer lock, on the tiny random model
(what is checked is bookkeeping — which vectors exist, which entries are returned — not match quality)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import delete
from typer.testing import CliRunner

from mgeo_index import files, settings, store
from mgeo_index.catalog import generations, ownership, index_json
from mgeo_index.index import faiss_index
from mgeo_index.catalog.build import build
from mgeo_index.cli import app
from mgeo_index.catalog.locking import Locked, writer_lock
from mgeo_index.query.resolver import open_resolver
from mgeo_index.catalog.update import add, check, gc, remove, repair

LINES = settings.SAMPLE_CATALOG.read_text(encoding="utf-8").splitlines()
HEADER = LINES[0]


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([HEADER] + rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base_index(tiny_index) -> Path:
    return tiny_index


@pytest.fixture
def index_dir(base_index, tmp_path) -> Path:
    """A private copy of the 300-entry index (SQLite store inside)."""
    return Path(shutil.copytree(base_index, tmp_path / "idx"))


def _vectors(index_dir: Path) -> dict[int, np.ndarray]:
    descriptor = index_json.read_descriptor(index_dir)
    index = faiss_index.load(index_dir / descriptor["index_file"])
    return {int(i): index.reconstruct(int(i)) for i in faiss_index.index_ids(index)}


def _entries_by_source(index_dir: Path) -> dict[str, dict]:
    engine = store.connect(settings.database_url(index_dir))
    try:
        ids = store.entry_ids(engine, store.catalog_id(engine, settings.DEFAULT_CATALOG))
        return {e["source_id"]: e for e in store.get_entries(engine, ids.tolist()).values()}
    finally:
        engine.dispose()


def test_add_update_remove_embed_only_what_changed(index_dir, tmp_path, tiny_model_dirs):
    bi_dir = tiny_model_dirs[0]
    before = _vectors(index_dir)
    old = _entries_by_source(index_dir)
    changed = LINES[1].replace("75号", "77号")
    delta = _csv(tmp_path / "delta.csv", [changed, LINES[2], "P9001,新店,浙江省杭州市西湖区文三路90号新店,杭州市"])
    result = add(delta, index_dir, model=bi_dir, device="cpu")
    assert (result.rows_inserted, result.rows_updated, result.rows_skipped) == (1, 1, 1)
    assert (result.vectors_added, result.vectors_removed, result.vectors_total) == (2, 1, 301)
    after = _vectors(index_dir)
    new = _entries_by_source(index_dir)
    assert "77号" in new["P0001"]["address"] and new["P0001"]["id"] != old["P0001"]["id"]
    assert old["P0001"]["id"] not in after and new["P0001"]["id"] in after
    untouched = set(before) - {old["P0001"]["id"]}
    assert all(np.array_equal(before[i], after[i]) for i in untouched)  # not re-embedded

    again = add(delta, index_dir, model=bi_dir, device="cpu")  # idempotent
    assert (again.rows_inserted, again.rows_updated, again.vectors_added, again.vectors_total) == (0, 0, 0, 301)

    removed = remove(["P9001", "P0002", "NOT-THERE"], index_dir, model=bi_dir, device="cpu")
    assert (removed.removed, removed.not_found, removed.vectors_total) == (2, ["NOT-THERE"], 299)
    assert {"P9001", "P0002"}.isdisjoint(_entries_by_source(index_dir))
    resolver = open_resolver(index_dir, model=bi_dir, rerank=False, device="cpu")
    hits = resolver.resolve(["江苏省南京市鼓楼区下关街道中山路89号星河广场14栋"], top_k=299, rerank=False)[0]
    assert "P0002" not in {m["source_id"] for m in hits} and len(hits) > 0
    report = check(index_dir)
    assert report.clean, report.problems
    assert report.facts["live entries in store"] == report.facts["vectors in index"] == 299
    # removing ids that are gone already writes no generation (and pushes none out)
    again = remove(["P9001", "NOT-THERE"], index_dir, model=bi_dir, device="cpu")
    assert (again.removed, again.generation_id, again.vectors_total) == (0, removed.generation_id, 299)


def test_an_interrupted_removal_is_published_by_the_rerun(index_dir, tiny_model_dirs):
    engine = store.connect(settings.database_url(index_dir))
    store.retire_entries(engine, store.catalog_id(engine, settings.DEFAULT_CATALOG), ["P0007"])  # as if killed here
    before = index_json.read_descriptor(index_dir)["generation_id"]
    rerun = remove(["P0007"], index_dir, model=tiny_model_dirs[0], device="cpu")
    assert rerun.removed == 0 and rerun.not_found == ["P0007"] and rerun.generation_id > before
    assert rerun.vectors_total == 299 and check(index_dir).clean


def test_readers_keep_their_generation_until_it_is_collected(index_dir, tiny_model_dirs):
    bi_dir = tiny_model_dirs[0]
    old_reader = open_resolver(index_dir, model=bi_dir, rerank=False, device="cpu")
    query = ["广东省深圳市南山区南山街道中山路75号东方科技园9号楼"]
    assert old_reader.resolve(query, top_k=1, rerank=False)[0][0]["source_id"] == "P0001"
    remove(["P0001"], index_dir, model=bi_dir, device="cpu")
    # the open reader still serves its complete generation: the removed entry is retired, not deleted
    assert old_reader.resolve(query, top_k=1, rerank=False)[0][0]["source_id"] == "P0001"
    fresh = open_resolver(index_dir, model=bi_dir, rerank=False, device="cpu")
    assert fresh.descriptor["generation_id"] > old_reader.descriptor["generation_id"]
    assert "P0001" not in {m["source_id"] for m in fresh.resolve(query, top_k=300, rerank=False)[0]}
    collected = gc(index_dir, keep=1)
    assert collected.generations_removed == [old_reader.descriptor["generation_id"]] and collected.entries_purged == 1
    assert not (index_dir / old_reader.descriptor["index_file"]).exists()
    assert sorted(p.name for p in index_dir.glob("index-*")) == [fresh.descriptor["index_file"]]
    for reader in (old_reader, fresh):
        reader.engine.dispose()


def test_writes_keep_two_generations_and_gc_keeps_n(index_dir, tmp_path, tiny_model_dirs):
    bi_dir = tiny_model_dirs[0]
    for n in range(3):
        add(_csv(tmp_path / f"d{n}.csv", [f"Q{n},店{n},浙江省杭州市西湖区文三路{n + 1}号,杭州市"]), index_dir, model=bi_dir, device="cpu")
    engine = store.connect(settings.database_url(index_dir))
    catalog_id = store.catalog_id(engine, settings.DEFAULT_CATALOG)
    kept = store.list_generations(engine, catalog_id)
    assert len(kept) == generations.KEEP_GENERATIONS and kept[0]["id"] == store.current_generation(engine, catalog_id)["id"]
    assert len(list(index_dir.glob("index-*.faiss"))) == len(list(index_dir.glob("sparse-*.npz"))) == 2
    last_build = max(b["id"] for b in store.list_builds(engine, catalog_id))
    (index_dir / f".index-{last_build}.faiss.abc.tmp").write_bytes(b"half")  # left by a killed writer of a build
    (index_dir / ".index-9999.faiss.abc.tmp").write_bytes(b"not ours")  # no build of this catalog wrote it
    result = gc(index_dir, keep=1)
    assert f".index-{last_build}.faiss.abc.tmp" in result.files_removed and len(result.generations_kept) == 1
    assert (index_dir / ".index-9999.faiss.abc.tmp").exists()
    with pytest.raises(ValueError, match="at least 1"):
        gc(index_dir, keep=0)
    engine.dispose()


def test_hnsw_removal_rebuilds_from_stored_vectors(tmp_path, tiny_model_dirs):
    bi_dir = tiny_model_dirs[0]
    index_dir = tmp_path / "hnsw"
    build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", model=bi_dir, device="cpu", factory="HNSW32")
    before = _vectors(index_dir)
    result = remove([f"P{i:04d}" for i in range(1, 6)], index_dir, model=bi_dir, device="cpu")
    after = _vectors(index_dir)
    assert result.vectors_total == len(after) == 295
    assert all(np.array_equal(before[i], v) for i, v in after.items())
    assert faiss_index.describe(faiss_index.load(index_dir / index_json.read_descriptor(index_dir)["index_file"]))["factory"].startswith("HNSW32")
    assert check(index_dir).clean


def _problems(index_dir: Path) -> str:
    report = check(index_dir)
    assert not report.clean
    return " | ".join(report.problems)


def test_check_reports_a_corrupt_index_file_and_repair_restores_it(index_dir, tiny_model_dirs):
    descriptor = index_json.read_descriptor(index_dir)
    path = index_dir / descriptor["index_file"]
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert f"file {descriptor['index_file']} does not match its recorded SHA-256" in _problems(index_dir)
    after = repair(index_dir, model=tiny_model_dirs[0], device="cpu")
    assert after.clean and after.facts["vectors in index"] == 300 and after.generation_id > descriptor["generation_id"]


def test_check_reports_missing_files_and_a_stale_manifest(index_dir, tiny_model_dirs):
    descriptor = index_json.read_descriptor(index_dir)
    (index_dir / descriptor["sparse_file"]).unlink()
    files.write_json_atomic(index_dir / "index.json", {**descriptor, "generation_id": 999})
    problems = _problems(index_dir)
    assert f"file {descriptor['sparse_file']} of generation {descriptor['generation_id']} is missing" in problems
    assert "index.json does not mirror the current generation" in problems
    assert repair(index_dir, model=tiny_model_dirs[0], device="cpu").clean


def test_check_reports_store_and_index_disagreeing(index_dir, tiny_model_dirs):
    engine = store.connect(settings.database_url(index_dir))
    catalog_id = store.catalog_id(engine, settings.DEFAULT_CATALOG)
    ids = store.entry_ids(engine, catalog_id)
    with engine.begin() as conn:  # rows deleted behind the index's back, and a row added without a vector
        conn.execute(delete(store.Entry).where(store.Entry.id.in_([int(ids[0]), int(ids[1])])))
    store.upsert_entries(engine, catalog_id, [{"key": "X1", "source_id": "X1", "address": "杭州市文三路1号",
                                               "normalized": "杭州市文三路1号", "extra": None, "line": None}])
    engine.dispose()
    problems = _problems(index_dir)
    assert "2 indexed ids do not exist in the store at all" in problems
    assert "1 live entries of the store have no vector in the index" in problems
    after = repair(index_dir, model=tiny_model_dirs[0], device="cpu")
    assert after.clean and after.facts["vectors in index"] == 299


def test_check_reports_a_changed_model(tmp_path, tiny_model_dirs):
    model_dir = Path(shutil.copytree(tiny_model_dirs[0], tmp_path / "bi"))
    index_dir = tmp_path / "idx"
    build(_csv(tmp_path / "c.csv", LINES[1:41]), index_dir, id_column="poi_id", model=model_dir, device="cpu")
    manifest_file = model_dir / "mgeo_index.json"
    manifest = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**manifest, "max_length": 60}))  # a different model now
    assert "the index was built with" in _problems(index_dir)
    after = repair(index_dir, model=model_dir, device="cpu")
    assert after.clean and after.facts["vectors in index"] == 40


def test_second_writer_is_refused_with_the_holders_pid(index_dir, tmp_path, tiny_model_dirs):
    bi_dir = tiny_model_dirs[0]
    delta = _csv(tmp_path / "d.csv", ["Q1,店,浙江省杭州市西湖区文三路1号,杭州市"])
    with writer_lock(index_dir, "test holder"):
        with pytest.raises(Locked, match=rf"locked by PID {os.getpid()} .*test holder"):
            add(delta, index_dir, model=bi_dir, device="cpu")
        with pytest.raises(Locked):
            remove(["P0001"], index_dir, model=bi_dir, device="cpu")
        with pytest.raises(Locked):
            gc(index_dir)
        # readers take no lock: resolving and checking work during a write
        resolver = open_resolver(index_dir, model=bi_dir, rerank=False, device="cpu")
        assert len(resolver.resolve(["深圳南山中山路75号"], top_k=3, rerank=False)[0]) == 3
        assert check(index_dir).clean
        resolver.engine.dispose()
    assert add(delta, index_dir, model=bi_dir, device="cpu").vectors_total == 301


def test_a_lock_holder_killed_with_sigkill_does_not_block_the_next_writer(index_dir):
    holder = ("import os, signal, sys\nfrom mgeo_index.catalog.locking import writer_lock\n"
              "with writer_lock(sys.argv[1], 'doomed'):\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", holder, str(index_dir)], capture_output=True, timeout=120)
    assert killed.returncode == -9
    assert "doomed" in (index_dir / ".writer.lock").read_text()  # the dead holder's note is still there
    with writer_lock(index_dir, "next"):
        assert json.loads((index_dir / ".writer.lock").read_text())["pid"] == os.getpid()


def test_cli_add_remove_check_gc(index_dir, tmp_path, tiny_model_dirs):
    runner = CliRunner()
    bi = str(tiny_model_dirs[0])
    delta = _csv(tmp_path / "d.csv", ["Q1,店,浙江省杭州市西湖区文三路1号,杭州市"])
    out = runner.invoke(app, ["add", str(delta), "-i", str(index_dir), "--model", bi, "--device", "cpu"])
    assert out.exit_code == 0, out.output
    assert re.search(r"updated entries\s*│\s*0", out.stdout) and re.search(r"vectors in index\s*│\s*301", out.stdout)
    ids = tmp_path / "ids.txt"
    ids.write_text("Q1\nP0003\n\n", encoding="utf-8")
    out = runner.invoke(app, ["remove", "--file", str(ids), "--ids", "GONE", "-i", str(index_dir), "--model", bi, "--device", "cpu"])
    assert out.exit_code == 0, out.output
    assert "removed 2 entries" in out.stdout and "GONE" in out.stderr
    out = runner.invoke(app, ["check", "-i", str(index_dir), "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["clean"] is True
    (index_dir / index_json.read_descriptor(index_dir)["sparse_file"]).unlink()
    out = runner.invoke(app, ["check", "-i", str(index_dir), "--json"])
    assert out.exit_code == 1 and "is missing" in json.loads(out.stdout)["problems"][0]
    out = runner.invoke(app, ["check", "-i", str(index_dir), "--repair", "--json", "--model", bi, "--device", "cpu"])
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["clean"] for line in out.stdout.splitlines()] == [False, True]
    out = runner.invoke(app, ["gc", "-i", str(index_dir), "--keep", "1"])
    assert out.exit_code == 0 and "kept generations" in out.stdout
    out = runner.invoke(app, ["remove", "-i", str(index_dir)])
    assert out.exit_code != 0


def test_lifecycle_against_postgresql(pg_url, tmp_path, tiny_model_dirs):
    bi_dir = tiny_model_dirs[0]
    index_dir = tmp_path / "pg"
    build(_csv(tmp_path / "c.csv", LINES[1:51]), index_dir, db=pg_url, id_column="poi_id", model=bi_dir, device="cpu")
    result = add(_csv(tmp_path / "d.csv", [LINES[1].replace("75号", "77号")] + LINES[51:61]), index_dir, db=pg_url,
                 model=bi_dir, device="cpu")
    assert (result.rows_inserted, result.rows_updated, result.vectors_added, result.vectors_total) == (10, 1, 11, 60)
    assert remove(["P0005"], index_dir, db=pg_url, model=bi_dir, device="cpu").vectors_total == 59
    report = check(index_dir, db=pg_url)
    assert report.clean, report.problems
    # the replaced P0001 row went with generation 1 (automatic gc keeps 2); P0005's row goes now
    assert gc(index_dir, db=pg_url, keep=1).entries_purged == 1
    assert not (index_dir / "mgeo.db").exists()  # everything went to PostgreSQL


def test_a_rebuild_reads_the_catalogs_own_columns_and_refuses_others(index_dir, tmp_path, tiny_model_dirs):
    from mgeo_index.catalog.reader import CatalogError

    before = _entries_by_source(index_dir)
    args = dict(model=tiny_model_dirs[0], device="cpu")
    again = build(settings.SAMPLE_CATALOG, index_dir, **args)  # no --id-column: the catalog's own, poi_id
    assert (again.rows_inserted, again.rows_updated, again.id_column, again.address_column) == (0, 0, "poi_id", "address")
    with pytest.raises(ValueError, match="was built with address column 'address' and id column 'poi_id'; this build "
                                         "names address column 'city'"):
        build(settings.SAMPLE_CATALOG, index_dir, address_column="city", **args)
    with pytest.raises(ValueError, match="this build names address column 'address' and id column 'name'"):
        build(settings.SAMPLE_CATALOG, index_dir, id_column="name", **args)
    assert build(settings.SAMPLE_CATALOG, index_dir, address_column="Address", id_column=" POI_ID", **args).rows_inserted == 0
    with pytest.raises(ValueError, match="both 'poi_id'"):
        build(settings.SAMPLE_CATALOG, index_dir, address_column="poi_id", id_column="poi_id", **args)
    no_address = tmp_path / "no-address.csv"
    no_address.write_text("poi_id,city\nP0001,深圳市\n", encoding="utf-8")
    with pytest.raises(CatalogError, match="address"):  # the stored column is required, not a guess
        build(no_address, index_dir, **args)
    assert _entries_by_source(index_dir) == before and check(index_dir).clean


def test_a_catalog_served_from_another_directory_is_not_taken_over(tmp_path, tiny_model_dirs):
    shared = f"sqlite:///{tmp_path / 'shared.db'}"  # one database for two index directories, as PostgreSQL is
    first, second = tmp_path / "first", tmp_path / "second"
    build(_csv(tmp_path / "c.csv", LINES[1:41]), first, db=shared, id_column="poi_id", model=tiny_model_dirs[0], device="cpu")
    before = index_json.read_descriptor(first)
    with pytest.raises(ownership.ServedElsewhere, match="served from another index directory"):
        build(_csv(tmp_path / "d.csv", LINES[41:51]), second, db=shared, id_column="poi_id", model=tiny_model_dirs[0],
              device="cpu")
    index_json.ensure_descriptor(second, settings.DEFAULT_CATALOG, shared)  # a directory pointed at the catalog
    for write in (lambda: remove(["P0001"], second, db=shared, device="cpu"), lambda: gc(second, db=shared),
                  lambda: repair(second, db=shared, device="cpu")):  # it never served the catalog: nothing to repair
        with pytest.raises(ownership.ServedElsewhere):
            write()
    engine = store.connect(shared)
    generation = store.current_generation(engine, store.catalog_id(engine, settings.DEFAULT_CATALOG))
    assert generation["id"] == before["generation_id"] and len(store.entry_ids(engine, generation["catalog_id"])) == 40
    assert check(first, db=shared).clean  # the first directory still serves it, untouched
    # a catalog of its own in the same database is fine
    build(_csv(tmp_path / "d.csv", LINES[41:51]), tmp_path / "third", db=shared, catalog="other", id_column="poi_id",
          model=tiny_model_dirs[0], device="cpu")
    assert check(tmp_path / "third", db=shared).clean and check(first, db=shared).clean


def test_an_index_built_before_generations_is_served_and_extended(index_dir, tmp_path, tiny_model_dirs):
    """Before migration 0003 only index.json named the files: readers use it until the first write."""
    bi_dir = tiny_model_dirs[0]
    engine = store.connect(settings.database_url(index_dir))
    with engine.begin() as conn:
        conn.execute(store.Catalog.__table__.update().values(current_generation_id=None))
        conn.execute(delete(store.Generation))
    engine.dispose()
    before = _vectors(index_dir)
    resolver = open_resolver(index_dir, model=bi_dir, rerank=False, device="cpu")
    assert len(resolver.resolve(["深圳南山中山路75号"], top_k=3, rerank=False)[0]) == 3
    resolver.engine.dispose()
    result = add(_csv(tmp_path / "d.csv", ["Q1,店,浙江省杭州市西湖区文三路1号,杭州市"]), index_dir, model=bi_dir, device="cpu")
    assert (result.vectors_added, result.vectors_total) == (1, 301)  # the old vectors were reused
    after = _vectors(index_dir)
    assert all(np.array_equal(before[i], after[i]) for i in before)
    assert check(index_dir).clean
