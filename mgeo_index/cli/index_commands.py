"""The catalog's lifecycle: build, add, remove, gc, check."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mgeo_index import settings
from mgeo_index.cli.errors import friendly_errors
from mgeo_index.cli.options import (
    DEFAULT_INDEX_DIR, AddressColumn, Backend, RunnerName, Db, Device, GpusPerWorker, IndexDir, LibraryDefault, Model,
    Numbers, Profile, RayAddress, Workers,
)
from mgeo_index.cli.render import add_table, build_table, check_json, check_table, console, err, escape, progress, stage_progress


def build(
    catalog: Annotated[Path, typer.Argument(help="CSV or TSV file of addresses (UTF-8, UTF-8 with BOM or GB18030).")],
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    address_column: AddressColumn = None,
    id_column: Annotated[str | None, typer.Option(help="Column holding the catalog's own id (kept in results).")] = None,
    name_column: Annotated[str | None, typer.Option(help="Column holding each place's name, for a catalog kept as name + address: entries match by their address with the name after it, a query's name (resolve --name, normalize --name-column) is compared with it, and answers show it. A rebuild without it keeps the catalog's.")] = None,
    lon_column: Annotated[str | None, typer.Option(help="Column holding each entry's longitude, where it is not named lon, lng, longitude or 经度 (with --lat-column; checked as numbers in range, recorded with the catalog).")] = None,
    lat_column: Annotated[str | None, typer.Option(help="Column holding each entry's latitude, where it is not named lat, latitude or 纬度 (with --lon-column).")] = None,
    index: Annotated[str, typer.Option("--index", help="auto (by catalog size: Flat up to 200,000 rows, then IVF with 8-bit vectors, nprobe tuned to hold recall) or a FAISS factory string: Flat, HNSW32, IVF4096,PQ32 …")] = settings.DEFAULT_INDEX_FACTORY,
    catalog_name: Annotated[str, typer.Option("--catalog", help="Catalog name in the store.")] = settings.DEFAULT_CATALOG,
    vector_store: Annotated[str | None, typer.Option("--vector-store", help="Where the vectors go: faiss (files in the index directory, the default), milvus://HOST:PORT or milvus://HOST:PORT/DATABASE (a Milvus server; token in MGEO_INDEX_MILVUS_TOKEN) or milvus-lite:///PATH.db (embedded). Later commands keep the catalog's.")] = None,
    runner: RunnerName = "local",
    ray_address: RayAddress = None,
    workers: Workers = None,
    gpus_per_worker: GpusPerWorker = 0.0,
    db: Db = None,
    model: Model = None,
    device: Device = None,
    backend: Backend = None,
    numbers: Numbers = None,
    profile: Profile = None,
    force: Annotated[bool, typer.Option("--force", help="Build into a directory that holds other files (they are left as they are; index.json and rejects.tsv are written there).")] = False,
) -> None:
    """Validate, store and index a catalog. Re-running adds new rows and re-embeds only changed ones.

    Rejected rows go to rejects.tsv in the index directory with their line number and reason. With
    --runner ray entries are parsed and embedded on Ray actors; the same command resumes after kill -9.

    Example: mgeo-index build catalog.csv --index-dir idx --id-column poi_id

    Shops kept as name + address: mgeo-index build shops.csv --index-dir idx --name-column name

    On Ray: mgeo-index build catalog.csv --index-dir idx --id-column poi_id --runner ray --workers 4

    --numbers and --profile are recorded with the catalog (a rebuild without them keeps the recorded ones):
    resolve, normalize and serve of the index use them unless told otherwise.
    """
    from mgeo_index.catalog.build import build as run_build

    with friendly_errors(), progress() as bar:
        result = run_build(
            catalog, index_dir, db=db, catalog=catalog_name, address_column=address_column, id_column=id_column,
            factory=index, model=model, device=device, backend=backend, vector_store=vector_store,
            on_progress=stage_progress(bar, {"parse": "Parsing entries"}), runner=runner, ray_address=ray_address,
            workers=workers, gpus_per_worker=gpus_per_worker, numbers=numbers, force=force, profile=profile,
            name_column=name_column, coordinate_columns=(lon_column, lat_column),
        )
    console.print(build_table(result))


def add(
    delta: Annotated[Path, typer.Argument(help="CSV/TSV of new or changed rows, with the catalog's columns.")],
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    runner: RunnerName = "local",
    ray_address: RayAddress = None,
    workers: Workers = None,
    gpus_per_worker: GpusPerWorker = 0.0,
    db: Db = None,
    model: Model = None,
    device: Device = None,
) -> None:
    """Add new rows and update changed ones (same catalog id, new address) without re-embedding the rest.

    The result is a new index generation; readers switch to it in one transaction.

    Example: mgeo-index add delta.csv --index-dir idx
    """
    from mgeo_index.catalog.update import add as run_add

    with friendly_errors(), progress() as bar:
        result = run_add(delta, index_dir, db=db, model=model, device=device, on_progress=stage_progress(bar),
                         runner=runner, ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker)
    console.print(add_table(result))


def remove(
    ids: Annotated[list[str] | None, typer.Option("--ids", help="Catalog ids to remove (repeat the option or list them).")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="File with one catalog id per line.")] = None,
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    db: Db = None,
    model: Model = None,
    device: Device = None,
) -> None:
    """Remove catalog entries by their catalog id; the new generation no longer returns them.

    Ids not in the catalog are listed, not an error, so an interrupted removal can be re-run.

    Example: mgeo-index remove --ids P0001 --ids P0002 --index-dir idx
    """
    from mgeo_index.catalog.update import read_ids_file, remove as run_remove

    with friendly_errors():
        wanted = list(ids or []) + (read_ids_file(file) if file is not None else [])
        if not wanted:
            raise ValueError(f"{file} holds no ids (one catalog id a line)" if file is not None
                             else "give --ids ID ... or --file IDS")
        result = run_remove(wanted, index_dir, db=db, model=model, device=device)
    console.print(f"removed {result.removed} entries; generation {result.generation_id} holds {result.vectors_total} vectors "
                  f"({result.seconds:.1f} s)")
    if result.not_found:
        err.print(f"[yellow]{len(result.not_found)} ids not in the catalog (already removed?):[/] "
                  + escape(", ".join(result.not_found[:20]) + (" …" if len(result.not_found) > 20 else "")), highlight=False)


def gc(
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    keep: Annotated[int, typer.Option("--keep", min=1, help="Generations to keep, the current one included.")] = LibraryDefault("mgeo_index.catalog.generations", "KEEP_GENERATIONS"),
    db: Db = None,
) -> None:
    """Delete old index generations (files and rows), files of interrupted writes and retired entries no kept generation returns.

    Example: mgeo-index gc --index-dir idx --keep 3
    """
    from mgeo_index.catalog.update import gc as run_gc

    with friendly_errors():
        result = run_gc(index_dir, db=db, keep=keep)
    console.print(f"kept generations {result.generations_kept}; removed generations {result.generations_removed}, "
                  f"{len(result.files_removed)} files, {result.entries_purged} retired entries"
                  + (f", {len(result.collections_removed)} Milvus collections" if result.collections_removed else ""),
                  highlight=False)


def check(
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    repair: Annotated[bool, typer.Option("--repair", help="Rebuild what is wrong from the store, as a new generation.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    db: Db = None,
    model: Model = None,
    device: Device = None,
) -> None:
    """Verify that store and index agree: counts, ids, model fingerprint, file checksums. Exit code 1 when not.

    Example: mgeo-index check --index-dir idx --repair
    """
    from mgeo_index.catalog import update

    with friendly_errors():
        before = update.check(index_dir, db=db)
        after = update.repair(index_dir, db=db, model=model, device=device) if repair and not before.clean else None
    for report, stage in ((before, "check"), (after, "after repair")):
        if report is not None:
            if as_json:
                print(json.dumps(check_json(report, stage), ensure_ascii=False))
            else:
                console.print(check_table(report, stage))
    if not (after or before).clean:
        if not repair:
            err.print("run `mgeo-index check --repair` to rebuild what can be rebuilt from the store", highlight=False)
        raise typer.Exit(1)
