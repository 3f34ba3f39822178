"""Index generations: write a complete new set of index files beside the current one, then move the
catalog's pointer in one database transaction; readers follow the pointer; ``gc`` drops old ones;
``check`` verifies that store and index agree and ``repair`` rebuilds what the store can rebuild.

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
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mgeo_index import files, settings, store
from mgeo_index.index import faiss_index, sparse as sparse_index, vector_store
from mgeo_index.catalog.crashpoints import crashpoint
from mgeo_index.runtime.plan import plan

DESCRIPTOR = "index.json"
KEEP_GENERATIONS = 2  # after each write: the new generation and the one before it
# Changes touching at most this share of the entries update the n-gram index (known n-grams keep their
# idf); larger ones rebuild it, recomputing every weight.
SPARSE_UPDATE_SHARE = 0.2
Progress = Callable[[str, int, int | None], None]


# --------------------------------------------------------------------------- index.json


def read_descriptor(index_dir: str | Path) -> dict:
    """``index.json``: which catalog (and database) this directory serves, plus the mirrored generation."""
    path = Path(index_dir) / DESCRIPTOR
    if not path.exists():
        raise FileNotFoundError(
            f"{index_dir} holds no index (no {DESCRIPTOR}); create one with `mgeo-index build CATALOG --index-dir {index_dir}`."
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise FileNotFoundError(f"{path} is not valid JSON ({exc}); `mgeo-index check --repair --index-dir {index_dir}` rewrites it.") from None


def ensure_descriptor(index_dir: Path, catalog: str, db_url: str, vector_store_url: str | None = None) -> None:
    """Write ``index.json`` naming the catalog (and a vector store other than FAISS files) before the first
    generation exists."""
    path = index_dir / DESCRIPTOR
    if not path.exists():
        vectors = vector_store.recorded(vector_store_url)
        files.write_json_atomic(path, {"catalog": catalog, "database": redact(db_url),
                                       **({"vector_store": vectors} if vectors else {})})


class NotAnIndexDirectory(ValueError):
    """A build asked to write into a directory that holds someone else's files."""


# What mgeo-index writes into an index directory besides index.json: the SQLite store (and its WAL files), the
# writer lock, the build's rejected rows, each generation's files and the temporary files of atomic writes.
_OWN_FIXED = {".writer.lock", "rejects.tsv"}
_OWN_FILE = re.compile(r"(?:index|sparse)-(\d+)\.(?:faiss|npz)")
_OWN_TEMP = re.compile(r"\.(?:(?:index|sparse)-(\d+)\.(?:faiss|npz)|index\.json)\.[^/]+\.tmp")


def check_writable_here(index_dir: Path, force: bool = False) -> None:
    """Refuse to build into a directory mgeo-index did not make: one that holds files and no ``index.json`` of
    ours (a JSON object naming a catalog), unless ``force``; and, even with ``force``, one whose files bear the names
    a build writes (``index.json``, ``rejects.tsv``, ``index-1.faiss`` …): a file this catalog's builds did not write
    is never replaced or deleted, whatever its name. A directory holding only what an interrupted first build left
    (the store, the lock) is ours."""
    if not index_dir.is_dir():
        return
    names = sorted(p.name for p in index_dir.iterdir())
    descriptor = index_dir / DESCRIPTOR
    if descriptor.is_file():
        try:
            ours = isinstance(mine := json.loads(descriptor.read_text(encoding="utf-8")), dict) and "catalog" in mine
        except (ValueError, UnicodeDecodeError):
            ours = False
        if ours:
            return
    from mgeo_index.settings import DB_FILENAME

    def shown(found: list[str]) -> str:
        return ", ".join(found[:5]) + (" …" if len(found) > 5 else "")

    clashing = [n for n in names if n in _OWN_FIXED - {".writer.lock"} or n == DESCRIPTOR or _OWN_FILE.fullmatch(n)
                or _OWN_TEMP.fullmatch(n)]
    if clashing:
        raise NotAnIndexDirectory(
            f"--index-dir {index_dir} holds files mgeo-index did not write under the names a build writes "
            f"({shown(clashing)}); a build never writes over them (--force neither): move those, or build into a new "
            "or empty directory")
    foreign = [n for n in names if n != ".writer.lock" and not n.startswith(DB_FILENAME)]
    if foreign and not force:
        raise NotAnIndexDirectory(
            f"--index-dir {index_dir} holds files mgeo-index did not write ({shown(foreign)}); build into a new or "
            "empty directory, or pass --force to write the index there anyway (index.json, mgeo.db, rejects.tsv and "
            "the index files are then written beside them; nothing else is touched)")


