"""Build and resolve through the library API, with the shipped default model."""

import numpy as np
import pytest

from mgeo_index import settings, store
from mgeo_index.catalog import build as build_mod, index_json
from mgeo_index.index import faiss_index
from mgeo_index.catalog.build import build
from mgeo_index.query.resolver import ModelMismatch, open_resolver
from mgeo_index.text import model_text
from mgeo_index.text.parser import parser_version
from conftest import copy_index


@pytest.fixture(scope="module")
def built(sample_build, tmp_path_factory):
    """This module's copy of the session's sample index (its tests rebuild into it) and its BuildResult."""
    index_dir, result = sample_build
    return copy_index(index_dir, tmp_path_factory.mktemp("build-resolve") / "idx"), result


def test_build_stores_and_indexes_every_row(built):
    index_dir, result = built
    assert (result.rows_read, result.rows_inserted, result.rows_rejected) == (300, 300, 0)
    descriptor = index_json.read_descriptor(index_dir)
    index = faiss_index.load(index_dir / descriptor["index_file"])
    engine = store.connect(settings.database_url(index_dir))
    catalog_id = store.catalog_id(engine, settings.DEFAULT_CATALOG)
    ids = store.entry_ids(engine, catalog_id)
    assert index.ntotal == len(ids) == 300
    np.testing.assert_array_equal(np.sort(faiss_index.index_ids(index)), ids)
    entry = store.get_entries(engine, [int(ids[0])])[int(ids[0])]
    assert entry["source_id"] == "P0001" and set(entry["extra"]) == {"name", "city"}
    build_row = store.latest_build(engine, catalog_id)
    assert build_row["status"] == "complete" and build_row["vectors_total"] == 300
    assert build_row["model_fingerprint"] == descriptor["model_fingerprint"]


def test_rebuilding_the_same_file_adds_nothing(built, tmp_path):
    index_dir, first = built
    again = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id")
    assert (again.rows_inserted, again.rows_skipped, again.vectors_added, again.vectors_total) == (0, 300, 0, 300)
    assert again.build_id > first.build_id
    files = sorted(p.name for p in index_dir.glob("*.faiss"))
    # the new generation and the one before it are kept (gc keeps 2 after each write)
    assert files == [f"index-{first.build_id}.faiss", f"index-{again.build_id}.faiss"]


def test_resolve_finds_a_variant_at_rank_one(built):
    index_dir, _ = built
    resolver = open_resolver(index_dir)
    # P0001: 广东省深圳市南山区南山街道中山路75号东方科技园9号楼 — written without province/city, full-width digits
    results = resolver.resolve(["深圳南山中山路７５号东方科技园９号楼", "北京海淀燕园街道东风路127号东方大厦"], top_k=5)
    assert results[0][0]["source_id"] == "P0001"
    assert results[1][0]["source_id"] == "P0003"
    for matches in results:
        assert len(matches) == 5
        for m in matches:
            assert m["label"] in settings.LABELS
            assert abs(sum(m["probabilities"].values()) - 1) < 1e-4
            assert m["probability"] == max(m["probabilities"].values())


def test_incremental_build_encodes_only_new_rows(tmp_path, sample_catalog):
    lines = sample_catalog.read_text(encoding="utf-8").splitlines()
    head = tmp_path / "head.csv"
    head.write_text("\n".join(lines[:101]) + "\n", encoding="utf-8")
    first = build(head, tmp_path / "idx", id_column="poi_id")
    second = build(sample_catalog, tmp_path / "idx", id_column="poi_id")
    assert (first.vectors_total, second.rows_inserted, second.vectors_added, second.vectors_total) == (100, 200, 200, 300)


