"""A normalize job: tie every row of a file to the catalog, resumably, as a job recorded in the store.

A job reads the input (:mod:`~mgeo_index.jobs.inputs`) in chunks of ``chunk_size`` records, has its
*runner* resolve each chunk's valid addresses in micro-batches of ``batch_size``, and writes each chunk's
output rows to a part file (:mod:`~mgeo_index.jobs.parts`: written aside, fsynced and renamed into
place). Only then is the part recorded as a checkpoint in the store, in the same transaction that
advances the job's ``rows_done``. A killed job (Ctrl-C, ``kill -9``, a crash) therefore leaves at most one
unrecorded part, which the next run deletes; it skips the recorded records (re-reading, not re-resolving
them) and carries on. When every record is done the parts are concatenated into the output file (aside,
then renamed), the job is marked complete and the parts are removed, so the output has every input row
exactly once, in input order.

The job remembers what its rows depend on: the input's fingerprint (SHA-256 of the whole file), the
parameters, the index build and both model fingerprints. Resuming with any of them changed is refused
with a message naming both values (``--restart`` starts over instead).

The runner is passed in (:func:`mgeo_index.compute.runners.make_runner` picks one by name), the resolving task
is :mod:`~mgeo_index.jobs.resolving`'s: where chunks are resolved is none of this module's business. A job is
recorded only after its runner is known to be available (``runner.require()``).
"""
from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from mgeo_index import settings, store
from mgeo_index.catalog.crashpoints import crashpoint
from mgeo_index.compute.runners import Runner
from mgeo_index.catalog.reader import check_input_file
from mgeo_index.compute.task import Task
from mgeo_index.runtime.plan import plan
from mgeo_index.jobs.inputs import Chunk, fingerprint_input, input_format, open_input
from mgeo_index.jobs.parts import PartWriter, output_encoding, output_format as choose_format, part_name, parts_dir
from mgeo_index.jobs.resolving import resolve_chunks, resolve_task
from mgeo_index.jobs.policy import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MARGIN,
    DEFAULT_MIN_PROBABILITY,
    DEFAULT_TOP_K,
    STATUSES,
    JobError,
    Policy,
    rejected,
    choose_catalog_columns,
    result_columns,
)

# Parameters that change the output rows: a job resumes only when they are all the same.
RESULT_PARAMS = ("address_column", "id_column", "name_column", "encoding", "min_probability", "margin", "top_k", "chunk_size", "batch_size", "output_format",
                 "output_columns", "backend", "numbers", "raw_values", "profile")  # backends agree on labels, on probabilities to about 1e-3: not mixed
STALE_AFTER = timedelta(minutes=2)  # a running job on another host with no checkpoint for this long may be resumed

# on_progress(rows_advanced, rows_total_estimate), after each chunk of this run (rows done by earlier
# runs are in the job passed to on_job: rows_done)
Progress = Callable[[int, int | None], None]


@dataclass
class JobResult:
    job_id: int
    output: str
    output_format: str
    runner: str
    rows: int = 0  # input records in the output
    resumed_from: int = 0  # records already done when this run started
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    seconds: float = 0.0  # this run
    rows_per_second: float = 0.0  # records resolved by this run / its seconds
    already_complete: bool = False
    profile: str = ""  # which bundled cross-encoder reranked (settings.profile)
    numbers: str = ""  # the number policy (strict / loose)


@dataclass(frozen=True)
class Resolving:
    """What every resolver of a job is opened with and decides by, whichever runner runs them."""

    index_dir: Path
    device: str  # where the runner's resolvers compute
    db: str  # the resolved database URL (not the driver's environment: resolvers may run elsewhere)
    model: str
    cross_model: str
    backend: str  # one concrete inference backend for the whole job
    policy: Policy
    batch_size: int


# --------------------------------------------------------------------------- index identity


