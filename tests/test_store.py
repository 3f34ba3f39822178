"""mgeo_index.store against SQLite and (when reachable) PostgreSQL."""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from sqlalchemy import Engine, delete
from sqlalchemy.exc import IntegrityError

from mgeo_index import store

ADDRESSES = [
    "北京市朝阳区建国路88号",
    "上海市浦东新区世纪大道100号",
    "广州市天河区天河路385号",
    "深圳市南山区科技园南区深南大道10000号",
    "杭州市西湖区文三路90号",
]


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db' / 'mgeo.db'}"
    else:
        url = request.getfixturevalue("pg_database")
    eng = store.connect(url)
    try:
        yield eng
    finally:
        eng.dispose()


def _catalog(engine: Engine, name: str | None = None) -> int:
    return store.get_or_create_catalog(
        engine, name or f"cat_{uuid.uuid4().hex[:8]}", source="/data/a.csv", address_column="address", id_column=None
    )


def _rows(addresses: list[str], start_line: int = 2) -> list[dict]:
    return [
        {
            "key": a.replace(" ", ""),
            "source_id": None,
            "address": a,
            "normalized": a,
            "extra": {"城市": a[:3], "n": i},
            "line": start_line + i,
        }
        for i, a in enumerate(addresses)
    ]


def test_catalog_get_or_create_updates(engine: Engine) -> None:
    name = f"cat_{uuid.uuid4().hex[:8]}"
    assert store.catalog_id(engine, name) is None
    first = store.get_or_create_catalog(engine, name, source="a.csv", address_column="address", id_column=None)
    again = store.get_or_create_catalog(engine, name, source="b.tsv", address_column="地址", id_column="poi_id")
    assert first == again == store.catalog_id(engine, name)
    other = _catalog(engine)
    assert other != first
    with engine.connect() as conn:
        row = conn.execute(store.Catalog.__table__.select().where(store.Catalog.id == first)).one()
    assert (row.source, row.address_column, row.id_column) == ("b.tsv", "地址", "poi_id")
    assert row.created_at is not None


def test_insert_entries_idempotent(engine: Engine) -> None:
    cid = _catalog(engine)
    rows = _rows(ADDRESSES)
    assert store.insert_entries(engine, cid, rows) == (5, 0)
    assert store.insert_entries(engine, cid, rows) == (0, 5)
    assert store.count_entries(engine, cid) == 5

    # Partial overlap, plus a key repeated inside the same chunk (first one wins).
    more = _rows(ADDRESSES[:2] + ["成都市武侯区人民南路四段1号", "成都市武侯区人民南路四段1号"], start_line=7)
    assert store.insert_entries(engine, cid, more) == (1, 3)
    assert store.count_entries(engine, cid) == 6
    assert store.insert_entries(engine, cid, []) == (0, 0)

    # The same key in another catalog is a different entry.
    other = _catalog(engine)
    assert store.insert_entries(engine, other, rows[:2]) == (2, 0)
    assert store.count_entries(engine, cid) == 6
    assert store.count_entries(engine, other) == 2


def test_insert_entries_large_chunk(engine: Engine) -> None:
    cid = _catalog(engine)
    rows = _rows([f"北京市海淀区中关村大街{i}号" for i in range(5000)])
    assert store.insert_entries(engine, cid, rows) == (5000, 0)
    assert store.insert_entries(engine, cid, rows[2500:] + _rows(["天津市和平区南京路1号"])) == (1, 2500)
    ids = store.entry_ids(engine, cid)
    assert ids.dtype == np.int64 and len(ids) == 5001
    assert np.all(np.diff(ids) > 0)


def test_insert_missing_fallback(engine: Engine) -> None:
    """The portable pre-select path used for dialects without ON CONFLICT."""
    cid = _catalog(engine)
    store.insert_entries(engine, cid, _rows(ADDRESSES[:2]))
    params = [{"catalog_id": cid, "created_at": store._utcnow(), **r} for r in _rows(ADDRESSES)]
    with engine.begin() as conn:
        assert store._insert_missing(conn, cid, params) == 3
    assert store.count_entries(engine, cid) == 5


