"""The Milvus vector store (``build --vector-store``), run against Milvus Lite (embedded, no server): build,
resolve as the FAISS path does, add, remove, gc, check (a tampered collection, a missing one, a lagging
alias), and a writer SIGKILLed at each crash point then re-run. URL parsing and the factory mapping need no
Milvus. Skipped, saying why, where pymilvus or milvus-lite is not installed or Milvus Lite cannot start."""
from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from killed_writer import killed_writer
from typer.testing import CliRunner

from mgeo_index import settings, store
from mgeo_index.catalog import generations, index_json
from mgeo_index.index import vector_store
from mgeo_index.catalog.build import build
from mgeo_index.cli import app
from mgeo_index.catalog.crashpoints import POINTS
from mgeo_index.query.resolver import open_resolver
from mgeo_index.catalog.update import add, check, gc, remove, repair

LINES = settings.SAMPLE_CATALOG.read_text(encoding="utf-8").splitlines()
HEADER = LINES[0]
LITE = "milvus-lite://vectors.db"  # inside the index directory: a copy of the directory copies its vectors
QUERIES = ["深圳南山中山路75号东方科技园", "北京海淀东风路127号东方大厦", "南京鼓楼中山路89号星河广场",
           "江苏省南京市鼓楼区下关街道中山路89号星河广场14栋", "杭州西湖文三路"]


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([HEADER] + rows) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------- no Milvus needed


def test_vector_store_urls(tmp_path):
    assert vector_store.parse(None, tmp_path) is None and vector_store.parse("faiss", tmp_path) is None
    server = vector_store.parse("milvus://milvus.internal:19531/geo", tmp_path)
    assert (server.uri, server.db_name, server.lite) == ("http://milvus.internal:19531", "geo", False)
    assert vector_store.parse("milvus://milvus", tmp_path).uri == "http://milvus:19530"
    lite = vector_store.parse("milvus-lite://sub/v.db", tmp_path)
    assert lite.lite and lite.uri == str(tmp_path.resolve() / "sub" / "v.db") and lite.url == "milvus-lite://sub/v.db"
    assert vector_store.parse("milvus-lite:///abs/v.db", tmp_path).uri == "/abs/v.db"
    for bad, words in (("milvus://u:secret@h:19530", "MGEO_INDEX_MILVUS_TOKEN"), ("milvus-lite:///x/v.sqlite", ".db"),
                       ("qdrant://h:6333", "milvus://HOST:PORT"), ("milvus://h:notaport", "milvus://HOST:PORT")):
        with pytest.raises(ValueError, match=words):
            vector_store.parse(bad, tmp_path)


def test_factories_map_to_milvus_indexes():
    assert vector_store.milvus_index("Flat", 10, 16) == ("FLAT", {})
    assert vector_store.milvus_index("auto", 300, 16) == ("FLAT", {})
    assert vector_store.milvus_index("auto", 1_000_000, 256) == ("IVF_SQ8", {"nlist": 4096})
    assert vector_store.milvus_index("IVF256,Flat", 0, 16) == ("IVF_FLAT", {"nlist": 256})
    assert vector_store.milvus_index("IVF1024,PQ32", 0, 256) == ("IVF_PQ", {"nlist": 1024, "m": 32, "nbits": 8})
    assert vector_store.milvus_index("HNSW32", 0, 16) == ("HNSW", {"M": 32, "efConstruction": 40})
    with pytest.raises(ValueError, match="no Milvus counterpart"):
        vector_store.milvus_index("IVF256,SQfp16", 0, 16)


def test_collection_names_are_valid_and_distinct():
    assert vector_store.collection_name("default", 7) == "mgeo_default_b7"
    assert vector_store.alias_name("default") == "mgeo_default_current"
    odd = [vector_store.collection_name(name, 1) for name in ("深圳 POI", "深圳-POI", "a_b1")]
    assert all(name.isascii() and name.replace("_", "").isalnum() for name in odd) and len(set(odd)) == 3


# --------------------------------------------------------------------------- Milvus Lite


@pytest.fixture(scope="module")
def lite(tmp_path_factory) -> None:
    """Skip (saying why) unless pymilvus and milvus-lite are installed and Milvus Lite starts here."""
    pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'mgeo-index[milvus]'); Milvus tests skipped")
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'mgeo-index[milvus]'); Milvus tests skipped")
    location = vector_store.parse(LITE, tmp_path_factory.mktemp("probe"))
    try:
        with vector_store.session(location) as client:
            client.list_collections()
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot run here"
        pytest.skip(f"Milvus Lite cannot start here: {exc}")