def index_identity(index_dir: str | Path, model=None, cross_model=None, profile: str | None = None) -> dict[str, Any]:
    """What a job's rows depend on besides the input: the index build and both models'
    fingerprints (read from the model files, no weights loaded). The same model defaulting and the same
    refusal as :func:`mgeo_index.query.resolver.open_resolver` (:mod:`mgeo_index.model.loading`)."""
    from mgeo_index.catalog.index_json import read_descriptor
    from mgeo_index.model.loading import check_index_model, index_cross_model, index_model_path
    from mgeo_index.model.manifest import fingerprint, read_bi_manifest, read_manifest

    descriptor = read_descriptor(index_dir)
    bi_path = index_model_path(descriptor.get("model_path"), model)
    cross_path, _ = index_cross_model(index_dir, cross_model, descriptor=descriptor, profile=profile)  # adapted too
    max_length = read_bi_manifest(bi_path)["max_length"]  # a plain Hugging Face checkpoint's: its tokenizer's limit
    read_manifest(cross_path, "cross-encoder")
    bi_fp = fingerprint(bi_path)
    check_index_model(bi_fp, bi_path, descriptor, index_dir)
    return {
        "build_id": descriptor.get("build_id"),
        "index_file": descriptor.get("index_file"),
        "model_fingerprint": bi_fp,
        "cross_model_fingerprint": fingerprint(cross_path),
        "model_path": str(bi_path),
        "cross_model_path": str(cross_path),
        "max_chars": int(max_length) - 2,
    }


def _identity_text(build_id, index_file, bi, cross) -> str:
    return f"index build {build_id} ({index_file}) with bi-encoder {bi} and cross-encoder {cross}"


# --------------------------------------------------------------------------- job records


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def effective_status(job: dict, now=None) -> str:
    """The recorded status, except that a *running* job whose process is gone reads
    ``stale`` (killed: the same command resumes it)."""
    if job["status"] != "running":
        return job["status"]
    if job.get("host") == socket.gethostname():
        return "running" if _pid_alive(job.get("pid")) else "stale"
    now = now or store._utcnow()
    return "running" if now - job["updated_at"] < STALE_AFTER else "stale"


def _resume_problems(job: dict, fp: str, params: dict, ident: dict, index_dir: Path) -> list[str]:
    problems = []
    if job["input_fingerprint"] != fp:
        problems.append(f"the input file changed since job {job['id']} started ({job['input_fingerprint'][:19]}… → {fp[:19]}…)")
    old = job.get("params") or {}
    changed = [f"{k} {old.get(k)!r} → {params.get(k)!r}" for k in RESULT_PARAMS
               if old.get(k) != params.get(k) and (k in old or k not in ("backend", "numbers", "raw_values", "profile",
                                                                        "name_column", "encoding"))]  # older jobs
    if changed:
        problems.append("parameters differ: " + ", ".join(changed))
    if old.get("backend") and old.get("backend") != params.get("backend"):  # e.g. started on a CPU with another default
        problems.append(f"to resume it, give its backend: --backend {old['backend']}")
    was = (job["build_id"], job["index_file"], job["model_fingerprint"], job["cross_model_fingerprint"])
    now = (ident["build_id"], ident["index_file"], ident["model_fingerprint"], ident["cross_model_fingerprint"])
    if was != now:
        problems.append(
            f"job {job['id']} was started over {_identity_text(*was)}, but {index_dir} now gives {_identity_text(*now)}; "
            "resume with the original index and models"
        )
    return problems


# --------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class JobOptions:
    """What a normalize job runs with besides its files and runner, as :func:`run_job` and
    :func:`~mgeo_index.jobs.run.normalize_file` take them by name (a name not here is refused)."""

    db: str | None = None
    model: str | Path | None = None
    cross_model: str | Path | None = None
    # the inference backend of the job's resolvers, already checked by the caller (default: an opened resolver's,
    # else the plan's for the runner's device, mgeo_index.runtime.plan)
    backend: str | None = None
    address_column: str | None = None
    id_column: str | None = None
    # the input column naming each row's place (a store table kept as name + address): a row resolves as its
    # address with the name after it, the name compared with each entry's (mgeo_index.compare.names)
    name_column: str | None = None
    min_probability: float = DEFAULT_MIN_PROBABILITY
    margin: float = DEFAULT_MARGIN
    top_k: int = DEFAULT_TOP_K
    # csv, jsonl, parquet or xlsx (default: from the output's suffix, parts.FORMATS; an unknown one is refused)
    output_format: str | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    batch_size: int = DEFAULT_BATCH_SIZE
    # the number policy, strict / loose (default the index's, query.resolver.index_numbers), recorded with the job
    numbers: str | None = None
    # CSV cells as they are (by default a cell that would start a spreadsheet formula is neutralised, tables)
    raw_values: bool = False
    # which bundled cross-encoder reranks (default: the index's, query.resolver.open_resolver)
    profile: str | None = None
    # a last column, explain: the best candidate compared element by element, both values (the API's objects, JSON)
    explain: bool = False
    # the matched entry's own catalog columns to add as match_<column> (names, comma-separated names, or "all")
    catalog_columns: str | list[str] | None = None
    # a CSV / TSV output's encoding (utf-8, utf-8-sig, gb18030; default the input's)
    encoding: str | None = None
    # add lon, lat and coordinates_precision (policy.coordinates_of)
    coordinates: bool = False

    def output_format_checked(self, output_path: Path) -> str:
        """The output's format, once the options' values are checked (a clear error naming the option)."""
        if not 0.0 <= self.min_probability <= 1.0 or not 0.0 <= self.margin <= 1.0:
            raise ValueError("--min-probability and --ambiguous-margin must be between 0 and 1")
        if self.chunk_size < 1 or self.batch_size < 1 or self.top_k < 1:
            raise ValueError("--chunk-size, --batch-size and --top-k must be at least 1")
        fmt = choose_format(output_path, self.output_format)
        if self.encoding is not None and fmt != "csv":
            raise JobError(f"--encoding is for CSV and TSV outputs; a {fmt} output is written as its format says")
        return fmt