def test_interrupted_build_keeps_old_index_and_reruns_cleanly(tmp_path, sample_catalog, monkeypatch):
    lines = sample_catalog.read_text(encoding="utf-8").splitlines()
    head = tmp_path / "head.csv"
    head.write_text("\n".join(lines[:51]) + "\n", encoding="utf-8")
    index_dir = tmp_path / "idx"
    build(head, index_dir, id_column="poi_id")
    before = (index_dir / index_json.DESCRIPTOR).read_text()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(faiss_index, "save_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        build(sample_catalog, index_dir, id_column="poi_id")
    monkeypatch.undo()
    assert (index_dir / index_json.DESCRIPTOR).read_text() == before  # readers still see the old index
    engine = store.connect(settings.database_url(index_dir))
    builds = store.list_builds(engine)
    assert [b["status"] for b in builds] == ["complete", "failed"]
    assert "KeyboardInterrupt" in builds[-1]["error"]

    result = build(sample_catalog, index_dir, id_column="poi_id")
    assert (result.rows_inserted, result.entries_total, result.vectors_total) == (0, 300, 300)


def test_index_factory_string_is_honoured(tmp_path, sample_catalog):
    result = build(sample_catalog, tmp_path / "hnsw", factory="HNSW32")
    descriptor = index_json.read_descriptor(tmp_path / "hnsw")
    assert descriptor["index_factory"] == "HNSW32" and result.vectors_total == 300
    assert faiss_index.describe(faiss_index.load(tmp_path / "hnsw" / descriptor["index_file"]))["factory"].startswith("HNSW32")
    with pytest.raises(ValueError, match="NotAnIndex"):
        build(sample_catalog, tmp_path / "bad", factory="NotAnIndex")


def test_query_model_must_match_the_index_model(built, tiny_model_dirs):
    index_dir, _ = built
    with pytest.raises(ModelMismatch, match="rebuild the index"):
        open_resolver(index_dir, model=tiny_model_dirs[0])


def test_rejected_rows_are_reported_with_line_and_reason(tmp_path):
    catalog = tmp_path / "bad.csv"
    catalog.write_text(
        "n,address\n1,北京市朝阳区建国路88号\n2,\n3,上海市徐汇区\x07漕溪路\n4,北京市朝阳区建国路88号\n5,，，，\n",  # no id column
        encoding="utf-8",
    )
    result = build(catalog, tmp_path / "idx")
    assert (result.rows_inserted, result.rows_rejected) == (1, 4)
    rejects = (tmp_path / "idx" / build_mod.REJECTS).read_text(encoding="utf-8").splitlines()
    assert rejects[0] == "line\treason\traw"
    lines = [int(r.split("\t")[0]) for r in rejects[1:]]
    assert lines == [3, 4, 5, 6]
    assert "duplicate of line 2" in rejects[3]
    assert "normalization" in rejects[4]


def test_build_and_resolve_against_postgresql(pg_url, tmp_path, sample_catalog):
    """The store on a real PostgreSQL server (skipped, saying why, where none is reachable)."""
    result = build(sample_catalog, tmp_path / "idx", db=pg_url, id_column="poi_id")
    assert (result.entries_total, result.vectors_total) == (300, 300)
    assert not (tmp_path / "idx" / settings.DB_FILENAME).exists()  # nothing went to SQLite
    again = build(sample_catalog, tmp_path / "idx", db=pg_url, id_column="poi_id")
    assert (again.rows_inserted, again.vectors_total) == (0, 300)
    matches = open_resolver(tmp_path / "idx", db=pg_url).resolve(["北京海淀燕园街道东风路127号东方大厦"], top_k=3)[0]
    assert matches[0]["source_id"] == "P0003"
    # without --db: the URL index.json records (no password in it) is the store
    recorded = open_resolver(tmp_path / "idx").resolve(["北京海淀燕园街道东风路127号东方大厦"], top_k=3)[0]
    assert [m["id"] for m in recorded] == [m["id"] for m in matches]


def test_a_query_without_letters_or_digits_gets_no_candidates(built):
    index_dir, _ = built
    resolver = open_resolver(index_dir)
    assert resolver.resolve(["，。！？…", "---", ""], top_k=3) == [[], [], []]  # "…" normalizes to "..."
    assert resolver.resolve(["，。深圳南山中山路75号…"], top_k=1)[0][0]["source_id"] == "P0001"


def test_every_retrieval_mode_finds_the_variant(built):
    index_dir, _ = built
    resolver = open_resolver(index_dir)
    for retrieval in ("hybrid", "dense", "sparse"):
        matches = resolver.resolve(["北京海淀燕园街道东风路127号东方大厦"], top_k=3, retrieval=retrieval)[0]
        assert matches[0]["source_id"] == "P0003", retrieval
        assert len(matches) == 3 and all(m["score"] is not None for m in matches)
    with pytest.raises(ValueError, match="retrieval must be one of"):
        resolver.resolve(["北京"], retrieval="magic")


def test_build_stores_parsed_elements_and_admin_codes(built):
    index_dir, result = built
    assert result.entries_parsed == 300
    engine = store.connect(settings.database_url(index_dir))
    ids = store.entry_ids(engine, store.catalog_id(engine, settings.DEFAULT_CATALOG)).tolist()
    parsed = store.get_elements(engine, ids)
    assert len(parsed) == 300
    first = parsed[ids[0]]  # P0001 广东省深圳市南山区南山街道中山路75号东方科技园9号楼
    assert (first["province_code"], first["city_code"], first["district_code"]) == ("440000", "440300", "440305")
    assert {"label": "roadno", "text": "75号", "start": 16, "end": 19} in first["elements"]
    # the catalog's own city column agrees with the parsed city for nearly every entry
    entries = store.get_entries(engine, ids)
    same = sum(parsed[i]["admin"]["city"] == entries[i]["extra"]["city"] for i in ids)
    assert same >= 295
    again = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id")
    assert again.entries_parsed == 0  # parsed once; a re-run parses only entries without elements


def test_a_rebuild_refreshes_elements_parsed_by_another_parser_version(built):
    index_dir, _ = built
    engine = store.connect(settings.database_url(index_dir))
    ids = store.entry_ids(engine, store.catalog_id(engine, settings.DEFAULT_CATALOG)).tolist()
    stale = ids[:7]
    with engine.begin() as conn:  # as an older tagger / gazetteer would have left them
        conn.execute(store.EntryElements.__table__.update()
                     .where(store.EntryElements.entry_id.in_(stale))
                     .values(parser="parser-0000000000000000", city_code="999999", elements=[]))
    again = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id")
    assert again.entries_parsed == 7 and again.rows_inserted == 0
    parsed = store.get_elements(engine, ids)
    assert len(parsed) == 300
    assert {parsed[i]["parser"] for i in ids} == {parser_version()}
    assert parsed[ids[0]]["city_code"] == "440300" and parsed[ids[0]]["elements"]
    assert all(parsed[i]["city_code"] != "999999" for i in stale)


def test_explain_uses_parsed_elements_and_inferred_admin_levels(built):
    index_dir, _ = built
    resolver = open_resolver(index_dir)
    (matches,) = resolver.resolve(["深圳南山中山路75号东方科技园9号楼"], top_k=3, explain=True)
    best = matches[0]
    assert best["source_id"] == "P0001"
    rows = best["explain"]
    assert rows["city"]["state"] == "agree" and rows["city"]["query"] == "深圳市"
    assert rows["province"]["state"] == "agree" and "inferred for the query" in rows["province"]["text"]
    assert rows["roadno"] == {"state": "agree", "query": "75号", "candidate": "75号", "text": "roadno agrees: 75号"}
    assert rows["town"]["state"] == "only_b"  # 南山街道 is written only in the catalog entry


def test_parses_handed_to_resolve_give_the_same_answers_and_are_not_parsed_again(built, monkeypatch):
    from mgeo_index.query import resolver as resolving
    from mgeo_index.text.parser import parse

    index_dir, _ = built
    resolver = open_resolver(index_dir)
    queries = ["深圳南山中山路75号东方科技园9号楼", "南京市鼓楼区中山路75号"]
    plain = resolver.resolve(queries, top_k=3, explain=True)
    parses = parse([model_text(q) for q in queries])
    monkeypatch.setattr(resolving, "parse", lambda texts: pytest.fail(f"parsed again: {texts}"))
    assert resolver.resolve(queries, top_k=3, explain=True, parses=parses) == plain
    with pytest.raises(ValueError, match="2 queries but 1 parses"):
        resolver.resolve(queries, parses=parses[:1])


def test_admin_filter_drops_candidates_in_another_city(built):
    index_dir, _ = built
    resolver = open_resolver(index_dir)
    engine = store.connect(settings.database_url(index_dir))
    query = "南京市鼓楼区中山路75号东方科技园9号楼"  # P0001's street and POI, but in another city
    plain = resolver.resolve([query], top_k=10, rerank=False)[0]
    filtered = resolver.resolve([query], top_k=10, rerank=False, admin_filter=True)[0]
    cities = {i: e["city_code"] for i, e in store.get_elements(engine, [m["id"] for m in plain + filtered]).items()}
    assert any(cities[m["id"]] not in (None, "320100") for m in plain)
    assert filtered and all(cities[m["id"]] in (None, "320100") for m in filtered)


def test_the_network_scores_only_the_prescreened_share_of_the_pool(built, monkeypatch):
    from mgeo_index.query import labelling as engine_mod

    index_dir, _ = built
    resolver = open_resolver(index_dir)
    assert resolver.cross.feature_head is not None  # the shipped cross-encoder is stacked
    # give the network a weight, as a calibration that found it useful would (the shipped one may not)
    resolver.cross.stack = dict(resolver.cross.stack, alpha=0.2)
    scored = []
    real = engine_mod.score_pairs

    def counting(cross, firsts, seconds, **kw):
        scored.append(len(firsts))
        assert kw["features"] is not None and len(kw["features"]) == len(firsts)  # computed once, reused
        return real(cross, firsts, seconds, **kw)

    monkeypatch.setattr(engine_mod, "score_pairs", counting)
    queries = ["深圳南山中山路７５号东方科技园９号楼", "北京海淀燕园街道东风路127号东方大厦"]
    full = resolver.resolve(queries, top_k=5, rerank_depth=10)  # the whole pool of 2 × 5
    cut = resolver.resolve(queries, top_k=5, rerank_depth=5)
    assert scored == [20, 10]
    assert [m[0]["source_id"] for m in cut] == ["P0001", "P0003"]
    for whole, part in zip(full, cut):
        assert len(part) == 5
        # every candidate the cut kept carries the same probabilities as in the full rerank
        by_id = {m["id"]: m["probabilities"] for m in whole}
        for m in part:
            if m["id"] in by_id:
                assert m["probabilities"] == pytest.approx(by_id[m["id"]], abs=2e-3)
    resolver.resolve(queries, top_k=5, rerank_depth=1)  # never fewer than top_k
    assert scored[-1] == 10


def test_the_network_judges_only_the_candidates_that_may_come_first(built, monkeypatch):
    from mgeo_index.query import resolver as resolver_mod
    from mgeo_index.query import labelling as engine_mod

    index_dir, _ = built
    resolver = open_resolver(index_dir)
    assert resolver.cross.gate is not None and resolver.cross.uses_network  # the shipped cascade
    judged = []
    real = engine_mod._network_probabilities

    def counting(cross, firsts, seconds, features, **run):
        judged.append(list(zip(firsts, seconds)))
        return real(cross, firsts, seconds, features, **run)

    monkeypatch.setattr(engine_mod, "_network_probabilities", counting)
    # a gate that settles nothing on its own: what reaches the network is what the depth and gap leave to it
    monkeypatch.setattr(resolver.cross, "gate", dict(resolver.cross.gate, min_probability=1.01))
    queries = ["深圳南山中山路７５号东方科技园９号楼", "北京海淀燕园街道东风路127号东方大厦", "上海徐汇漕溪北路1号"]
    cut = resolver.resolve(queries, top_k=10)
    network_rows, shipped_depth = len(judged[0]), resolver_mod.NETWORK_DEPTH
    # a query's answer is its own: alone it gets the same candidates, labels and probabilities as in the batch
    assert [resolver.resolve([q], top_k=10)[0] for q in queries] == cut
    monkeypatch.setattr(resolver_mod, "NETWORK_DEPTH", 10)
    monkeypatch.setattr(resolver_mod, "NETWORK_GAP", float("inf"))
    judged.clear()
    whole = resolver.resolve(queries, top_k=10)
    assert network_rows <= len(queries) * shipped_depth < len(judged[0]) == sum(map(len, whole))
    assert [m[0]["id"] for m in cut] == [m[0]["id"] for m in whole]  # the same first answers
    assert [m[0]["source_id"] for m in cut[:2]] == ["P0001", "P0003"]
    assert [{m["id"] for m in c} for c in cut] == [{m["id"] for m in w} for w in whole]  # the same candidates


def test_a_features_only_scorer_ranks_the_whole_pool_without_the_network(built, monkeypatch):
    from mgeo_index.query import labelling as engine_mod

    index_dir, _ = built
    resolver = open_resolver(index_dir)
    resolver.cross.stack = dict(resolver.cross.stack, alpha=0.0)
    seen = []
    real = engine_mod.score_pairs
    monkeypatch.setattr(engine_mod, "score_pairs", lambda cross, f, s, **kw: seen.append(len(f)) or real(cross, f, s, **kw))
    monkeypatch.setattr(resolver.cross.model, "forward", lambda *a, **k: pytest.fail("the transformer ran"))
    (matches,) = resolver.resolve(["深圳南山中山路７５号东方科技园９号楼"], top_k=5)
    assert seen == [10]  # no prescreen cut: the feature head is the whole scorer
    assert matches[0]["source_id"] == "P0001" and len(matches) == 5


def test_auto_index_says_what_it_chose_and_an_ivf_choice_resolves_like_flat(tmp_path, sample_catalog, monkeypatch):
    from mgeo_index.index import faiss_index
    from mgeo_index.catalog.build import build
    from mgeo_index.catalog.index_json import read_descriptor

    flat = build(sample_catalog, tmp_path / "flat", id_column="poi_id", device="cpu")  # the default: auto
    assert flat.index_factory == "auto: Flat" and read_descriptor(tmp_path / "flat")["index_factory"] == "auto"
    monkeypatch.setattr(faiss_index, "FLAT_MAX_ROWS", 100)  # the sample's 300 rows count as a large catalog
    ivf = build(sample_catalog, tmp_path / "ivf", id_column="poi_id", device="cpu")
    assert ivf.index_factory.startswith("auto: IVF4,SQ8 (nprobe ") and "recall@10" in ivf.index_factory
    flat_top = [m[0]["source_id"] for m in open_resolver(tmp_path / "flat").resolve(["深圳南山中山路75号东方科技园9号楼"])]
    ivf_top = [m[0]["source_id"] for m in open_resolver(tmp_path / "ivf").resolve(["深圳南山中山路75号东方科技园9号楼"])]
    assert flat_top == ivf_top == ["P0001"]
    # a re-build keeps the structure it has (auto chooses only for a new index) and embeds nothing again
    again = build(sample_catalog, tmp_path / "ivf", id_column="poi_id", device="cpu")
    assert again.vectors_added == 0 and again.index_factory.startswith("auto: IVF4,SQ8")


def test_a_query_without_an_admin_part_is_searched_once_for_its_core(built, monkeypatch):
    """Hybrid retrieval also searches each query's text below its admin levels; where there is none, that text is
    the query itself, so its first search's answer is reused (same candidates, one n-gram search fewer)."""
    from mgeo_index.compare.features import without_admin

    index_dir, _ = built
    resolver = open_resolver(index_dir)
    queries = ["中山路75号东方科技园", "深圳市南山区中山路75号东方科技园"]
    assert without_admin(queries[0]) == queries[0] and without_admin(queries[1]) != queries[1]
    before = resolver.resolve(queries, top_k=5)
    searched = []
    real = resolver.sparse.search

    def counting(texts, k):
        searched.append(list(texts))
        return real(texts, k)

    monkeypatch.setattr(resolver.sparse, "search", counting)
    after = resolver.resolve(queries, top_k=5)
    assert searched == [queries, [without_admin(queries[1])]]  # the admin-free query once, not twice
    assert [[m["id"] for m in ms] for ms in after] == [[m["id"] for m in ms] for ms in before]
    assert after[0][0]["probabilities"] == pytest.approx(before[0][0]["probabilities"], abs=1e-6)


def test_batches_side_by_side_build_the_same_catalog_as_one_at_a_time(tmp_path):
    """The local runner on two threads (two 60-row chunks parsed or embedded at a time, one intra-op thread
    each) stores the same entries and elements and the same vector bits as on one."""
    import torch

    from mgeo_index.compute.local import LocalRunner
    from mgeo_index.catalog.consistency import catalog_state

    threads = torch.get_num_threads()
    states = []
    for n in (1, 2):
        index_dir = tmp_path / f"threads-{n}"
        runner = LocalRunner("cpu", threads=n)
        result = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device="cpu", chunk_size=60, runner=runner)
        assert result.entries_parsed == result.vectors_added == 300 and runner.describe()["threads"] == n
        states.append(catalog_state(index_dir))
        assert torch.get_num_threads() == threads  # restored
    _assert_same_catalog(*states)