@pytest.fixture(scope="module")
def milvus_base(lite, tmp_path_factory, tiny_model_dirs) -> Path:
    """The sample catalog built with the tiny model into Milvus Lite (read-only: tests take a copy)."""
    index_dir = tmp_path_factory.mktemp("milvus") / "idx"
    build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", model=tiny_model_dirs[0], device="cpu", vector_store=LITE)
    return index_dir


@pytest.fixture
def milvus_dir(milvus_base, tmp_path) -> Path:
    return Path(shutil.copytree(milvus_base, tmp_path / "idx"))


@pytest.fixture
def faiss_dir(tiny_index, tmp_path) -> Path:
    """The same catalog, same model, in FAISS files (a private copy)."""
    return Path(shutil.copytree(tiny_index, tmp_path / "faiss"))


def _client(index_dir: Path):
    return vector_store.session(vector_store.parse(LITE, index_dir))


def _answers(index_dir: Path, model_dirs, *, rerank: bool = True, retrieval: str = "hybrid"):
    resolver = open_resolver(index_dir, model=model_dirs[0], cross_model=model_dirs[1], rerank=rerank, device="cpu")
    try:
        return resolver.resolve(QUERIES, top_k=10, rerank=rerank, retrieval=retrieval, explain=True)
    finally:
        resolver.close()


def _collection_vectors(index_dir: Path) -> dict[int, np.ndarray]:
    name = index_json.read_descriptor(index_dir)["index_file"]
    with _client(index_dir) as client:
        vector_store.loaded(client, name)
        ids = vector_store.collection_ids(client, name).tolist()
        rows = client.query(name, ids=ids, output_fields=["id", "vector"])
    return {int(r["id"]): np.asarray(r["vector"], np.float32) for r in rows}


def test_build_resolves_exactly_as_the_faiss_path(milvus_dir, faiss_dir, tiny_model_dirs):
    descriptor = index_json.read_descriptor(milvus_dir)
    assert descriptor["vector_store"] == LITE and descriptor["index_file"] == f"mgeo_default_b{descriptor['build_id']}"
    assert not list(milvus_dir.glob("*.faiss")) and (milvus_dir / descriptor["sparse_file"]).is_file()
    with _client(milvus_dir) as client:
        assert vector_store.alias_target(client, "default") == descriptor["index_file"]
    for rerank, retrieval in ((True, "hybrid"), (False, "dense"), (False, "sparse")):
        assert _answers(milvus_dir, tiny_model_dirs, rerank=rerank, retrieval=retrieval) == \
            _answers(faiss_dir, tiny_model_dirs, rerank=rerank, retrieval=retrieval), (rerank, retrieval)
    report = check(milvus_dir)
    assert report.clean, report.problems
    assert report.facts["vectors in index"] == report.facts["live entries in store"] == 300
    assert report.facts["vector store"] == LITE and report.notes == []


def test_add_remove_gc_as_the_faiss_path(milvus_dir, faiss_dir, tmp_path, tiny_model_dirs):
    bi_dir = tiny_model_dirs[0]
    before = _collection_vectors(milvus_dir)
    delta = _csv(tmp_path / "delta.csv", [LINES[1].replace("75号", "77号"), LINES[2],
                                          "P9001,新店,浙江省杭州市西湖区文三路90号新店,杭州市"])
    for index_dir in (milvus_dir, faiss_dir):
        result = add(delta, index_dir, model=bi_dir, device="cpu")
        assert (result.vectors_added, result.vectors_removed, result.vectors_total) == (2, 1, 301)
    assert _answers(milvus_dir, tiny_model_dirs) == _answers(faiss_dir, tiny_model_dirs)
    after = _collection_vectors(milvus_dir)
    assert len(after) == 301 and all(np.array_equal(before[i], after[i]) for i in set(before) & set(after))  # copied, not re-embedded
    for index_dir in (milvus_dir, faiss_dir):
        removed = remove(["P9001", "P0002", "NOT-THERE"], index_dir, model=bi_dir, device="cpu")
        assert (removed.removed, removed.not_found, removed.vectors_total) == (2, ["NOT-THERE"], 299)
    assert _answers(milvus_dir, tiny_model_dirs) == _answers(faiss_dir, tiny_model_dirs)
    with _client(milvus_dir) as client:  # every write keeps two generations: two collections
        assert len(vector_store.ours(client, "default")) == generations.KEEP_GENERATIONS
    collected = gc(milvus_dir, keep=1)
    current = index_json.read_descriptor(milvus_dir)["index_file"]
    assert len(collected.collections_removed) == 1 and current not in collected.collections_removed
    with _client(milvus_dir) as client:
        assert vector_store.ours(client, "default") == [current] and vector_store.alias_target(client, "default") == current
    report = check(milvus_dir)
    assert report.clean and report.notes == [] and report.facts["vectors in index"] == 299, report.problems