def test_entry_ids_get_entries(engine: Engine) -> None:
    cid = _catalog(engine)
    store.insert_entries(engine, cid, _rows(ADDRESSES))
    ids = store.entry_ids(engine, cid)
    assert isinstance(ids, np.ndarray) and ids.dtype == np.int64
    assert list(ids) == sorted(ids) and len(ids) == 5
    assert len(store.entry_ids(engine, cid + 10_000)) == 0

    got = store.get_entries(engine, [int(ids[1]), int(ids[0]), 987_654_321])
    assert set(got) == {int(ids[0]), int(ids[1])}
    first = got[int(ids[0])]
    assert first == {
        "id": int(ids[0]),
        "catalog_id": cid,
        "source_id": None,
        "address": ADDRESSES[0],
        "normalized": ADDRESSES[0],
        "extra": {"城市": "北京市", "n": 0},
    }
    assert store.get_entries(engine, []) == {}


def test_iter_entries(engine: Engine) -> None:
    cid = _catalog(engine)
    addresses = [f"南京市鼓楼区中山路{i}号" for i in range(23)]
    store.insert_entries(engine, cid, _rows(addresses))
    store.insert_entries(engine, _catalog(engine), _rows(["不相干的地址1号"]))  # another catalog

    batches = list(store.iter_entries(engine, cid, batch_size=10))
    assert [len(b) for b in batches] == [10, 10, 3]
    flat = [e for b in batches for e in b]
    assert [e["address"] for e in flat] == addresses  # id order == insertion order
    assert set(flat[0]) == {"id", "address", "normalized"}
    assert [e["id"] for e in flat] == sorted(e["id"] for e in flat)

    ids = [e["id"] for e in flat]
    subset = [ids[7], ids[3], ids[3], ids[20], 999_999_999]
    picked = [e for b in store.iter_entries(engine, cid, ids=subset, batch_size=2) for e in b]
    assert [e["id"] for e in picked] == sorted({ids[3], ids[7], ids[20]})
    assert list(store.iter_entries(engine, cid, ids=[])) == []
    assert list(store.iter_entries(engine, cid + 10_000)) == []


def test_entry_ids_never_reused(engine: Engine) -> None:
    """Entry ids are FAISS ids: deleting the newest entry must not free its id."""
    cid = _catalog(engine)
    store.insert_entries(engine, cid, _rows(ADDRESSES[:3]))
    top = int(store.entry_ids(engine, cid)[-1])
    with engine.begin() as conn:
        conn.execute(delete(store.Entry).where(store.Entry.id == top))
    store.insert_entries(engine, cid, _rows(["重庆市渝中区解放碑1号"]))
    assert int(store.entry_ids(engine, cid)[-1]) > top


def test_entries_require_existing_catalog(engine: Engine) -> None:
    with pytest.raises(IntegrityError):
        store.insert_entries(engine, 987_654, _rows(ADDRESSES[:1]))


def test_build_lifecycle(engine: Engine) -> None:
    cid = _catalog(engine)
    other = _catalog(engine)
    assert store.latest_build(engine, cid) is None

    b1 = store.start_build(engine, cid, model_fingerprint="sha256:abc", index_factory="Flat")
    (running,) = store.list_builds(engine, cid)
    assert running["id"] == b1 and running["status"] == "running"
    assert running["started_at"] is not None and running["finished_at"] is None
    assert store.latest_build(engine, cid) is None  # only complete builds count

    store.finish_build(
        engine,
        b1,
        index_path="/idx/default.faiss",
        rows_read=10,
        rows_inserted=7,
        rows_skipped=1,
        rows_rejected=2,
        entries_total=7,
        vectors_total=7,
        seconds=1.5,
        stats={"rejects": {"empty address": 2}},
    )
    latest = store.latest_build(engine, cid)
    assert latest is not None
    assert latest["id"] == b1 and latest["status"] == "complete"
    assert (latest["rows_read"], latest["rows_inserted"], latest["rows_skipped"], latest["rows_rejected"]) == (10, 7, 1, 2)
    assert (latest["entries_total"], latest["vectors_total"], latest["seconds"]) == (7, 7, 1.5)
    assert latest["model_fingerprint"] == "sha256:abc" and latest["index_factory"] == "Flat"
    assert latest["index_path"] == "/idx/default.faiss"
    assert latest["stats"] == {"rejects": {"empty address": 2}}
    assert latest["finished_at"] >= latest["started_at"]

    b2 = store.start_build(engine, cid, model_fingerprint="sha256:def", index_factory="IVF64,Flat")
    store.fail_build(engine, b2, "CUDA out of memory")
    assert store.latest_build(engine, cid)["id"] == b1  # a failed build does not replace it
    failed = store.list_builds(engine, cid)[-1]
    assert (failed["id"], failed["status"], failed["error"]) == (b2, "failed", "CUDA out of memory")
    assert failed["finished_at"] is not None

    b3 = store.start_build(engine, other, model_fingerprint="sha256:abc", index_factory="Flat")
    assert [b["id"] for b in store.list_builds(engine, cid)] == [b1, b2]
    assert [b["id"] for b in store.list_builds(engine, other)] == [b3]
    assert {b1, b2, b3} <= {b["id"] for b in store.list_builds(engine)}