def _assert_same_catalog(state, other) -> None:
    (entries, elements, vectors), (entries2, elements2, vectors2) = state, other
    assert entries == entries2 and elements == elements2
    assert vectors.keys() == vectors2.keys() and all(np.array_equal(vectors[i], vectors2[i]) for i in vectors)


@pytest.mark.slow
def test_worker_processes_build_the_same_catalog_as_this_process(tmp_path):
    """``build --workers 2``: two worker processes, each loading the tagger and the bi-encoder from their files,
    parse and embed the chunks; the store and the vectors are those of a build in this process."""
    from mgeo_index.catalog.consistency import catalog_state

    states = []
    for workers in (None, 2):
        index_dir = tmp_path / f"workers-{workers}"
        result = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device="cpu", chunk_size=60,
                       workers=workers)
        assert result.entries_parsed == result.vectors_added == 300
        states.append(catalog_state(index_dir))
    _assert_same_catalog(*states)


def test_in_threads_keeps_order_reads_ahead_at_most_its_width_and_raises_the_first_error():
    import threading

    from mgeo_index.runtime.parallel import in_threads

    read = []

    def batches():
        for i in range(10):
            read.append(i)
            yield i

    seen = []
    for batch, out in in_threads(lambda b: (b * b, threading.current_thread().name), batches(), 3):
        assert len(read) - batch <= 3  # never more than 3 batches ahead of the consumer
        seen.append((batch, out[0]))
        assert out[1].startswith("mgeo-batch")
    assert seen == [(i, i * i) for i in range(10)]

    def fail(b):
        if b == 4:
            raise ValueError("row 4: bad")
        return b

    with pytest.raises(ValueError, match="row 4"):
        list(in_threads(fail, iter(range(10)), 2))
