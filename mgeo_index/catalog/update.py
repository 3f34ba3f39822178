"""Incremental catalog changes and index maintenance: `add`, `remove`, `gc`, `check [--repair]`.

Each writer takes the index directory's writer lock, commits its row changes, then publishes a new
generation (:mod:`mgeo_index.catalog.generations`) derived from the current one, so only new or changed
entries are embedded.  Every command can be re-run after an interruption and then completes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mgeo_index import settings, store
from mgeo_index.catalog import generations, ownership, index_json, consistency
from mgeo_index.runtime import backends
from mgeo_index.catalog.build import BuildResult, Progress, build
from mgeo_index.catalog.locking import writer_lock
from mgeo_index.model.bi_encoder import BiEncoder
from mgeo_index.model.loading import index_model_path, stored_bi


def _open(index_dir: Path, db: str | None, *, repairing: bool = False):
    """(engine, db_url, catalog name, catalog id, current generation) of an existing index directory;
    refuses a catalog served from another index directory, unless ``repairing`` this one's lost files."""
    descriptor = index_json.read_descriptor(index_dir)
    db_url = settings.database_url(index_dir, db)
    engine = store.connect(db_url)
    try:
        catalog_id = store.catalog_id(engine, descriptor["catalog"])
        if catalog_id is None:
            raise FileNotFoundError(f"catalog {descriptor['catalog']!r} of {index_dir} is not in the store "
                                    f"{index_json.redact(db_url)}; is --db the database it was built with?")
        generation = store.current_generation(engine, catalog_id)
        # a repair rebuilds this directory's lost files; it never takes over a catalog the directory did not serve
        if not repairing or descriptor.get("generation_id") not in {g["id"] for g in store.list_generations(engine, catalog_id)}:
            ownership.ensure_served_here(index_dir, descriptor["catalog"], generation)
    except BaseException:
        engine.dispose()
        raise
    return engine, db_url, descriptor["catalog"], catalog_id, generation


def _model_for(generation: dict | None, model):
    """The model to embed with: the one given (a directory or a loaded :class:`BiEncoder`), else the one
    that built the current generation (when present)."""
    if isinstance(model, BiEncoder):
        return model
    return stored_bi(index_model_path((generation or {}).get("model_path"), model))


def _factory_for(index_dir: Path, generation: dict | None) -> str:
    """The index factory to keep: the current generation's, else what an index directory from before
    generations recorded in ``index.json``, else the default."""
    if generation:
        return generation["index_factory"]
    return index_json.read_descriptor(index_dir).get("index_factory", settings.DEFAULT_INDEX_FACTORY)


def _republish(engine, index_dir: Path, db_url: str, catalog: str, catalog_id: int, generation: dict | None, *,
               model, device: str | None, kind: str, **publish_args) -> generations.Published:
    """A new generation derived from the current one, recorded as a build of ``kind`` (failed if it fails)."""
    device = settings.device(device)
    bi = backends.ensure(_model_for(generation, model).to(device), device=device)  # as build embeds
    factory = _factory_for(index_dir, generation)
    build_id = store.start_build(engine, catalog_id, model_fingerprint=bi.fingerprint, index_factory=factory)
    try:
        return generations.publish(engine, index_dir, catalog=catalog, catalog_id=catalog_id, build_id=build_id,
                                   bi=bi, factory=factory, device=device, db_url=db_url, kind=kind,
                                   **publish_args)
    except BaseException as exc:
        store.fail_build(engine, build_id, f"{type(exc).__name__}: {exc}")
        raise


def add(delta_path: str | Path, index_dir: str | Path, *, db: str | None = None, model=None, device: str | None = None,
        on_progress: Progress | None = None, chunk_size: int = 5000, runner="local",
        ray_address: str | None = None, workers: int | None = None, gpus_per_worker: float = 0.0) -> BuildResult:
    """Apply a delta file to an existing catalog: new ids are added, ids whose address changed are updated
    (re-embedded), unchanged rows cost nothing.  The file is read like the catalog (same column names).
    ``runner``, ``ray_address``, ``workers``, ``gpus_per_worker``: where the new entries are parsed and
    embedded, as for :func:`mgeo_index.catalog.build.build`."""
    index_dir = Path(index_dir)
    store_engine, _, catalog, catalog_id, generation = _open(index_dir, db)
    try:
        with store.Session(store_engine) as session:
            row = session.get(store.Catalog, catalog_id)
            address_column, id_column = row.address_column, row.id_column
    finally:
        store_engine.dispose()
    bi = _model_for(generation, model)
    factory = _factory_for(index_dir, generation)
    return build(delta_path, index_dir, db=db, catalog=catalog, address_column=address_column, id_column=id_column,
                 factory=factory, model=bi, device=device, on_progress=on_progress, chunk_size=chunk_size, kind="add",
                 runner=runner, ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker)