def run_job(
    input_path: str | Path,
    output_path: str | Path,
    index_dir: str | Path,
    *,
    runner: Runner,
    resolver=None,
    restart: bool = False,
    on_progress: Progress | None = None,
    on_job: Callable[[dict], None] | None = None,
    **options: Any,
) -> JobResult:
    """Run (or resume) the normalize job writing ``output_path`` on ``runner``; see the module docstring.

    ``resolver``: one already opened in this process (benchmarks, tests), which the local runner resolves with
    instead of one opened for the job. ``on_job(job)`` is called once the job record is known (new or resumed).
    ``options``: :class:`JobOptions`' fields by name.
    """
    started = time.perf_counter()
    opts = JobOptions(**options)
    input_path, output_path, index_dir = Path(input_path).resolve(), Path(output_path).resolve(), Path(index_dir)
    if resolver is not None and runner.name != "local":
        raise ValueError("an opened resolver runs in this process: it is for the local runner only")
    # one concrete backend for the whole job, named here: it is recorded, and every resolver of the job,
    # wherever it runs, gets the name rather than falling back to its own environment
    opened = getattr(resolver, "bi", None)
    chosen = getattr(opened, "plan", None) or plan(getattr(opened, "backend", None) or opts.backend, runner.device)
    fmt = opts.output_format_checked(output_path)
    check_input_file(input_path, "input file")
    if output_path == input_path:
        raise ValueError("--out must not be the input file")
    runner.require()  # before reading (and fingerprinting) anything, and before any job is recorded
    db_url = settings.database_url(index_dir, opts.db)
    if (locked := store.read_only(db_url)) is not None:
        raise JobError(f"cannot record the job in {locked}: it is read-only here; normalize with a writable copy of "
                       "the index, or give --db a writable store")
    numbers, profile, fields, located = _index_settings(index_dir, db_url, opts.numbers, opts.profile)
    catalog_columns = choose_catalog_columns(opts.catalog_columns, fields)
    ident = index_identity(index_dir, opts.model, opts.cross_model, profile)
    policy = Policy(min_probability=opts.min_probability, margin=opts.margin, top_k=opts.top_k, numbers=numbers,
                    explain=opts.explain, catalog_columns=catalog_columns, coordinates=opts.coordinates,
                    coordinate_columns=located)
    reader, chunks, rows_total = open_input(
        input_path, address_column=opts.address_column, id_column=opts.id_column, max_chars=ident["max_chars"],
        chunk_size=opts.chunk_size, name_column=opts.name_column,
    )
    fp, newlines = fingerprint_input(input_path)
    if rows_total is None:
        rows_total = max(newlines - 1, 0)  # estimate for the ETA: records can span lines
    columns = result_columns(opts.explain, catalog_columns, opts.coordinates)
    params = {
        "address_column": reader.address_column, "id_column": reader.id_column, "name_column": reader.name_column,
        "min_probability": opts.min_probability, "margin": opts.margin, "top_k": opts.top_k,
        "chunk_size": opts.chunk_size, "batch_size": opts.batch_size, "output_format": fmt,
        "model_path": ident["model_path"], "cross_model_path": ident["cross_model_path"],
        "output_columns": list(columns),  # parts of a job must all have the same columns
        "backend": chosen.backend, "numbers": numbers, "raw_values": opts.raw_values, "profile": profile,
        "plan": str(chosen),  # how its models compute (mgeo_index.runtime.plan): recorded, the backend compared
        "encoding": output_encoding(opts.encoding, reader.encoding) if fmt == "csv" else "utf-8",
    }
    writer = PartWriter(fmt, output_path, list(reader.columns), raw=opts.raw_values, columns=columns,
                        encoding=params["encoding"])
    # the URL itself goes to the resolvers, not the driver's environment or index.json: they may run elsewhere
    resolving = Resolving(index_dir=index_dir, device=runner.device, db=db_url, model=ident["model_path"],
                          cross_model=ident["cross_model_path"], backend=chosen.backend, policy=policy,
                          batch_size=opts.batch_size)
    eng = store.connect(db_url)
    try:
        job = _start_or_resume(eng, input_path, output_path, index_dir, fp, params, ident, fmt, runner.name, rows_total,
                               restart)
        if on_job:
            on_job(job)
        result = JobResult(job_id=job["id"], output=str(output_path), output_format=fmt, runner=runner.name,
                           resumed_from=job["rows_done"], profile=profile, numbers=numbers)
        task = lambda: resolve_task(resolving, resolver=resolver, chunk_size=opts.chunk_size,  # noqa: E731
                                    workers=runner.workers)
        return _execute(eng, job, writer, chunks, runner, task, resolving, result, on_progress, rows_total, started)
    finally:
        eng.dispose()


