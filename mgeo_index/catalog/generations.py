"""Index generations: write a complete new set of index files beside the current one, then move the
catalog's pointer in one database transaction; readers follow the pointer; ``gc`` drops old ones;
``check`` (:mod:`mgeo_index.catalog.consistency`) verifies that store and index agree and ``repair`` rebuilds what
the store can rebuild; ``index.json`` is :mod:`mgeo_index.catalog.index_json`'s, which files are a build's own
:mod:`mgeo_index.catalog.ownership`'s.

A generation is immutable: its FAISS file (``index-<build>.faiss``; or its Milvus collection, see
:mod:`mgeo_index.index.vector_store`), its character n-gram file (``sparse-<build>.npz``), their SHA-256
checksums, the SHA-256 of its sorted entry ids, its model fingerprint and factory, recorded in table
``generations``.  ``catalogs.current_generation_id`` is
the pointer (see :func:`store.switch_generation`).  ``index.json`` in the index directory names the
catalog and mirrors the current generation for people and old readers; the database is authoritative.

A writer (build, add, remove, repair, gc) holds the directory's writer lock (:mod:`locking`), changes
rows in the store (committed: an interruption keeps them, and the pointer still names a generation
whose entries all exist — removed or replaced entries are only *retired*), then calls :func:`publish`,
which derives the new generation from the current one: vectors of retired entries are dropped, live
entries without a vector are embedded, nothing else is re-embedded.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mgeo_index import files, store
from mgeo_index.index import faiss_index, sparse as sparse_index, vector_store
from mgeo_index.catalog.crashpoints import crashpoint
from mgeo_index.catalog.index_json import DESCRIPTOR, descriptor_of, read_descriptor
from mgeo_index.catalog.ownership import own_files

KEEP_GENERATIONS = 2  # after each write: the new generation and the one before it
# Changes touching at most this share of the entries update the n-gram index (known n-grams keep their
# idf); larger ones rebuild it, recomputing every weight.
SPARSE_UPDATE_SHARE = 0.2
Progress = Callable[[str, int, int | None], None]


# --------------------------------------------------------------------------- checksums


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ids_sha256(ids: np.ndarray) -> str:
    return hashlib.sha256(np.sort(np.asarray(ids, dtype="<i8")).tobytes()).hexdigest()


# --------------------------------------------------------------------------- publish


@dataclass
class Published:
    generation_id: int
    index_file: str
    sparse_file: str
    entries_total: int
    vectors_total: int
    vectors_added: int
    vectors_removed: int
    seconds: dict[str, float] = field(default_factory=dict)
    structure: str = ""  # the FAISS structure behind the factory ("auto" → "IVF4096,SQ8")
    tuning: dict[str, Any] = field(default_factory=dict)  # faiss_index.tune_nprobe's choice, for a new auto IVF
    where: str = ""  # the FAISS file, or the vector store and collection (for people)


def _base_index(index_dir: Path, current: dict | None, descriptor: dict | None, fingerprint: str, factory: str):
    """The current FAISS index when the new generation can be derived from it (same model and factory,
    file intact), else None (everything is embedded again)."""
    if current is not None:
        # "auto" keeps whatever structure the catalog has (it chooses only for a new index)
        if current["model_fingerprint"] != fingerprint or factory not in (current["index_factory"], faiss_index.AUTO):
            return None
        if current.get("vector_store"):  # the vectors are in another store (a build moving the catalog to FAISS files)
            return None
        path = index_dir / current["index_file"]
        if not path.is_file() or sha256_file(path) != current["checksums"].get(current["index_file"]):
            return None
        return faiss_index.load(path)
    if descriptor and descriptor.get("index_file"):  # an index written before generations existed
        same = (descriptor.get("model_fingerprint"), descriptor.get("index_factory")) == (fingerprint, factory)
        path = index_dir / descriptor["index_file"]
        return faiss_index.load(path) if same and path.is_file() else None
    return None


def _base_sparse(index_dir: Path, current: dict | None):
    """The current n-gram index when it is intact (updated in place of a full rebuild for small changes)."""
    if current is None or not current.get("sparse_file"):
        return None
    path = index_dir / current["sparse_file"]
    if not path.is_file() or sha256_file(path) != current["checksums"].get(current["sparse_file"]):
        return None
    return sparse_index.load(path)


def _draft(index_dir: Path, location: vector_store.Location | None, *, catalog: str, build_id: int,
           current: dict | None, descriptor: dict | None, bi, factory: str, n_live: int, device: str,
           from_scratch: bool):
    """The next generation's vectors, started from the current generation's when they can be reused (same
    store, model and factory, intact), else empty (everything is embedded again)."""
    if location is None:
        base = None if from_scratch else _base_index(index_dir, current, descriptor, bi.fingerprint, factory)
        return vector_store.FaissDraft(index_dir, build_id, base, dim=bi.dim, factory=factory, n_live=n_live, device=device)
    reusable = (not from_scratch and current is not None and current.get("vector_store") == location.url
                and current["model_fingerprint"] == bi.fingerprint and factory in (current["index_factory"], faiss_index.AUTO))
    draft = vector_store.MilvusDraft(location, catalog, build_id, current["index_file"] if reusable else None,
                                     dim=bi.dim, factory=factory, n_live=n_live)
    try:
        if draft.reused and ids_sha256(draft.ids()) != current["ids_sha256"]:
            draft.forget_base()  # the collection was changed behind the store's back: its vectors are not trusted
    except BaseException:
        draft.close()
        raise
    return draft


def publish(
    engine, index_dir: Path, *, catalog: str, catalog_id: int, build_id: int, bi, factory: str, device: str,
    db_url: str, kind: str, build_fields: dict[str, Any] | None = None, on_progress: Progress | None = None,
    chunk_size: int = 5000, from_scratch: bool = False, vector_store_url: str | None = None, runner=None, encode=None,
) -> Published:
    """Write the generation matching the store's live entries beside the current one and switch to it.

    The caller holds the writer lock and has committed its row changes.  Derived from the current
    generation: retired entries' vectors are removed, live entries without one are embedded.
    ``vector_store_url``: where the new generation's vectors go (:mod:`vector_store`; ``faiss`` for files in
    the index directory); None keeps the current generation's store (``index.json``'s before the first).
    ``runner``: where they are embedded, chunk by chunk (:mod:`mgeo_index.compute`; default: this process on
    ``device``), with ``encode`` (:func:`mgeo_index.catalog.build_tasks.encode_task`; default: ``bi`` as it is set
    up); everything else stays here, in this order.
    """
    import time

    from mgeo_index.catalog.build_tasks import encode_task
    from mgeo_index.compute.local import LocalRunner

    progress = on_progress or (lambda *_: None)
    runner = runner or LocalRunner(device)
    encode = encode or encode_task(runner, bi, None, chunk_size)
    timings: dict[str, float] = {}
    crashpoint("stored")
    t0 = time.perf_counter()
    current = store.current_generation(engine, catalog_id)
    try:
        descriptor = read_descriptor(index_dir)
    except FileNotFoundError:
        descriptor = None
    if vector_store_url is None:
        vector_store_url = current.get("vector_store") if current is not None else (descriptor or {}).get("vector_store")
    location = vector_store.parse(vector_store_url, index_dir)
    live = store.entry_ids(engine, catalog_id)
    draft = _draft(index_dir, location, catalog=catalog, build_id=build_id, current=current, descriptor=descriptor,
                   bi=bi, factory=factory, n_live=len(live), device=device, from_scratch=from_scratch)
    try:
        base_sparse = _base_sparse(index_dir, current) if draft.reused else None
        present = draft.ids()
        removed = np.setdiff1d(present, live)
        missing = np.setdiff1d(live, present)
        draft.remove(removed)
        timings["load"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        ids, new_texts, tuning = _embed(engine, catalog_id, missing, draft, bi.dim, runner, encode, chunk_size, progress)
        timings["encode"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        sparse = _sparse(engine, catalog_id, base_sparse, removed, missing, live, new_texts, ids)
        timings["sparse"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        written = draft.write()  # the FAISS file, or the collection (flushed, indexed, loaded)
        sparse_file = f"sparse-{build_id}.npz"
        sparse_index.save_atomic(sparse, index_dir / sparse_file)
        checksums = {path.name: sha256_file(path) for path in (written.path, index_dir / sparse_file) if path is not None}
        crashpoint("switch")
        generation_id = store.switch_generation(
            engine, catalog_id, expected=None if current is None else current["id"], build_id=build_id,
            build_fields={"index_path": written.where, "entries_total": len(live),
                          "vectors_total": written.ntotal, **(build_fields or {})},
            kind=kind, index_file=written.name, sparse_file=sparse_file, index_factory=factory, dim=bi.dim,
            ntotal=written.ntotal, ids_sha256=ids_sha256(written.ids), checksums=checksums,
            model_fingerprint=bi.fingerprint, model_path=bi.path, vector_store=None if location is None else location.url,
            plan=str(encode.plan) if encode.plan is not None else None,
        )
        files.write_json_atomic(index_dir / DESCRIPTOR, descriptor_of(store.current_generation(engine, catalog_id), catalog, db_url))
        draft.point(catalog)  # Milvus: the alias follows the store's pointer (a kill before it: check reports, gc realigns)
        collect(engine, index_dir, catalog_id, keep=KEEP_GENERATIONS)
    finally:
        draft.close()
    timings["save"] = time.perf_counter() - t0
    return Published(generation_id, written.name, sparse_file, len(live), written.ntotal, int(missing.size),
                     int(removed.size), timings, written.structure, tuning, written.where)


def _embed(engine, catalog_id: int, missing: np.ndarray, draft, dim: int, runner, encode, chunk_size: int,
           progress: Progress) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """The ``missing`` entries embedded on ``runner`` chunk by chunk and added to ``draft``: (their ids, their
    normalized texts, in that order; what the draft's tuning found)."""
    progress("encode", 0, len(missing))
    # filled in place (no list of parts to concatenate: one copy of the vectors, not two, at the peak)
    vectors, ids, done, new_texts = np.empty((len(missing), dim), np.float32), np.empty(len(missing), np.int64), 0, []
    batches = store.iter_entries(engine, catalog_id, ids=missing.tolist(), batch_size=max(chunk_size, 1))
    for batch, embedded in runner.map(batches, encode):
        new_texts += [e["normalized"] for e in batch]
        vectors[done : done + len(batch)] = embedded
        ids[done : done + len(batch)] = [e["id"] for e in batch]
        done += len(batch)
        progress("encode", len(batch), len(missing))
        crashpoint("embedding")
    tuning = draft.add(vectors[:done], ids[:done]) if done else {}
    return ids[:done], new_texts, tuning  # the vectors go: the index holds its own copy


def _sparse(engine, catalog_id: int, base_sparse, removed: np.ndarray, missing: np.ndarray, live: np.ndarray,
            new_texts: list[str], new_ids: np.ndarray):
    """The next generation's n-gram index: the current one updated for a small change, else built anew (from the
    texts in hand when every live entry was just embedded, else from the store)."""
    if base_sparse is not None and missing.size + removed.size <= SPARSE_UPDATE_SHARE * max(live.size, 1):
        return sparse_index.update_sparse(base_sparse, removed, new_texts, missing)
    if new_ids.size == live.size:  # every live entry was just embedded (a first build): its texts are in hand, in id order
        return sparse_index.build_sparse(new_texts, new_ids.tolist())
    texts, text_ids = [], []  # a large change: every n-gram weight recomputed over all entries
    for batch in store.iter_entries(engine, catalog_id, batch_size=20000):
        texts += [e["normalized"] for e in batch]
        text_ids += [e["id"] for e in batch]
    return sparse_index.build_sparse(texts, text_ids)


# --------------------------------------------------------------------------- gc


@dataclass
class Collected:
    generations_kept: list[int]
    generations_removed: list[int]
    files_removed: list[str]
    entries_purged: int
    collections_removed: list[str] = field(default_factory=list)  # Milvus collections of no kept generation


def catalog_name(engine, catalog_id: int) -> str:
    with store.Session(engine) as session:
        return session.get(store.Catalog, catalog_id).name


def generation_ids(index_dir: Path, generation: dict) -> np.ndarray:
    """Entry ids a generation can return (read from its n-gram file, else its FAISS file or collection)."""
    sparse_path = index_dir / (generation.get("sparse_file") or "")
    if generation.get("sparse_file") and sparse_path.is_file():
        with np.load(sparse_path, allow_pickle=False) as z:
            return z["ids"]
    location = vector_store.location_of(generation, index_dir)
    if location is not None:
        with vector_store.session(location) as client:
            if client.has_collection(generation["index_file"]):
                return vector_store.collection_ids(client, generation["index_file"])
        return np.empty(0, np.int64)
    faiss_path = index_dir / generation["index_file"]
    return faiss_index.index_ids(faiss_index.load(faiss_path)) if faiss_path.is_file() else np.empty(0, np.int64)


def collect(engine, index_dir: Path, catalog_id: int, keep: int = KEEP_GENERATIONS) -> Collected:
    """Keep the current generation and the newest others up to ``keep`` in all; delete the rest: their
    rows, their files, stray files of interrupted writes, and retired entries no kept generation returns.
    The caller holds the writer lock."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (the current generation), got {keep}")
    generations = store.list_generations(engine, catalog_id)  # newest first
    current = store.current_generation(engine, catalog_id)
    kept = ([current] if current else []) + [g for g in generations if not current or g["id"] != current["id"]]
    kept, dropped = kept[:keep], kept[keep:]
    if dropped:
        store.delete_generations(engine, [g["id"] for g in dropped])
    referenced = {g[k] for g in kept for k in ("index_file", "sparse_file") if g.get(k)}
    if not generations:  # a directory written before generations existed: keep what index.json names
        try:
            descriptor = read_descriptor(index_dir)
            referenced |= {descriptor[k] for k in ("index_file", "sparse_file") if descriptor.get(k)}
        except FileNotFoundError:
            pass
    removed_files = []
    # only files this catalog's builds wrote (never a user's index-backup.faiss, nor another catalog's files)
    for path in own_files(index_dir, {b["id"] for b in store.list_builds(engine, catalog_id)}):
        if path.name not in referenced:
            path.unlink()
            removed_files.append(path.name)
    collections = _collect_collections(engine, index_dir, catalog_id, generations, current, kept)
    keep_ids = np.concatenate([generation_ids(index_dir, g) for g in kept]) if kept else np.empty(0, np.int64)
    purged = store.purge_retired(engine, catalog_id, keep_ids)
    return Collected([g["id"] for g in kept], [g["id"] for g in dropped], removed_files, purged, collections)


def _collect_collections(engine, index_dir: Path, catalog_id: int, generations: list[dict], current: dict | None,
                         kept: list[dict]) -> list[str]:
    """In every Milvus store a generation of the catalog (or ``index.json``) names: point the alias at the
    current generation's collection (it may lag behind a write killed after its switch), then drop the
    catalog's collections no kept generation references (collected generations, writes killed before their
    switch)."""
    locations = {vector_store.location_of(g, index_dir) for g in generations} - {None}
    try:
        locations.add(vector_store.parse(read_descriptor(index_dir).get("vector_store"), index_dir))
    except (FileNotFoundError, ValueError):
        pass
    locations.discard(None)
    if not locations:
        return []
    catalog = catalog_name(engine, catalog_id)
    current_location = vector_store.location_of(current, index_dir)
    referenced = {g["index_file"] for g in kept if g.get("vector_store")}
    removed = []
    for location in sorted(locations, key=lambda loc: loc.url):
        with vector_store.session(location) as client:
            stale = [name for name in vector_store.ours(client, catalog) if name not in referenced]
            if location == current_location:
                if vector_store.alias_target(client, catalog) != current["index_file"]:
                    vector_store.point_alias(client, catalog, current["index_file"])
            elif vector_store.alias_target(client, catalog) in stale:  # the catalog moved to another store
                client.drop_alias(vector_store.alias_name(catalog))  # a server refuses to drop an aliased collection
            removed += vector_store.drop_collections(client, stale)
    return removed
