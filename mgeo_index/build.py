"""`mgeo-index build`: catalog file → validated rows in the store → embeddings → FAISS index.

The index directory is one unit: ``index.json`` names the current index file, the model that
built it and the build id. A build writes ``index-<build>.faiss`` aside (atomically) and only
then replaces ``index.json`` (atomically), so a reader never sees half an index and a crash or
Ctrl-C loses nothing: rows already stored stay, and the next run adds only what is missing.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mgeo_index import backends, engine, index as faiss_index, settings, sparse as sparse_index, store
from mgeo_index.catalog import Reject, read_catalog, write_rejects
from mgeo_index.model.bi_encoder import BiEncoder, load_bi_encoder
from mgeo_index.text import normalize

MANIFEST = "index.json"
REJECTS = "rejects.tsv"

# on_progress(stage, advance, total): stage is "read" (advance = rows) or "encode" (advance = entries)
Progress = Callable[[str, int, int | None], None]


@dataclass
class BuildResult:
    build_id: int
    catalog: str
    rows_read: int = 0
    rows_inserted: int = 0
    rows_skipped: int = 0
    rows_rejected: int = 0
    entries_total: int = 0
    vectors_total: int = 0
    vectors_added: int = 0
    index_factory: str = ""
    index_path: str = ""
    rejects_path: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, ensure_ascii=False, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_manifest(index_dir: str | Path) -> dict:
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"{index_dir} holds no index (no {MANIFEST}); create one with `mgeo-index build CATALOG --index-dir {index_dir}`."
        )
    return json.loads(path.read_text())


def _store_chunk(engine_, catalog_id: int, rows, result: BuildResult, rejects: list[Reject]) -> None:
    records = []
    for row in rows:
        normalized = normalize(row.address)
        if not normalized:
            rejects.append(Reject(row.line, "address has no letters or digits left after normalization", row.address))
            continue
        records.append(
            {
                "key": row.source_id if row.source_id is not None else normalized,
                "source_id": row.source_id,
                "address": row.address,
                "normalized": normalized,
                "extra": row.extra,
                "line": row.line,
            }
        )
    inserted, skipped = store.insert_entries(engine_, catalog_id, records)
    result.rows_inserted += inserted
    result.rows_skipped += skipped


def _reusable_index(index_dir: Path, catalog: str, fingerprint: str, factory: str):
    """The current index of this directory when it can be extended (same catalog, model, factory)."""
    try:
        manifest = read_manifest(index_dir)
    except FileNotFoundError:
        return None
    same = (manifest.get("catalog"), manifest.get("model_fingerprint"), manifest.get("index_factory")) == (
        catalog,
        fingerprint,
        factory,
    )
    path = index_dir / manifest.get("index_file", "")
    return faiss_index.load(path) if same and path.is_file() else None


def build(
    catalog_path: str | Path,
    index_dir: str | Path,
    *,
    db: str | None = None,
    catalog: str = settings.DEFAULT_CATALOG,
    address_column: str | None = None,
    id_column: str | None = None,
    factory: str = settings.DEFAULT_INDEX_FACTORY,
    model: BiEncoder | str | Path | None = None,
    device: str | None = None,
    backend: str | None = None,
    chunk_size: int = 5000,
    on_progress: Progress | None = None,
) -> BuildResult:
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    progress = on_progress or (lambda *_: None)
    timings: dict[str, float] = {}
    started = time.perf_counter()

    bi = model if isinstance(model, BiEncoder) else load_bi_encoder(settings.bi_model_path(model))
    device = settings.device(device)
    bi.to(device)
    if backend is not None or getattr(bi, "backend", None) is None:  # a model passed in keeps its backend
        backends.apply(bi, backend, device=device)
    faiss_index.make_index(bi.dim, factory)  # validate the factory string before touching the store
    reader = read_catalog(
        catalog_path, address_column=address_column, id_column=id_column, max_chars=bi.max_length - 2, chunk_size=chunk_size
    )
    engine_ = store.connect(settings.database_url(index_dir, db))
    catalog_id = store.get_or_create_catalog(
        engine_, catalog, source=str(Path(catalog_path).resolve()), address_column=reader.address_column, id_column=reader.id_column
    )
    build_id = store.start_build(engine_, catalog_id, model_fingerprint=bi.fingerprint, index_factory=factory)
    result = BuildResult(build_id=build_id, catalog=catalog, index_factory=factory)
    rejects_path = index_dir / REJECTS
    rejects_path.unlink(missing_ok=True)
    try:
        # 1. rows → store (chunked: memory does not grow with the file)
        for rows, rejects in reader.chunks():
            rejects = list(rejects)
            _store_chunk(engine_, catalog_id, rows, result, rejects)
            result.rows_read += len(rows) + len(rejects)
            if rejects:
                result.rows_rejected += write_rejects(rejects_path, rejects)
            progress("read", len(rows) + len(rejects), None)
        timings["store"] = time.perf_counter() - started

        # 2. entries without a vector → embeddings → index
        t0 = time.perf_counter()
        index = _reusable_index(index_dir, catalog, bi.fingerprint, factory)
        if index is None:
            index = faiss_index.make_index(bi.dim, factory)
        if device.startswith("cuda"):
            index = faiss_index.to_gpu(index)  # no-op without a FAISS GPU build; saved back on the CPU
        all_ids = store.entry_ids(engine_, catalog_id)
        missing = np.setdiff1d(all_ids, faiss_index.index_ids(index), assume_unique=True)
        progress("encode", 0, len(missing))
        # filled in place (no list of parts to concatenate: one copy of the vectors, not two, at the peak)
        vectors, ids, done = np.empty((len(missing), bi.dim), dtype=np.float32), np.empty(len(missing), np.int64), 0
        for batch in store.iter_entries(engine_, catalog_id, ids=missing.tolist(), batch_size=max(chunk_size, 1)):
            vectors[done : done + len(batch)] = engine.encode(bi, [e["normalized"] for e in batch], device=device,
                                                              on_batch=lambda n: progress("encode", n, len(missing)))
            ids[done : done + len(batch)] = [e["id"] for e in batch]
            done += len(batch)
        if done:
            faiss_index.add(index, vectors[:done], ids[:done])
        del vectors  # the index holds its own copy
        timings["encode"] = time.perf_counter() - t0

        # 3. the character n-gram index for hybrid retrieval, over every entry (cheap: seconds)
        t0 = time.perf_counter()
        texts, text_ids = [], []
        for batch in store.iter_entries(engine_, catalog_id, batch_size=20000):
            texts += [e["normalized"] for e in batch]
            text_ids += [e["id"] for e in batch]
        sparse_file = f"sparse-{build_id}.npz"
        sparse_index.save_atomic(sparse_index.build_sparse(texts, text_ids), index_dir / sparse_file)
        timings["sparse"] = time.perf_counter() - t0

        # 4. write aside, then switch atomically
        t0 = time.perf_counter()
        index_file = f"index-{build_id}.faiss"
        faiss_index.save_atomic(index, index_dir / index_file)
        previous = _previous_files(index_dir)
        write_json_atomic(
            index_dir / MANIFEST,
            {
                "build_id": build_id,
                "catalog": catalog,
                "index_file": index_file,
                "sparse_file": sparse_file,
                "index_factory": factory,
                "dim": bi.dim,
                "ntotal": int(index.ntotal),
                "model_fingerprint": bi.fingerprint,
                "model_path": bi.path,
                "database": _redact(settings.database_url(index_dir, db)),
            },
        )
        for name in previous - {index_file, sparse_file}:
            (index_dir / name).unlink(missing_ok=True)
        timings["save"] = time.perf_counter() - t0
        timings["total"] = time.perf_counter() - started

        result.entries_total = len(all_ids)
        result.vectors_total = int(index.ntotal)
        result.vectors_added = int(len(missing))
        result.index_path = str(index_dir / index_file)
        result.rejects_path = str(rejects_path) if result.rows_rejected else None
        result.seconds = timings
        store.finish_build(
            engine_,
            build_id,
            index_path=result.index_path,
            rows_read=result.rows_read,
            rows_inserted=result.rows_inserted,
            rows_skipped=result.rows_skipped,
            rows_rejected=result.rows_rejected,
            entries_total=result.entries_total,
            vectors_total=result.vectors_total,
            seconds=timings["total"],
            stats={"seconds": timings, "vectors_added": result.vectors_added, "device": device},
        )
        return result
    except BaseException as exc:  # Ctrl-C included: record it, keep what is stored, re-raise
        store.fail_build(engine_, build_id, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        engine_.dispose()


def _previous_files(index_dir: Path) -> set[str]:
    """Files of the generation being replaced (deleted once the new one is switched in)."""
    try:
        manifest = read_manifest(index_dir)
    except FileNotFoundError:
        return set()
    return {manifest[key] for key in ("index_file", "sparse_file") if manifest.get(key)}


def _redact(url: str) -> str:
    """Database URL without its password, for the manifest."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