def _execute(eng, job: dict, writer: PartWriter, chunks, runner: Runner, task: Callable[[], Task], resolving: Resolving,
             result: JobResult, on_progress: Progress | None, rows_total: int, started: float) -> JobResult:
    """The job's chunks resolved and written (:func:`_run`), its record updated on success, Ctrl-C and failure; a
    job found complete (only the clean-up was left) just cleaned up."""
    result.counts = {s: int(job[s]) for s in STATUSES}
    if job["status"] == "complete":  # finished earlier, only the clean-up was left
        result.rows, result.already_complete = job["rows_done"], True
        shutil.rmtree(parts_dir(writer.out, job["id"]), ignore_errors=True)
        return result
    spent = lambda: (job["seconds"] or 0.0) + time.perf_counter() - started  # noqa: E731 - all runs together
    try:
        _run(eng, job, writer, chunks, runner, task(), resolving, result, on_progress or (lambda *_: None), rows_total)
    except KeyboardInterrupt:
        store.update_job(eng, job["id"], status="interrupted", seconds=spent(),
                         error="interrupted (Ctrl-C); the same command resumes")
        raise
    except BaseException as exc:
        store.update_job(eng, job["id"], status="failed", seconds=spent(), error=f"{type(exc).__name__}: {exc}")
        raise
    store.update_job(eng, job["id"], seconds=spent())
    result.seconds = time.perf_counter() - started
    done_now = result.rows - result.resumed_from
    result.rows_per_second = done_now / result.seconds if result.seconds > 0 else 0.0
    return result


def _index_settings(index_dir: Path, db_url: str, numbers: str | None, profile: str | None
                    ) -> tuple[str, str, list[str], tuple[str | None, str | None]]:
    """The job's number policy and profile: as given, else the ones the index's catalog was built with, else the
    defaults (:func:`mgeo_index.query.resolver.index_numbers`, :func:`mgeo_index.settings.profile`); and the
    catalog's other columns (what ``--catalog-columns`` may name) and its coordinate columns as ``build`` named them."""
    from mgeo_index.catalog.index_json import read_descriptor
    from mgeo_index.query.resolver import index_numbers

    eng = store.connect(db_url)
    try:
        catalog = read_descriptor(index_dir)["catalog"]
        return (index_numbers(eng, {"catalog": catalog}, numbers),
                settings.profile(profile, store.catalog_profile(eng, catalog))[0], store.catalog_fields(eng, catalog),
                store.catalog_coordinate_columns(eng, catalog))
    finally:
        eng.dispose()


