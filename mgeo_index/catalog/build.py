"""`mgeo-index build` and `mgeo-index add`: catalog file → validated rows in the store → a new index generation.

Rows are upserted (new catalog ids are added; an id whose address changed is replaced by a new entry,
which alone is embedded); :func:`generations.publish` then writes the new generation beside the
current one and moves the pointer in one transaction, so a reader never sees half an index and a crash
or Ctrl-C loses nothing: rows already stored stay, and re-running the command finishes the job.

Parsing and embedding are computed by a runner (:mod:`mgeo_index.compute`: this process, or Ray Data actor
pools; the tasks in :mod:`mgeo_index.catalog.build_tasks`); this module and :func:`generations.publish` keep every
store write, the generation switch and the crash points, in the same order whichever runner computes.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mgeo_index import settings, store
from mgeo_index.catalog import generations, ownership, index_json
from mgeo_index.index import faiss_index, vector_store as vector_stores
from mgeo_index.catalog.build_tasks import encode_task, parse_task
from mgeo_index.compute.runners import Runner, make_runner
from mgeo_index.catalog.reader import CatalogError, Reject, check_input_file, read_catalog, write_rejects
from mgeo_index.files import writable
from mgeo_index.catalog.locking import writer_lock
from mgeo_index.model.bi_encoder import BiEncoder
from mgeo_index.model.loading import stored_bi
from mgeo_index.text import normalize, not_an_address

REJECTS = "rejects.tsv"

# on_progress(stage, advance, total): stage is "read" (advance = rows), "parse" or "encode" (advance = entries)
Progress = Callable[[str, int, int | None], None]


@dataclass
class BuildResult:
    build_id: int
    catalog: str
    rows_read: int = 0
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_skipped: int = 0
    rows_rejected: int = 0
    entries_total: int = 0
    vectors_total: int = 0
    vectors_added: int = 0
    vectors_removed: int = 0
    generation_id: int | None = None
    entries_parsed: int = 0
    index_factory: str = ""
    address_column: str | None = None  # the columns read (detected, given or the catalog's own)
    name_column: str | None = None
    other_columns: list[str] = field(default_factory=list)  # kept with each entry (answers' fields)
    id_column: str | None = None
    columns_reason: str = ""  # why those columns (detected: what their names and values said)
    blank_lines: int = 0  # blank lines in the file (no record, skipped)
    index_path: str = ""
    rejects_path: str | None = None
    runner: str = "local"  # the runner that parsed and embedded (mgeo_index.compute)
    answers: dict[str, str] = field(default_factory=dict)  # the profile and number policy its answers use (settings.answer_settings)
    plan: str = ""  # how its vectors were computed (mgeo_index.runtime.plan), as the generation records it
    seconds: dict[str, float] = field(default_factory=dict)


def _store_chunk(engine_, catalog_id: int, rows, result: BuildResult, rejects: list[Reject]) -> None:
    records = []
    for row in rows:
        normalized = normalize(row.text)
        if reason := not_an_address(normalized):
            rejects.append(Reject(row.line, reason, row.address))
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
    inserted, updated, unchanged = store.upsert_entries(engine_, catalog_id, records)
    result.rows_inserted += inserted
    result.rows_updated += updated
    result.rows_skipped += unchanged + len(records) - len({r["key"] for r in records})  # unchanged or repeated


def _parse_entries(engine_, catalog_id: int, chunk_size: int, progress: Progress, runner: Runner) -> int:
    """Parse the entries that have no stored elements, or elements of another parser version (the shipped
    tagger or gazetteer changed since), on ``runner``; each chunk is committed as it comes back."""
    from mgeo_index.text.parser import parser_version

    version = parser_version()
    done = 0
    batches = store.entries_to_parse(engine_, catalog_id, version, batch_size=max(chunk_size, 1))
    for batch, parsed in runner.map(batches, parse_task(chunk_size)):
        store.store_elements(engine_, [
            {"entry_id": e["id"], "elements": p["elements"], "admin": p["admin"], "parser": version}
            for e, p in zip(batch, parsed)
        ])
        done += len(batch)
        progress("parse", len(batch), None)
    return done


def _same_columns(engine_, catalog: str, address_column: str | None, id_column: str | None) -> tuple[str | None, str | None]:
    """The columns a re-build of an existing catalog reads: the stored ones unless named, and never others
    (another address column would overwrite every stored address, another id column would store every row
    a second time under new keys)."""
    stored = store.catalog_columns(engine_, catalog)
    if stored is None or stored == (None, None):
        return address_column, id_column
    stored_address, stored_id = stored

    def same(given: str | None, kept: str | None) -> bool:  # as the reader matches names: case and spaces aside
        return given is None or (kept is not None and "".join(given.split()).lower() == "".join(kept.split()).lower())

    if same(address_column, stored_address) and same(id_column, stored_id):
        return stored

    def name(column: str | None) -> str:
        return repr(column) if column else "none (rows keyed by their address)"

    raise ValueError(
        f"catalog {catalog!r} was built with address column {name(stored_address)} and id column {name(stored_id)}; "
        f"this build names address column {name(address_column or stored_address)} and id column "
        f"{name(id_column if id_column is not None else stored_id)}. Use the catalog's columns (rename them in the "
        f"file), or build into another catalog (--catalog NAME) or index directory"
    )


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
    parse_elements: bool = True,
    on_progress: Progress | None = None,
    kind: str = "build",
    vector_store: str | None = None,
    runner: str | Runner = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float = 0.0,
    numbers: str | None = None,
    force: bool = False,
    profile: str | None = None,
    name_column: str | None = None,
    coordinate_columns: tuple[str | None, str | None] = (None, None),
) -> BuildResult:
    """Store the file's rows (upsert) and switch to a generation that indexes them.

    ``kind="add"`` applies a delta file to an existing catalog (see :func:`mgeo_index.catalog.update.add`).
    ``vector_store``: where the generation's vectors go (:mod:`mgeo_index.index.vector_store`: ``faiss`` files in the
    index directory, ``milvus://HOST:PORT``, ``milvus-lite:///PATH.db``); None keeps the catalog's (FAISS for a new one).
    ``runner``: the runner that parses and embeds entries (:mod:`mgeo_index.compute`): ``local`` (this
    process, on ``device``) or ``ray`` (a Ray Data actor pool of ``workers`` actors on the cluster at
    ``ray_address``, else a local Ray, each with ``gpus_per_worker`` GPUs or a CPU), or a runner object.
    ``numbers``: the number policy recorded with the catalog (``strict`` / ``loose``, :mod:`mgeo_index.model.numbers`),
    which resolving, normalizing and serving the index then use unless told otherwise; None keeps the catalog's.
    ``profile``: the profile recorded with the catalog (``default`` / ``accurate``: which bundled cross-encoder its
    queries rerank with unless told otherwise); None keeps the catalog's. ``name_column``: the column holding each
    entry's name (a catalog kept as name + address): entries match by their address with the name after it, and a
    query's name is compared with it (:mod:`mgeo_index.compare.names`); None keeps the catalog's (none for a new one).
    ``coordinate_columns``: the (longitude, latitude) columns, where they are not named so that they are found
    (:mod:`mgeo_index.catalog.coordinates`); checked as numbers in range, recorded with the catalog.
    A directory that holds files mgeo-index did not write is refused unless ``force``
    (:func:`mgeo_index.catalog.ownership.check_writable_here`); clean-up deletes only files its own builds wrote.
    """
    if numbers is not None:
        from mgeo_index.model.numbers import check_mode

        check_mode(numbers)
    if profile is not None:
        settings.check_profile(profile)
    runner = runner if not isinstance(runner, str) else make_runner(
        runner, device=device, backend=backend, ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker)
    index_dir = Path(index_dir)
    check_input_file(Path(catalog_path), "catalog file")  # before anything is made: a failed build leaves nothing
    if index_dir.exists() and not index_dir.is_dir():
        raise NotADirectoryError(f"--index-dir {index_dir} is a file, not a directory")
    if not writable(index_dir):
        raise ValueError(f"cannot write into --index-dir {index_dir}: it is read-only here; {kind} into a writable "
                         "directory (a read-only copy of an index can be queried and checked, not written)")
    if kind == "build":
        ownership.check_writable_here(index_dir, force)
    index_dir.mkdir(parents=True, exist_ok=True)
    with writer_lock(index_dir, f"build {catalog_path}" if kind == "build" else f"add {catalog_path}"):
        asked = _Asked(catalog_path=Path(catalog_path), index_dir=index_dir, db=db, catalog=catalog,
                       address_column=address_column, id_column=id_column, factory=factory, device=device,
                       backend=backend, chunk_size=chunk_size, kind=kind, parse_elements=parse_elements,
                       vector_store=vector_store, numbers=numbers, profile=profile, name_column=name_column,
                       coordinate_columns=coordinate_columns)
        return _build_locked(asked, model, runner, on_progress or (lambda *_: None))


@dataclass(frozen=True)
class _Asked:
    """One build or add as :func:`build` was asked for it (the columns as given: the catalog's own may replace
    them, :func:`_open_catalog`)."""

    catalog_path: Path
    index_dir: Path
    db: str | None
    catalog: str
    address_column: str | None
    id_column: str | None
    factory: str
    device: str | None
    backend: str | None
    chunk_size: int
    kind: str
    parse_elements: bool
    vector_store: str | None
    numbers: str | None
    profile: str | None
    name_column: str | None
    coordinate_columns: tuple[str | None, str | None]


def _build_locked(asked: _Asked, model, runner: Runner, progress: Progress) -> BuildResult:
    timings: dict[str, float] = {}
    started = time.perf_counter()
    bi = model if isinstance(model, BiEncoder) else stored_bi(model)
    device = settings.device(asked.device)  # this process's (FAISS); the runner's embeds (the same for the local one)
    encode = encode_task(runner, bi, asked.backend, asked.chunk_size)  # refuses a model Ray actors cannot load, early
    _check_destination(asked, bi.dim)
    if runner.name != "local":  # Ray joined or started, its GPUs checked: before anything is stored
        t0 = time.perf_counter()
        runner.start()
        timings[f"{runner.name} start"] = time.perf_counter() - t0
    db_url = settings.database_url(asked.index_dir, asked.db)
    engine_, reader, new_catalog = _open_catalog(asked, db_url, bi.max_length - 2)
    result, catalog_id = _start(engine_, asked, reader, new_catalog, runner.name, db_url, bi.fingerprint)
    rejects_path = asked.index_dir / REJECTS
    rejects_path.unlink(missing_ok=True)
    try:
        _store_rows(engine_, catalog_id, reader, result, rejects_path, progress)
        timings["store"] = time.perf_counter() - started - timings.get(f"{runner.name} start", 0.0)
        if asked.parse_elements:  # entries not parsed yet → elements and admin codes (resumable like the vectors)
            t0 = time.perf_counter()
            result.entries_parsed = _parse_entries(engine_, catalog_id, asked.chunk_size, progress, runner)
            timings["parse"] = time.perf_counter() - t0
        # a new generation: vectors for entries that have none, then the pointer switch
        result.rejects_path = str(rejects_path) if result.rows_rejected else None
        published = generations.publish(
            engine_, asked.index_dir, catalog=asked.catalog, catalog_id=catalog_id, build_id=result.build_id, bi=bi,
            factory=asked.factory, device=device, db_url=db_url, kind=asked.kind, on_progress=progress,
            chunk_size=asked.chunk_size, vector_store_url=asked.vector_store, runner=runner, encode=encode,
            build_fields={"rows_read": result.rows_read, "rows_inserted": result.rows_inserted,
                          "rows_skipped": result.rows_skipped, "rows_rejected": result.rows_rejected,
                          "seconds": time.perf_counter() - started,
                          "stats": {"rows_updated": result.rows_updated, "entries_parsed": result.entries_parsed,
                                    **runner.describe()}},
        )
        timings.update(published.seconds)
        timings["total"] = time.perf_counter() - started
        _published(result, published, asked.factory)
        result.plan = str(encode.plan) if encode.plan is not None else ""
        result.seconds = timings
        return result
    except BaseException as exc:  # Ctrl-C included: record it, keep what is stored, re-raise
        store.fail_build(engine_, result.build_id, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        engine_.dispose()


def _check_destination(asked: _Asked, dim: int) -> None:
    """The index factory, the vector store (given or kept from index.json) and the columns, checked before the store
    is touched."""
    if asked.factory != faiss_index.AUTO:
        faiss_index.make_index(dim, asked.factory)  # validate the factory string
    planned = asked.vector_store  # and the vector store's URL (Milvus: the factory maps), given or kept from index.json
    if planned is None and (asked.index_dir / index_json.DESCRIPTOR).is_file():
        try:
            planned = index_json.read_descriptor(asked.index_dir).get("vector_store")
        except FileNotFoundError:
            pass
    vector_stores.validate(planned, asked.index_dir, asked.factory, dim)
    if asked.address_column is not None and asked.address_column == asked.id_column:
        raise ValueError(f"--address-column and --id-column are both {asked.address_column!r}: name two different columns")


def _open_catalog(asked: _Asked, db_url: str, max_chars: int):
    """(the store's engine, the catalog file's reader, whether the catalog is new). An existing store is consulted
    before the file is read (the catalog's own columns where the build names none; an ``add`` always reads them);
    a new store is created only once the file is known to be readable (a refused file leaves no store behind)."""
    engine_ = store.connect(db_url) if store.exists(db_url) else None
    new_catalog = True
    address_column, id_column, name_column = asked.address_column, asked.id_column, asked.name_column
    coordinate_columns, build = asked.coordinate_columns, asked.kind == "build"
    try:
        if engine_ is not None:
            new_catalog = store.catalog_columns(engine_, asked.catalog) is None
            current = store.current_generation(engine_, store.catalog_id(engine_, asked.catalog))  # None: a new catalog
            ownership.ensure_served_here(asked.index_dir, asked.catalog, current)
            if build:
                address_column, id_column = _same_columns(engine_, asked.catalog, address_column, id_column)
            if name_column is None or not build:
                name_column = store.catalog_name_column(engine_, asked.catalog)
            if coordinate_columns == (None, None) or not build:
                coordinate_columns = store.catalog_coordinate_columns(engine_, asked.catalog)
        try:
            reader = read_catalog(
                asked.catalog_path, address_column=address_column, id_column=id_column, max_chars=max_chars,
                chunk_size=asked.chunk_size, detect_id=build and new_catalog and id_column is None,
                name_column=name_column, check_coordinates=True, coordinate_columns=coordinate_columns,
            )
        except CatalogError as exc:
            if build:
                raise
            raise CatalogError(f"{exc}. A delta file uses the catalog's own column names: address column "
                               f"{address_column!r}, id column {id_column!r}") from None
        return engine_ or store.connect(db_url), reader, new_catalog
    except BaseException:
        if engine_ is not None:
            engine_.dispose()
        raise


def _start(engine_, asked: _Asked, reader, new_catalog: bool, runner_name: str, db_url: str,
           fingerprint: str) -> tuple[BuildResult, int]:
    """The catalog recorded (a build: created or its settings updated; an add: as the build set it), index.json
    written, the build started: (its result so far, the catalog's id)."""
    if asked.kind == "build":
        catalog_id = store.get_or_create_catalog(
            engine_, asked.catalog, source=str(asked.catalog_path.resolve()), address_column=reader.address_column,
            id_column=reader.id_column, numbers=asked.numbers, profile=asked.profile, name_column=reader.name_column,
            # as named, spelled as the file does (None, None: found by name, nothing recorded)
            coordinate_columns=reader.coordinate_names if any(asked.coordinate_columns) else (None, None),
        )
    else:  # a delta: the catalog and its columns stay as the build set them
        catalog_id = store.catalog_id(engine_, asked.catalog)
    index_json.ensure_descriptor(asked.index_dir, asked.catalog, db_url, asked.vector_store)
    build_id = store.start_build(engine_, catalog_id, model_fingerprint=fingerprint, index_factory=asked.factory)
    result = BuildResult(
        build_id=build_id, catalog=asked.catalog, index_factory=asked.factory, address_column=reader.address_column,
        id_column=reader.id_column, name_column=reader.name_column, runner=runner_name,
        other_columns=[c for c in reader.columns if c not in (reader.address_column, reader.id_column)],
        answers=settings.answer_settings(store.catalog_numbers(engine_, asked.catalog),
                                         store.catalog_profile(engine_, asked.catalog)),
        columns_reason="" if not new_catalog or asked.kind != "build" else
        f"address: {reader.address_reason}; id: {reader.id_reason}")
    return result, catalog_id


def _store_rows(engine_, catalog_id: int, reader, result: BuildResult, rejects_path: Path, progress: Progress) -> None:
    """The file's rows → the store, chunk by chunk (memory does not grow with the file); rejected rows appended to
    ``rejects_path``."""
    for rows, rejects in reader.chunks():
        rejects = list(rejects)
        read = len(rows) + len(rejects)  # before _store_chunk adds the rows it rejects itself
        _store_chunk(engine_, catalog_id, rows, result, rejects)
        result.rows_read += read
        if rejects:
            result.rows_rejected += write_rejects(rejects_path, rejects)
        progress("read", read, None)
    result.blank_lines = reader.blank_lines


def _published(result: BuildResult, published, factory: str) -> None:
    """What the new generation holds, into ``result`` (and what ``auto`` chose for the index)."""
    result.generation_id = published.generation_id
    result.entries_total = published.entries_total
    result.vectors_total = published.vectors_total
    result.vectors_added = published.vectors_added
    result.vectors_removed = published.vectors_removed
    result.index_path = published.where
    if factory == faiss_index.AUTO:  # say what auto chose
        result.index_factory = f"auto: {published.structure}" + (
            f" (nprobe {published.tuning['nprobe']}: recall@10 {published.tuning['recall']:.3f} of exact search "
            f"on {published.tuning['queries']} catalog vectors)" if published.tuning else "")
