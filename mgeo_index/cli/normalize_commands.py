"""normalize (a file against the catalog, as a resumable job) and jobs (the jobs in a store)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mgeo_index import settings
from mgeo_index.cli.errors import friendly_errors
from mgeo_index.cli.options import (
    DEFAULT_INDEX_DIR, AddressColumn, Backend, CrossModel, Db, Device, IndexDir, LibraryDefault, Model, Numbers,
    Profile, RawValues,
)
from mgeo_index.cli.render import console, err, jobs_table, print_normalize, progress


def _default(name: str) -> LibraryDefault:
    """``mgeo_index.jobs.<name>``, read when needed (importing the package loads the store)."""
    return LibraryDefault("mgeo_index.jobs", name)


def normalize(
    input: Annotated[Path, typer.Argument(help="CSV/TSV (UTF-8, UTF-8 with BOM or GB18030) or Parquet file of addresses.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file: input columns + status, match_id, match_address, label, probability, alternatives, reason.")],
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    address_column: AddressColumn = None,
    id_column: Annotated[str | None, typer.Option(help="Column holding the row's own id (must not be empty).")] = None,
    name_column: Annotated[str | None, typer.Option(help="Column holding each row's place name (a store table kept as name + address): a row resolves as its address with the name after it, and a catalog entry at the same door under another name is not exact_match.")] = None,
    min_probability: Annotated[float, typer.Option(min=0.0, max=1.0, help="Least probability of the best candidate's label to call it matched.")] = _default("DEFAULT_MIN_PROBABILITY"),
    ambiguous_margin: Annotated[float, typer.Option(min=0.0, max=1.0, help="Ambiguous when the runner-up's P(exact)+½P(partial) is within this of the best's.")] = _default("DEFAULT_MARGIN"),
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=1000, help="Candidates retrieved and reranked per row.")] = _default("DEFAULT_TOP_K"),
    output_format: Annotated[str | None, typer.Option("--format", help="csv, jsonl, parquet or xlsx \\[default: from the --out suffix: .csv, .tsv, .jsonl, .parquet, .xlsx; another suffix is refused].")] = None,
    encoding: Annotated[str | None, typer.Option(help="Of a CSV / TSV output: utf-8, utf-8-sig (with the BOM Excel on Windows reads) or gb18030 \\[default: the input's].")] = None,
    chunk_size: Annotated[int, typer.Option(min=1, help="Rows per checkpoint (and per part file).")] = _default("DEFAULT_CHUNK_SIZE"),
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per resolver call.")] = _default("DEFAULT_BATCH_SIZE"),
    runner: Annotated[str, typer.Option("--runner", "--engine", help="Where rows are resolved: local (this process, or --workers processes), or ray (a Ray Data actor pool).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster address, e.g. ray://head:10001 \\[default: a local Ray].")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Worker processes (local, CPU) or Ray actors, one model + index replica each \\[default: this process locally; with Ray, the CPU count].")] = None,
    gpus_per_worker: Annotated[float, typer.Option(min=0.0, help="GPUs per Ray actor (0: CPU actors).")] = 0.0,
    restart: Annotated[bool, typer.Option("--restart", help="Discard an unfinished job for this output and start over.")] = False,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
    numbers: Numbers = None,
    raw_values: RawValues = False,
    profile: Profile = None,
    coordinates: Annotated[bool, typer.Option("--coordinates", help="Add lon, lat and coordinates_precision: the matched entry's own coordinates (precision entry; catalog columns named lon/lng/longitude/经度 and lat/latitude/纬度, in the catalog's coordinate system), else the centre of the deepest admin level the address resolves to (town, district, city or province), else none.")] = False,
    catalog_columns: Annotated[str | None, typer.Option(help="The matched entry's own catalog columns to add, as match_<column> (comma-separated, e.g. lon,lat,category, or all); empty for rows tied to no entry.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Add a last column, explain: the best candidate compared element by element with both values, as JSON ({\"room\": {\"state\": \"differs\", \"query\": \"1201室\", \"candidate\": \"12楼02\", \"text\": …}}).")] = False,
) -> None:
    """Tie every row of a file to the catalog: matched / ambiguous / unmatched / rejected.

    Runs as a job recorded in the store; if it is interrupted (Ctrl-C, kill -9), the same command resumes
    from the last checkpoint, and the output holds every input row exactly once, in input order.

    Example: mgeo-index normalize stores.csv --index-dir idx --out stores.matched.csv

    Stores with names: mgeo-index normalize stores.csv --index-dir idx --out stores.matched.csv --name-column name
    """
    from rich.progress import TimeRemainingColumn

    from mgeo_index.compute.runners import RUNNERS
    from mgeo_index.jobs import normalize_file

    if runner not in RUNNERS:
        raise typer.BadParameter("--runner must be local or ray")
    try:
        with friendly_errors(), progress() as bar:
            bar.columns = (*bar.columns, TimeRemainingColumn())
            task = bar.add_task("Resolving rows", total=None)

            def on_job(job: dict) -> None:
                bar.update(task, description=f"Job {job['id']}")
                if job["rows_done"]:
                    err.print(f"Resuming job {job['id']} at row {job['rows_done']:,}", highlight=False)
                    bar.reset(task, completed=job["rows_done"], total=job["rows_total"])  # rate counts this run only

            result = normalize_file(
                input, out, index_dir, db=db, model=model, cross_model=cross_model, device=device, backend=backend,
                address_column=address_column, id_column=id_column, name_column=name_column, explain=explain,
                catalog_columns=catalog_columns, encoding=encoding, coordinates=coordinates,
                min_probability=min_probability,
                margin=ambiguous_margin, top_k=top_k, output_format=output_format, chunk_size=chunk_size,
                batch_size=batch_size, runner=runner, ray_address=ray_address, workers=workers,
                gpus_per_worker=gpus_per_worker, restart=restart, on_job=on_job, numbers=numbers,
                raw_values=raw_values, profile=profile,
                on_progress=lambda n, total: bar.update(task, advance=n, total=total),
            )
    except KeyboardInterrupt:
        err.print("[yellow]Interrupted.[/] Run the same command again to resume from the last checkpoint.")
        raise typer.Exit(130) from None
    print_normalize(result)
    if result.already_complete:
        err.print(f"Job {result.job_id} had already finished; nothing was recomputed.")


def jobs(
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    db: Db = None,
    limit: Annotated[int, typer.Option(min=1, help="Most recent jobs to show.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per job per line.")] = False,
) -> None:
    """List normalize jobs with their state, progress and counts (newest first).

    A job shown as 'stale' was killed while running: the same normalize command resumes it.

    Example: mgeo-index jobs --index-dir idx
    """
    from mgeo_index.jobs import STATUSES, list_jobs

    with friendly_errors():
        found = list_jobs(index_dir, db=db, limit=limit)
    if as_json:
        for job in found:
            print(json.dumps(job, ensure_ascii=False, default=str))
        return
    where = "MGEO_INDEX_DB" if not db and settings.env("DB") else ("--db" if db else str(index_dir))
    if not found:
        console.print(f"no jobs in the store of {where}", markup=False)
        return
    console.print(jobs_table(found, where, STATUSES))