@dataclass
class RemoveResult:
    removed: int
    not_found: list[str]
    generation_id: int | None
    vectors_total: int
    seconds: float


def read_ids_file(path: str | Path) -> list[str]:
    """One catalog id a line (blank lines and a UTF-8 BOM ignored)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"ids file {path} does not exist or is not a file")
    text = Path(path).read_text(encoding="utf-8-sig")
    return [line.strip() for line in text.splitlines() if line.strip()]


def remove(ids: list[str], index_dir: str | Path, *, db: str | None = None, model=None, device: str | None = None) -> RemoveResult:
    """Remove entries by catalog id (the catalog's id column; without one, the normalized address is the key).

    Ids that are not in the catalog (any more) are reported, not an error, so an interrupted removal
    can be re-run.  Nothing is embedded: the new generation drops the removed vectors."""
    index_dir = Path(index_dir)
    started = time.perf_counter()
    with writer_lock(index_dir, f"remove {len(ids)} ids"):
        engine, db_url, catalog, catalog_id, generation = _open(index_dir, db)
        try:
            retired, not_found = store.retire_entries(engine, catalog_id, ids)
            if generation is None and not retired:
                raise FileNotFoundError(f"{index_dir} has no index generation yet; build it first")
            if not retired and generation["ntotal"] == store.count_entries(engine, catalog_id):
                # nothing to remove, and no earlier removal waits to be published (the current generation
                # holds exactly the live entries): no new generation, none pushed out
                return RemoveResult(0, not_found, generation["id"], generation["ntotal"], time.perf_counter() - started)
            published = _republish(
                engine, index_dir, db_url, catalog, catalog_id, generation, model=model, device=device, kind="remove",
                build_fields={"seconds": time.perf_counter() - started, "stats": {"removed": len(retired)}},
            )
        finally:
            engine.dispose()
    return RemoveResult(len(retired), not_found, published.generation_id, published.vectors_total, time.perf_counter() - started)


def gc(index_dir: str | Path, *, db: str | None = None, keep: int = generations.KEEP_GENERATIONS) -> generations.Collected:
    """Delete all but the current and newest generations (``keep`` in all), stray files and unreferenced retired rows."""
    index_dir = Path(index_dir)
    with writer_lock(index_dir, f"gc --keep {keep}"):
        engine, _, _, catalog_id, _ = _open(index_dir, db)
        try:
            return generations.collect(engine, index_dir, catalog_id, keep=keep)
        finally:
            engine.dispose()


def check(index_dir: str | Path, *, db: str | None = None) -> consistency.Report:
    """Read-only consistency check of the current generation against the store (takes no lock)."""
    index_dir = Path(index_dir)
    db_url = settings.database_url(index_dir, db)
    engine = store.connect(db_url)
    try:
        return consistency.check(index_dir, engine, db_url)
    finally:
        engine.dispose()


def repair(index_dir: str | Path, *, db: str | None = None, model=None, device: str | None = None) -> consistency.Report:
    """Rebuild from the store what ``check`` finds wrong, as a new generation; returns the check after it.

    Vectors of the current generation are reused when its FAISS file (or Milvus collection) is intact and its
    model is the one used now; otherwise every entry is embedded again. A Milvus alias naming another
    collection than the current generation's is pointed back at it."""
    index_dir = Path(index_dir)
    with writer_lock(index_dir, "check --repair"):
        engine, db_url, catalog, catalog_id, generation = _open(index_dir, db, repairing=True)
        try:
            report = consistency.check(index_dir, engine, db_url)
            if report.clean:
                return report
            if report.realign and len(report.problems) == 1:  # only the Milvus alias lags: point it, nothing to rebuild
                consistency.realign(engine, index_dir, catalog_id)
                return consistency.check(index_dir, engine, db_url)
            _republish(engine, index_dir, db_url, catalog, catalog_id, generation, model=model, device=device,
                       kind="repair", from_scratch=report.rebuild)
            return consistency.check(index_dir, engine, db_url)
        finally:
            engine.dispose()