def _start_or_resume(eng, input_path: Path, output_path: Path, index_dir: Path, fp: str, params: dict, ident: dict,
                     fmt: str, runner: str, rows_total: int, restart: bool) -> dict:
    here = {"host": socket.gethostname(), "pid": os.getpid(), "runner": runner}
    prev = store.latest_job(eng, str(output_path))
    if prev is not None and prev["status"] not in ("complete", "abandoned"):
        state = effective_status(prev)
        if state == "running":
            raise JobError(
                f"job {prev['id']} writing {output_path} is running right now (pid {prev['pid']} on {prev['host']}); "
                "wait for it, or stop it first"
            )
        if restart:
            store.update_job(eng, prev["id"], status="abandoned", error="abandoned by --restart")
            shutil.rmtree(parts_dir(output_path, prev["id"]), ignore_errors=True)
        else:
            problems = _resume_problems(prev, fp, params, ident, index_dir)
            if problems:
                raise JobError(
                    f"cannot resume job {prev['id']} ({prev['rows_done']:,} rows done): " + "; ".join(problems)
                    + ". Pass --restart to discard it and start over."
                )
            store.update_job(eng, prev["id"], status="running", error=None, runs=prev["runs"] + 1,
                             input_path=str(input_path), **here)
            return store.get_job(eng, prev["id"])
    elif prev is not None and prev["status"] == "complete":
        leftover = parts_dir(output_path, prev["id"])
        if leftover.exists() and prev["input_fingerprint"] == fp and not restart:
            return prev  # killed between marking complete and removing the parts
    job_id = store.create_job(
        eng, kind="normalize", status="running", input_path=str(input_path), input_fingerprint=fp,
        input_format=input_format(input_path), output_path=str(output_path), output_format=fmt, params=params,
        index_dir=str(index_dir.resolve()), build_id=ident["build_id"], index_file=ident["index_file"],
        model_fingerprint=ident["model_fingerprint"], cross_model_fingerprint=ident["cross_model_fingerprint"],
        rows_total=rows_total, runs=1, **here,
    )
    return store.get_job(eng, job_id)


def _run(eng, job: dict, writer: PartWriter, chunks, runner: Runner, task: Task, resolving: Resolving, result: JobResult,
         progress: Progress, rows_total: int) -> None:
    out = writer.out
    pdir = parts_dir(out, job["id"])
    pdir.mkdir(parents=True, exist_ok=True)
    seq, done = job["parts_done"], job["rows_done"]
    # Parts written after the last checkpoint (the run died before recording them) are redone.
    recorded = {c["part_file"] for c in store.job_checkpoints(eng, job["id"])}
    for path in pdir.iterdir():
        if path.name not in recorded:
            path.unlink()
    missing = [name for name in sorted(recorded) if not (pdir / name).is_file()]
    if missing:
        raise JobError(f"job {job['id']}: part files {missing[:3]} are missing from {pdir}; pass --restart to start over")

    def pending(skip: int = done) -> Iterator[Chunk]:
        consumed = 0
        for chunk in chunks():
            n = len(chunk.records)
            if consumed + n <= skip:
                consumed += n
                continue
            if consumed < skip:
                raise JobError(f"job {job['id']}: its checkpoint ({skip} rows) is not at a chunk boundary of this input")
            consumed += n
            yield chunk

    for chunk, outcomes in resolve_chunks(runner, pending(), task, resolving.batch_size):
        results = _merge_results(chunk, outcomes)
        counts = dict.fromkeys(STATUSES, 0)
        for r in results:
            counts[r["status"]] += 1
        seq += 1
        name = part_name(seq, writer.fmt)
        size = writer.write_part(pdir / name, chunk, results)
        done += len(chunk.records)
        store.add_checkpoint(eng, job["id"], seq=seq, rows_end=done, rows=len(chunk.records), part_file=name,
                             part_bytes=size, counts=counts)
        crashpoint("job-part", seq)  # tests: die with this part recorded, the rest not done
        for s in STATUSES:
            result.counts[s] += counts[s]
        progress(len(chunk.records), rows_total)

    result.rows = done
    writer.merge([pdir / part_name(i, writer.fmt) for i in range(1, seq + 1)])
    store.update_job(eng, job["id"], status="complete", rows_total=done, finished_at=store._utcnow())
    shutil.rmtree(pdir, ignore_errors=True)


def _merge_results(chunk: Chunk, outcomes: list[dict]) -> list[dict]:
    valid = iter(outcomes)
    results = []
    for record in chunk.records:
        results.append(next(valid) if record.reason is None else rejected(record.reason))
    if next(valid, None) is not None:
        raise RuntimeError("more resolver results than valid rows")  # a bug, never expected
    return results


def list_jobs(index_dir: str | Path, db: str | None = None, limit: int | None = None) -> list[dict]:
    """The store's jobs, newest first, each with ``state`` (``effective_status``)."""
    eng = store.connect(settings.database_url(index_dir, db))
    try:
        return [{**job, "state": effective_status(job)} for job in store.list_jobs(eng, limit)]
    finally:
        eng.dispose()