def own_files(index_dir: Path, build_ids: set[int]) -> list[Path]:
    """The files in ``index_dir`` that builds ``build_ids`` wrote (their generations' files and unfinished
    temporary files) or that an atomic ``index.json`` write left: what clean-up may delete, and nothing else."""
    out = []
    for path in sorted(index_dir.iterdir()):
        m = _OWN_FILE.fullmatch(path.name) or _OWN_TEMP.fullmatch(path.name)
        if m and path.is_file() and (m.group(1) is None or int(m.group(1)) in build_ids):
            out.append(path)
    return out


class ServedElsewhere(ValueError):
    """The catalog's current generation lives in another index directory (a shared database)."""


def ensure_served_here(index_dir: Path, catalog: str, generation: dict | None) -> None:
    """Refuse to write catalog ``catalog`` from ``index_dir`` when its current ``generation`` (the database's
    pointer) has no files in it: the catalog is served from another index directory sharing this database,
    and a write from here would move its readers' pointer to files they cannot see. (A generation whose
    vectors are in a vector store keeps its n-gram file in the directory that wrote it.)"""
    if generation is None:
        return
    local = generation["sparse_file"] if generation.get("vector_store") else generation["index_file"]
    if local and (Path(index_dir) / local).exists():
        return
    raise ServedElsewhere(
        f"catalog {catalog!r} in this database is served from another index directory: its current generation "
        f"({local}) is not in {index_dir}. Write it from that directory, or give this one a "
        f"catalog of its own (--catalog NAME); if this is that directory and its files were lost, run "
        f"`mgeo-index check --repair --index-dir {index_dir}`"
    )