def test_check_reports_a_tampered_collection_and_repair_rebuilds_it(milvus_dir, tiny_model_dirs):
    descriptor = index_json.read_descriptor(milvus_dir)
    with _client(milvus_dir) as client:
        ids = vector_store.collection_ids(client, descriptor["index_file"])
        client.delete(descriptor["index_file"], ids=[int(ids[0]), int(ids[1])])
        client.flush(descriptor["index_file"])
    report = check(milvus_dir)
    problems = " | ".join(report.problems)
    assert f"collection {descriptor['index_file']} holds 298 vectors" in problems
    assert "ids do not match the recorded ids checksum" in problems and "2 live entries of the store have no vector" in problems
    assert report.rebuild
    after = repair(milvus_dir, model=tiny_model_dirs[0], device="cpu")
    assert after.clean and after.facts["vectors in index"] == 300 and after.generation_id > descriptor["generation_id"], after.problems


def test_check_reports_a_missing_collection_and_repair_rebuilds_it(milvus_dir, tiny_model_dirs):
    descriptor = index_json.read_descriptor(milvus_dir)
    with _client(milvus_dir) as client:
        client.drop_collection(descriptor["index_file"])  # Milvus Lite drops its alias with it
    problems = " | ".join(check(milvus_dir).problems)
    assert f"collection {descriptor['index_file']} of generation {descriptor['generation_id']} is missing" in problems
    assert "alias mgeo_default_current names no collection" in problems
    after = repair(milvus_dir, model=tiny_model_dirs[0], device="cpu")
    assert after.clean and after.facts["vectors in index"] == 300, after.problems


def test_check_reports_a_lagging_alias_and_repair_realigns_it(milvus_dir, tmp_path, tiny_model_dirs):
    old = index_json.read_descriptor(milvus_dir)["index_file"]
    add(_csv(tmp_path / "d.csv", ["Q1,店,浙江省杭州市西湖区文三路1号,杭州市"]), milvus_dir, model=tiny_model_dirs[0], device="cpu")
    descriptor = index_json.read_descriptor(milvus_dir)
    with _client(milvus_dir) as client:  # as a writer killed between the store's switch and the alias
        vector_store.point_alias(client, "default", old)
    report = check(milvus_dir)
    assert report.realign and report.problems == [
        f"alias mgeo_default_current names {old}, not the current generation's collection {descriptor['index_file']} "
        f"(a write killed after its switch; `check --repair` or `gc` realigns it)"]
    after = repair(milvus_dir, model=tiny_model_dirs[0], device="cpu")
    assert after.clean and after.generation_id == descriptor["generation_id"]  # realigned, nothing rebuilt
    with _client(milvus_dir) as client:
        vector_store.point_alias(client, "default", old)
    assert gc(milvus_dir, keep=1).collections_removed == [old] and check(milvus_dir).clean  # gc realigns before dropping