def test_finish_build_rejects_bad_input(engine: Engine) -> None:
    cid = _catalog(engine)
    build = store.start_build(engine, cid, model_fingerprint="f", index_factory="Flat")
    with pytest.raises(TypeError, match="rows_readd"):
        store.finish_build(engine, build, rows_readd=1)
    with pytest.raises(ValueError, match="status"):
        store.finish_build(engine, build, status="done")
    with pytest.raises(LookupError):
        store.finish_build(engine, 987_654_321, rows_read=1)
    assert store.list_builds(engine, cid)[0]["status"] == "running"


def test_connect_in_memory_sqlite() -> None:
    engine = store.connect("sqlite://")
    try:
        cid = _catalog(engine, "mem")
        assert store.insert_entries(engine, cid, _rows(ADDRESSES)) == (5, 0)
        assert store.count_entries(engine, cid) == 5
    finally:
        engine.dispose()


def test_sqlite_file_survives_reconnect(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'mgeo.db'}"
    engine = store.connect(url)
    cid = _catalog(engine, "persist")
    store.insert_entries(engine, cid, _rows(ADDRESSES))
    engine.dispose()
    engine = store.connect(url)
    try:
        assert store.catalog_id(engine, "persist") == cid
        assert store.insert_entries(engine, cid, _rows(ADDRESSES)) == (0, 5)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- lifecycle (migration 0003)


def _keyed(pairs: list[tuple[str, str]]) -> list[dict]:
    return [{"key": k, "source_id": k, "address": a, "normalized": a, "extra": None, "line": i}
            for i, (k, a) in enumerate(pairs, 2)]


def test_upsert_inserts_updates_and_keeps(engine: Engine) -> None:
    cid = _catalog(engine)
    assert store.upsert_entries(engine, cid, _keyed([("A", ADDRESSES[0]), ("B", ADDRESSES[1])])) == (2, 0, 0)
    old = store.entry_ids(engine, cid)
    changed = _keyed([("A", ADDRESSES[2]), ("B", ADDRESSES[1]), ("C", ADDRESSES[3]), ("C", ADDRESSES[4])])
    assert store.upsert_entries(engine, cid, changed) == (1, 1, 1)  # C new (first wins), A updated, B kept
    live = store.entry_ids(engine, cid)
    assert len(live) == 3 and old[1] in live and old[0] not in live  # A got a new id; B kept its id
    entries = store.get_entries(engine, live.tolist())
    assert sorted(e["address"] for e in entries.values()) == sorted([ADDRESSES[2], ADDRESSES[1], ADDRESSES[3]])
    assert store.get_entries(engine, [int(old[0])])[int(old[0])]["address"] == ADDRESSES[0]  # retired, still readable
    assert store.count_entries(engine, cid) == 3
    assert store.upsert_entries(engine, cid, changed) == (0, 0, 3)  # idempotent


def test_retire_and_purge(engine: Engine) -> None:
    cid = _catalog(engine)
    store.upsert_entries(engine, cid, _keyed([("A", ADDRESSES[0]), ("B", ADDRESSES[1]), ("C", ADDRESSES[2])]))
    ids = store.entry_ids(engine, cid)
    retired, unknown = store.retire_entries(engine, cid, ["A", "B", "Z"])
    assert retired == ids[:2].tolist() and unknown == ["Z"]
    assert store.retire_entries(engine, cid, ["A"]) == ([], ["A"])  # re-running is harmless
    assert store.entry_ids(engine, cid).tolist() == [int(ids[2])]
    store.upsert_entries(engine, cid, _keyed([("A", ADDRESSES[0])]))  # the key is free again
    assert store.count_entries(engine, cid) == 2
    assert store.purge_retired(engine, cid, keep_ids=np.array([ids[0]])) == 1  # B goes, A's old row is still referenced
    assert set(store.get_entries(engine, ids.tolist())) == {int(ids[0]), int(ids[2])}