def redact(url: str) -> str:
    """Database URL without its password."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def descriptor_of(generation: dict, catalog: str, db_url: str) -> dict:
    """What readers need of a generation (and what ``index.json`` mirrors)."""
    return {
        "catalog": catalog,
        "generation_id": generation["id"],
        "build_id": generation["build_id"],
        "index_file": generation["index_file"],
        "sparse_file": generation["sparse_file"],
        "index_factory": generation["index_factory"],
        "dim": generation["dim"],
        "ntotal": generation["ntotal"],
        "model_fingerprint": generation["model_fingerprint"],
        "model_path": generation["model_path"],
        "database": redact(db_url),
        **({"vector_store": generation["vector_store"]} if generation.get("vector_store") else {}),
        **({"plan": generation["plan"]} if generation.get("plan") else {}),
    }


def current_descriptor(index_dir: str | Path, engine, db_url: str) -> dict:
    """The generation readers must use now, from the database pointer.

    An index directory written before generations existed (no pointer yet) is read from ``index.json``.
    """
    descriptor = read_descriptor(index_dir)
    catalog_id = store.catalog_id(engine, descriptor["catalog"])
    generation = store.current_generation(engine, catalog_id) if catalog_id is not None else None
    if generation is not None:
        return descriptor_of(generation, descriptor["catalog"], db_url)
    if descriptor.get("index_file"):
        return descriptor
    raise FileNotFoundError(
        f"{index_dir} has no complete index generation yet (an earlier build was interrupted); "
        f"re-run the build to finish it."
    )


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
        progress("encode", 0, len(missing))
        # filled in place (no list of parts to concatenate: one copy of the vectors, not two, at the peak)
        vectors, ids, done, new_texts = np.empty((len(missing), bi.dim), np.float32), np.empty(len(missing), np.int64), 0, []
        batches = store.iter_entries(engine, catalog_id, ids=missing.tolist(), batch_size=max(chunk_size, 1))
        for batch, embedded in runner.map(batches, encode):
            new_texts += [e["normalized"] for e in batch]
            vectors[done : done + len(batch)] = embedded
            ids[done : done + len(batch)] = [e["id"] for e in batch]
            done += len(batch)
            progress("encode", len(batch), len(missing))
            crashpoint("embedding")
        tuning: dict[str, Any] = {}
        if done:
            tuning = draft.add(vectors[:done], ids[:done])
        del vectors  # the index holds its own copy
        timings["encode"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        if base_sparse is not None and missing.size + removed.size <= SPARSE_UPDATE_SHARE * max(live.size, 1):
            sparse = sparse_index.update_sparse(base_sparse, removed, new_texts, missing)
        elif done == live.size:  # every live entry was just embedded (a first build): its texts are in hand, in id order
            sparse = sparse_index.build_sparse(new_texts, ids[:done].tolist())
        else:  # a large change: every n-gram weight recomputed over all entries
            texts, text_ids = [], []
            for batch in store.iter_entries(engine, catalog_id, batch_size=20000):
                texts += [e["normalized"] for e in batch]
                text_ids += [e["id"] for e in batch]
            sparse = sparse_index.build_sparse(texts, text_ids)
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


# --------------------------------------------------------------------------- gc


@dataclass
class Collected:
    generations_kept: list[int]
    generations_removed: list[int]
    files_removed: list[str]
    entries_purged: int
    collections_removed: list[str] = field(default_factory=list)  # Milvus collections of no kept generation


def _catalog_name(engine, catalog_id: int) -> str:
    with store.Session(engine) as session:
        return session.get(store.Catalog, catalog_id).name


def _generation_ids(index_dir: Path, generation: dict) -> np.ndarray:
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
    keep_ids = np.concatenate([_generation_ids(index_dir, g) for g in kept]) if kept else np.empty(0, np.int64)
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
    catalog = _catalog_name(engine, catalog_id)
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


# --------------------------------------------------------------------------- check


@dataclass
class Report:
    catalog: str | None = None
    generation_id: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # harmless: files gc removes, entries it purges
    rebuild: bool = False  # the current generation's files cannot be reused: a repair embeds everything again
    realign: bool = False  # the Milvus alias names another collection than the current generation's

    @property
    def clean(self) -> bool:
        return not self.problems


def _sample(ids, n: int = 5) -> str:
    ids = [int(i) for i in list(ids)[:n]]
    return ", ".join(map(str, ids)) + (", …" if len(ids) == n else "")


def check(index_dir: str | Path, engine, db_url: str) -> Report:
    """Verify that the current generation is intact and agrees with the store; list exactly what is wrong."""
    from mgeo_index.model.manifest import fingerprint

    index_dir = Path(index_dir)
    report = Report()
    try:
        descriptor = read_descriptor(index_dir)
    except FileNotFoundError as exc:
        report.problems.append(str(exc))
        return report
    report.catalog = descriptor.get("catalog")
    catalog_id = store.catalog_id(engine, report.catalog or "")
    if catalog_id is None:
        report.problems.append(f"catalog {report.catalog!r} named by {DESCRIPTOR} is not in the store {redact(db_url)}")
        return report
    generation = store.current_generation(engine, catalog_id)
    live = store.entry_ids(engine, catalog_id)
    report.facts["live entries in store"] = int(live.size)
    if generation is None:
        report.problems.append("the catalog has no current index generation (never built, or every build was interrupted)")
        return report
    report.generation_id = generation["id"]
    location = vector_store.location_of(generation, index_dir)
    report.facts.update({"generation": generation["id"]} | (
        {"index file": generation["index_file"]} if location is None else
        {"vector store": location.url, "collection": generation["index_file"]}
    ) | {"model": generation["model_fingerprint"], "factory": generation["index_factory"],
         "plan (vectors)": generation.get("plan") or "not recorded (built before plans were)",
         "plan (queries here)": str(plan(None, None))}
      | settings.answer_settings(store.catalog_numbers(engine, report.catalog), store.catalog_profile(engine, report.catalog)))
    mirrored = {k: descriptor.get(k) for k in ("generation_id", "index_file", "sparse_file")}
    if mirrored != {"generation_id": generation["id"], "index_file": generation["index_file"], "sparse_file": generation["sparse_file"]}:
        report.problems.append(f"{DESCRIPTOR} does not mirror the current generation {generation['id']} (it says {mirrored})")

    files_ok = True
    for name in (generation["index_file"], generation["sparse_file"]) if location is None else (generation["sparse_file"],):
        path = index_dir / name
        if not path.is_file():
            report.problems.append(f"file {name} of generation {generation['id']} is missing")
            files_ok = False
        elif sha256_file(path) != generation["checksums"].get(name):
            report.problems.append(f"file {name} does not match its recorded SHA-256 (corrupted or replaced)")
            files_ok = False
    held = None  # (ids, dim) of the current generation's vectors, when they can be read
    if location is None:
        if files_ok:
            index = faiss_index.load(index_dir / generation["index_file"])
            held, what, what_ids = (faiss_index.index_ids(index), index.d), "FAISS index", "FAISS ids"
    else:
        held, what = _check_collection(location, generation, report, engine, catalog_id), f"collection {generation['index_file']}"
        what_ids = f"{what} ids"
        files_ok = files_ok and held is not None
    report.rebuild = not files_ok
    if files_ok:
        faiss_ids, dim = held
        sparse_ids = _generation_ids(index_dir, generation)
        report.facts["vectors in index"] = int(faiss_ids.size)
        if int(faiss_ids.size) != generation["ntotal"] or dim != generation["dim"]:
            report.problems.append(f"{what} holds {faiss_ids.size} vectors of dim {dim}; "
                                   f"recorded {generation['ntotal']} of dim {generation['dim']}")
            report.rebuild = True
        if ids_sha256(faiss_ids) != generation["ids_sha256"]:
            report.problems.append(f"{what_ids} do not match the recorded ids checksum")
            report.rebuild = True
        if np.unique(faiss_ids).size != faiss_ids.size:
            report.problems.append(f"{what} holds duplicate ids")
            report.rebuild = True
        if not np.array_equal(np.sort(sparse_ids), np.sort(faiss_ids)):
            report.problems.append(f"n-gram index and {what} hold different ids "
                                   f"({sparse_ids.size} vs {faiss_ids.size})")
            report.rebuild = True
        unindexed = np.setdiff1d(live, faiss_ids)
        stale = np.setdiff1d(faiss_ids, live)
        if unindexed.size:
            report.problems.append(f"{unindexed.size} live entries of the store have no vector in the index "
                                   f"(entry ids {_sample(unindexed)}; an interrupted write: re-run it, or --repair)")
        if stale.size:
            gone = np.setdiff1d(stale, np.fromiter(store.get_entries(engine, stale.tolist()), dtype=np.int64))
            retired = np.setdiff1d(stale, gone)
            if retired.size:
                report.problems.append(f"{retired.size} entries removed or replaced in the store are still indexed "
                                       f"(entry ids {_sample(retired)}; re-run the update, or --repair)")
            if gone.size:
                report.problems.append(f"{gone.size} indexed ids do not exist in the store at all "
                                       f"(entry ids {_sample(gone)}); --repair rebuilds the index from the store")
                report.rebuild = True
    model_path = generation.get("model_path")
    if model_path and Path(model_path).is_dir():
        now = fingerprint(Path(model_path))
        if now != generation["model_fingerprint"]:
            report.problems.append(f"the model at {model_path} is now {now}, but the index was built with "
                                   f"{generation['model_fingerprint']}; --repair re-embeds with it")
    elif model_path:
        report.notes.append(f"the model that built the index ({model_path}) is not on this machine; queries need --model")
    referenced = {g[k] for g in store.list_generations(engine, catalog_id) for k in ("index_file", "sparse_file") if g.get(k)}
    strays = [p.name for p in own_files(index_dir, {b["id"] for b in store.list_builds(engine, catalog_id)})
              if p.name not in referenced]
    if strays:
        report.notes.append(f"{len(strays)} files of no generation (interrupted writes; `mgeo-index gc` removes them): "
                            + ", ".join(strays[:5]))
    clash = faiss_index.faiss_clash(faiss_index.faiss_builds())
    if clash:
        report.notes.append(clash)
    return report


def _check_collection(location: vector_store.Location, generation: dict, report: Report, engine,
                      catalog_id: int) -> tuple[np.ndarray, int] | None:
    """(ids, dim) of the current generation's collection, or None (a problem said why); reports an alias
    naming another collection (``report.realign``) and notes collections of no generation."""
    name, catalog = generation["index_file"], report.catalog or ""
    try:
        client = vector_store.connect(location)
    except (vector_store.Unavailable, ImportError) as exc:
        report.problems.append(str(exc))
        return None
    try:
        held = None
        if not client.has_collection(name):
            report.problems.append(f"collection {name} of generation {generation['id']} is missing from {location.url}")
        else:
            held = vector_store.collection_ids(client, name), vector_store.collection_dim(client, name)
        target = vector_store.alias_target(client, catalog)
        if target != name:
            report.problems.append(f"alias {vector_store.alias_name(catalog)} names {target or 'no collection'}, not the "
                                   f"current generation's collection {name} (a write killed after its switch; "
                                   f"`check --repair` or `gc` realigns it)")
            report.realign = True
        recorded = {g["index_file"] for g in store.list_generations(engine, catalog_id) if g.get("vector_store")}
        strays = [c for c in vector_store.ours(client, catalog) if c not in recorded]
        if strays:
            report.notes.append(f"{len(strays)} collections of no generation in {location.url} (interrupted writes; "
                                f"`mgeo-index gc` drops them): " + ", ".join(strays[:5]))
        return held
    finally:
        vector_store.release(location)


def realign(engine, index_dir: Path, catalog_id: int) -> None:
    """Point the catalog's Milvus alias at its current generation's collection (the store's pointer decides)."""
    current = store.current_generation(engine, catalog_id)
    location = vector_store.location_of(current, index_dir)
    if location is not None:
        with vector_store.session(location) as client:
            vector_store.point_alias(client, _catalog_name(engine, catalog_id), current["index_file"])


def catalog_state(index_dir, catalog: str | None = None) -> tuple[dict, dict, dict[int, np.ndarray]]:
    """(entries by id, parsed elements by id, vectors by id) of a built catalog: what two engines' builds of the
    same file must agree on (``research/bench_build_ray.py``, the Ray build tests)."""
    index_dir = Path(index_dir)
    engine = store.connect(settings.database_url(index_dir))
    try:
        ids = store.entry_ids(engine, store.catalog_id(engine, catalog or settings.DEFAULT_CATALOG)).tolist()
        entries = store.get_entries(engine, ids)
        elements = {i: (e["elements"], e["admin"], e["parser"]) for i, e in store.get_elements(engine, ids).items()}
    finally:
        engine.dispose()
    index = faiss_index.load(index_dir / read_descriptor(index_dir)["index_file"])
    return entries, elements, {int(i): index.reconstruct(int(i)) for i in faiss_index.index_ids(index)}