def test_cli_build_check_gc_with_a_vector_store(lite, tmp_path, tiny_model_dirs):
    runner = CliRunner()
    bi = str(tiny_model_dirs[0])
    index_dir = tmp_path / "cli"
    catalog = _csv(tmp_path / "c.csv", LINES[1:41])
    out = runner.invoke(app, ["build", str(catalog), "-i", str(index_dir), "--id-column", "poi_id", "--model", bi,
                              "--device", "cpu", "--vector-store", LITE])
    assert out.exit_code == 0, out.output
    assert "mgeo_default_b1" in out.stdout
    out = runner.invoke(app, ["check", "-i", str(index_dir), "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["facts"]["collection"] == "mgeo_default_b1", out.output
    out = runner.invoke(app, ["build", str(catalog), "-i", str(index_dir), "--model", bi, "--device", "cpu",
                              "--index", "IVF64,SQfp16"])  # the catalog's store is kept, and this factory has no Milvus index
    assert out.exit_code == 1 and "no Milvus counterpart" in out.stderr
    out = runner.invoke(app, ["build", str(catalog), "-i", str(tmp_path / "bad"), "--vector-store", "milvus://u:p@h:1"])
    assert out.exit_code == 1 and "MGEO_INDEX_MILVUS_TOKEN" in out.stderr and not (tmp_path / "bad" / "mgeo.db").exists()
    out = runner.invoke(app, ["gc", "-i", str(index_dir), "--keep", "1"])
    assert out.exit_code == 0 and "kept generations" in out.stdout, out.output


def test_a_catalog_moves_between_faiss_files_and_milvus(faiss_dir, tiny_model_dirs, lite):
    bi_dir = tiny_model_dirs[0]
    to_milvus = build(settings.SAMPLE_CATALOG, faiss_dir, model=bi_dir, device="cpu", vector_store=LITE)
    assert to_milvus.vectors_added == 300 and check(faiss_dir).clean  # another store: everything embedded once
    assert index_json.read_descriptor(faiss_dir)["vector_store"] == LITE
    back = build(settings.SAMPLE_CATALOG, faiss_dir, model=bi_dir, device="cpu", vector_store="faiss")
    assert back.vectors_added == 300 and "vector_store" not in index_json.read_descriptor(faiss_dir)
    gc(faiss_dir, keep=1)
    report = check(faiss_dir)
    assert report.clean and report.notes == [], report.problems
    with _client(faiss_dir) as client:  # the Milvus generation was collected: its collection and alias with it
        assert vector_store.ours(client, "default") == [] and vector_store.alias_target(client, "default") is None


# --------------------------------------------------------------------------- kill -9 at each write point

@pytest.fixture(scope="module")
def milvus_head(lite, tmp_path_factory, tiny_model_dirs) -> Path:
    """The first 150 rows in Milvus Lite (read-only: tests take a copy)."""
    root = tmp_path_factory.mktemp("milvus-head")
    index_dir = root / "idx"
    build(_csv(root / "head.csv", LINES[1:151]), index_dir, id_column="poi_id", model=tiny_model_dirs[0], device="cpu",
          vector_store=LITE)
    return index_dir


@pytest.mark.slow
@pytest.mark.parametrize("command", ["build", "add"])
@pytest.mark.parametrize("point", POINTS)
def test_kill_9_at_each_write_point_then_the_rerun_completes(milvus_head, tmp_path, tiny_model_dirs, command, point):
    bi_dir = tiny_model_dirs[0]
    index_dir = Path(shutil.copytree(milvus_head, tmp_path / "idx"))
    if command == "build":  # 150 more rows
        change, expected = _csv(tmp_path / "full.csv", LINES[1:]), 300
    else:  # 40 new rows and 10 updated addresses
        change, expected = _csv(tmp_path / "delta.csv", [line.replace("号", "号之一", 1) for line in LINES[1:11]] + LINES[151:191]), 190
    before = _answers(index_dir, tiny_model_dirs, rerank=False)
    generation = index_json.read_descriptor(index_dir)["generation_id"]

    assert killed_writer(command, change, index_dir, bi_dir, point) == -signal.SIGKILL

    # (a) readers still get the previous generation, answering exactly as before
    engine = store.connect(settings.database_url(index_dir))
    assert store.current_generation(engine, store.catalog_id(engine, "default"))["id"] == generation
    engine.dispose()
    assert _answers(index_dir, tiny_model_dirs, rerank=False) == before
    if point != "stored":  # the killed write's collection was created: no generation names it
        assert any("collections of no generation" in note for note in check(index_dir).notes)
    # (b) the same command completes
    if command == "build":
        result = build(change, index_dir, id_column="poi_id", model=bi_dir, device="cpu")
    else:
        result = add(change, index_dir, model=bi_dir, device="cpu")
    assert result.entries_total == result.vectors_total == expected and result.generation_id > generation
    # (c) check is clean, and gc leaves no collection (nor file) of the killed write behind
    report = check(index_dir)
    assert report.clean, report.problems
    assert report.facts["live entries in store"] == report.facts["vectors in index"] == expected
    gc(index_dir, keep=1)
    assert check(index_dir).notes == []
    with _client(index_dir) as client:
        assert vector_store.ours(client, "default") == [index_json.read_descriptor(index_dir)["index_file"]]