def test_live_keys_are_unique(engine: Engine) -> None:
    cid = _catalog(engine)
    store.upsert_entries(engine, cid, _keyed([("A", ADDRESSES[0])]))
    with pytest.raises(IntegrityError):
        with engine.begin() as conn:
            conn.execute(store.Entry.__table__.insert(), {**_keyed([("A", ADDRESSES[1])])[0], "catalog_id": cid,
                                                          "created_at": store._utcnow()})


def _generation(n: int) -> dict:
    return {"kind": "build", "index_file": f"index-{n}.faiss", "sparse_file": f"sparse-{n}.npz", "index_factory": "Flat",
            "dim": 16, "ntotal": n, "ids_sha256": "0" * 64, "checksums": {f"index-{n}.faiss": "x"},
            "model_fingerprint": "fp", "model_path": None}


def test_switch_generation_is_one_compare_and_swap_transaction(engine: Engine) -> None:
    cid = _catalog(engine)
    assert store.current_generation(engine, cid) is None
    build_id = store.start_build(engine, cid, model_fingerprint="fp", index_factory="Flat")
    first = store.switch_generation(engine, cid, expected=None, build_id=build_id, build_fields={"vectors_total": 1},
                                    **_generation(1))
    assert store.current_generation(engine, cid)["id"] == first
    assert store.list_builds(engine, cid)[-1]["status"] == "complete"
    second = store.switch_generation(engine, cid, expected=first, **_generation(2))
    assert store.current_generation(engine, cid)["parent_id"] == first
    # a writer that started from `first` lost the race: nothing of its switch remains, its build stays running
    late_build = store.start_build(engine, cid, model_fingerprint="fp", index_factory="Flat")
    with pytest.raises(store.GenerationConflict):
        store.switch_generation(engine, cid, expected=first, build_id=late_build, **_generation(3))
    assert [g["id"] for g in store.list_generations(engine, cid)] == [second, first]
    assert store.list_builds(engine, cid)[-1]["status"] == "running"
    with pytest.raises(ValueError, match="is current"):
        store.delete_generations(engine, [second])
    store.delete_generations(engine, [first])
    assert [g["id"] for g in store.list_generations(engine, cid)] == [second]
    with pytest.raises(TypeError, match="unknown generation field"):
        store.switch_generation(engine, cid, expected=second, colour="red", **_generation(4))


def test_postgresql_bulk_load_through_copy_keeps_every_value_and_order(pg_url):
    """A chunk of COPY_MIN_ROWS or more goes through COPY: tricky texts survive, NULLs stay NULL, ids follow the
    rows' order, and a second load of the same keys inserts nothing."""
    from mgeo_index.store import catalogs

    engine = store.connect(pg_url)
    try:
        cid = store.get_or_create_catalog(engine, "bulk", source="x.csv", address_column="address", id_column="id")
        tricky = ['含,逗号', '含"引号"', "含\n换行", "\\N", "", "emoji 🏠", "tab\there"]
        rows = [{"key": f"k{i}", "source_id": None if i % 3 else f"S{i}", "address": f"{tricky[i % len(tricky)]}-{i}",
                 "normalized": f"n{i}", "extra": {"city": "深圳", "n": i} if i % 2 else None, "line": i + 2}
                for i in range(catalogs.COPY_MIN_ROWS + 5)]
        rows.append(dict(rows[0]))  # a key repeated within the chunk: the first wins
        assert store.insert_entries(engine, cid, rows) == (len(rows) - 1, 1)
        ids = store.entry_ids(engine, cid)
        got = store.get_entries(engine, ids.tolist())
        by_key = {e["address"]: e for e in got.values()}
        for row in rows[:-1]:
            entry = by_key[row["address"]]
            assert (entry["source_id"], entry["extra"], entry["normalized"]) == (row["source_id"], row["extra"], row["normalized"])
        order = sorted(got.values(), key=lambda e: e["id"])
        assert [e["address"] for e in order] == [r["address"] for r in rows[:-1]]
        assert store.insert_entries(engine, cid, rows) == (0, len(rows))
    finally:
        engine.dispose()
