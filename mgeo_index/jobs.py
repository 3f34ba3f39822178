"""`mgeo-index normalize`: tie every row of a file to the catalog, as a resumable job in the store.

A job reads the input (CSV/TSV through :mod:`mgeo_index.catalog`, or Parquet) in chunks of
``chunk_size`` records, resolves the valid addresses with the shared resolver in micro-batches of
``batch_size``, and writes each chunk's output rows to a *part file* (written aside, fsynced and
renamed into place). Only then is the part recorded as a checkpoint in the store, in the same
transaction that advances the job's ``rows_done``. A killed job (Ctrl-C, ``kill -9``, a crash)
therefore leaves at most one unrecorded part, which the next run deletes; it skips the recorded
records (re-reading, not re-resolving them) and carries on. When every record is done the parts
are concatenated into the output file (aside, then renamed), the job is marked complete and the
parts are removed, so the output has every input row exactly once, in input order.

The job remembers what its rows depend on: the input's fingerprint (SHA-256 of the whole file),
the parameters, the index build and both model fingerprints. Resuming with any of them changed
is refused with a message naming both values (``--restart`` starts over instead).

Decisions (see README): the best candidate (``resolve``'s first match) is *matched* when its label is
not ``not_match`` and its probability is at least ``min_probability``; *ambiguous* when it would be
matched but the runner-up's relevance (P(exact) + ½·P(partial)) is within ``margin`` of the best's, or
above it; else *unmatched*.
Rows that fail validation are *rejected* with the reason.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from mgeo_index import settings, store
from mgeo_index.catalog import (
    CatalogError,
    CatalogReader,
    _resolve_column,
    detect_address_column,
    read_catalog,
)
from mgeo_index.text import has_content, normalize

STATUSES = ("matched", "ambiguous", "unmatched", "rejected")
#: the input address's standardized admin levels (mgeo_index.text.parser), inferred levels included
ADMIN_COLUMNS = tuple(f"admin_{level}{suffix}" for level in ("province", "city", "district") for suffix in ("", "_code"))
RESULT_COLUMNS = ("status", "match_id", "match_address", "label", "probability", "alternatives", "reason") + ADMIN_COLUMNS
RESULT_PREFIX = "mgeo_"  # added to the result columns when the input already has a column of that name
DEFAULT_MIN_PROBABILITY = 0.5
#: ambiguous when the runner-up's relevance (P(exact) + ½·P(partial)) is within this of the best's
DEFAULT_MARGIN = 0.1
DEFAULT_TOP_K = 10
DEFAULT_CHUNK_SIZE = 8192
DEFAULT_BATCH_SIZE = 1024
ALTERNATIVES = 3
PARQUET_SUFFIXES = (".parquet", ".pq")
# Parameters that change the output rows: a job resumes only when they are all the same.
RESULT_PARAMS = ("address_column", "id_column", "min_probability", "margin", "top_k", "chunk_size", "batch_size", "output_format",
                 "output_columns", "backend")  # backends agree on labels, on probabilities to about 1e-3: not mixed
STALE_AFTER = timedelta(minutes=2)  # a running job on another host with no checkpoint for this long may be resumed

# on_progress(rows_advanced, rows_total_estimate), after each chunk of this run (rows done by earlier
# runs are in the job passed to on_job: rows_done)
Progress = Callable[[int, int | None], None]


class JobError(Exception):
    """A job cannot start or resume as asked (changed input/index/model, already running, …)."""


@dataclass(frozen=True)
class Policy:
    min_probability: float = DEFAULT_MIN_PROBABILITY
    margin: float = DEFAULT_MARGIN
    top_k: int = DEFAULT_TOP_K


@dataclass
class JobResult:
    job_id: int
    output: str
    output_format: str
    engine: str
    rows: int = 0  # input records in the output
    resumed_from: int = 0  # records already done when this run started
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    seconds: float = 0.0  # this run
    rows_per_second: float = 0.0  # records resolved by this run / its seconds
    already_complete: bool = False


# --------------------------------------------------------------------------- decisions


def relevance(match: dict) -> float:
    """Expected relevance for the ambiguity margin: P(exact) + ½·P(partial) (retrieval score without a reranker)."""
    p = match.get("probabilities")
    if not p:
        return float(match.get("score") or 0.0)
    return float(p.get("exact_match", 0.0)) + 0.5 * float(p.get("partial_match", 0.0))


def _public_id(match: dict) -> str:
    return str(match["source_id"]) if match.get("source_id") not in (None, "") else str(match["id"])


def decide(matches: Sequence[dict], policy: Policy) -> dict[str, Any]:
    """The output fields of one resolved row from its ranked matches (best first)."""
    alternatives = [
        {
            "id": _public_id(m),
            "entry_id": m["id"],
            "address": m["address"],
            "label": m.get("label"),
            "probability": m.get("probability"),
            "score": m.get("score"),
        }
        for m in matches[:ALTERNATIVES]
    ]
    out: dict[str, Any] = {
        "status": "unmatched", "match_id": "", "match_address": "", "label": "", "probability": None,
        "alternatives": json.dumps(alternatives, ensure_ascii=False), "reason": "",
    }
    if not matches:
        return out
    best = matches[0]
    out["label"] = best.get("label", "")
    out["probability"] = best.get("probability")
    if best.get("label") == "not_match" or (best.get("probability") or 0.0) < policy.min_probability:
        return out
    close = len(matches) > 1 and relevance(best) - relevance(matches[1]) < policy.margin
    out.update(status="ambiguous" if close else "matched", match_id=_public_id(best), match_address=best["address"])
    return out


def resolve_outcomes(resolver, addresses: Sequence[str], policy: Policy, batch_size: int = DEFAULT_BATCH_SIZE) -> list[dict]:
    """``decide`` for each address, resolved in micro-batches of ``batch_size`` (both engines
    cut the same micro-batches, so their results are identical row for row)."""
    out: list[dict] = []
    for start in range(0, len(addresses), batch_size):
        batch = list(addresses[start : start + batch_size])
        out.extend(decide(m, policy) for m in resolver.resolve(batch, top_k=policy.top_k, rerank=True))
    return out


def ray_actor_device(device: str | None, gpus_per_worker: float) -> str:
    """Where a Ray actor computes: CUDA when it is given GPUs, else ``device`` or the CPU (not the
    driver's default: actors of a remote cluster need not look like the driver)."""
    return "cuda" if gpus_per_worker > 0 else (device or "cpu")


def micro_batches(addresses: Sequence[str], batch_size: int) -> list[list[str]]:
    return [list(addresses[i : i + batch_size]) for i in range(0, len(addresses), batch_size)]


# --------------------------------------------------------------------------- input


@dataclass(slots=True)
class Record:
    line: int  # CSV: physical line (header = 1); Parquet: 1-based row number
    values: list[Any]  # the input columns, in order
    address: str | None  # set when the row is valid
    reason: str | None = None  # set when it is rejected


@dataclass
class Chunk:
    records: list[Record]
    table: Any = None  # Parquet input: the chunk's own Arrow table (keeps the input's column types)

    def valid_addresses(self) -> list[str]:
        return [r.address for r in self.records if r.reason is None]


def fingerprint_input(path: str | Path) -> tuple[str, int]:
    """(``sha256:<hex>`` of the whole file, number of newline bytes) in one pass."""
    digest, lines = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            lines += block.count(b"\n")
    return f"sha256:{digest.hexdigest()}", lines


def input_format(path: str | Path) -> str:
    return "parquet" if Path(path).suffix.lower() in PARQUET_SUFFIXES else "csv"


def _require_pyarrow():
    import importlib

    try:
        importlib.import_module("pyarrow.parquet")
    except ImportError:  # pragma: no cover - depends on the environment
        raise JobError("Parquet needs pyarrow: pip install 'mgeo-index[parquet]'") from None


class ParquetReader(CatalogReader):
    """Parquet input with the catalog reader's column detection and row validation (its
    ``_check``); values are validated as text, the output keeps the input's column types."""

    def __init__(self, path: str | Path, *, address_column: str | None = None, id_column: str | None = None,
                 max_chars: int = 256, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:  # noqa: D107
        _require_pyarrow()
        import pyarrow.parquet as pq

        self.path = Path(path)
        if not self.path.is_file():
            raise CatalogError(f"input file {str(self.path)!r} does not exist")
        self.max_chars, self.chunk_size, self.dedupe = max_chars, chunk_size, False
        self.encoding, self.delimiter = "utf-8", "\t"
        try:
            self.file = pq.ParquetFile(self.path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
            raise CatalogError(f"{self.path} is not a readable Parquet file: {exc}") from None
        self.schema = self.file.schema_arrow
        self.columns = list(self.schema.names)
        self.rows_total = self.file.metadata.num_rows
        if not self.rows_total:
            raise CatalogError(f"input file {str(self.path)!r} has no rows")
        first = next(self.file.iter_batches(batch_size=200))
        sample = list(zip(*(_as_text(first.column(i).to_pylist()) for i in range(first.num_columns))))
        self.address_column = (
            _resolve_column(address_column, self.columns, "address") if address_column is not None
            else detect_address_column(self.columns, sample)
        )
        self.id_column = None if id_column is None else _resolve_column(id_column, self.columns, "id")

    def record_chunks(self) -> Iterator[Chunk]:
        import pyarrow as pa

        n = len(self.columns)
        addr_i = self.columns.index(self.address_column)
        id_i = None if self.id_column is None else self.columns.index(self.id_column)
        extra = [(i, c) for i, c in enumerate(self.columns) if i not in (addr_i, id_i)]
        line = 0
        for batch in self.file.iter_batches(batch_size=self.chunk_size):
            texts = list(zip(*(_as_text(batch.column(i).to_pylist()) for i in range(n))))
            records = []
            for fields in texts:
                line += 1
                fields = list(fields)
                outcome = self._check(fields, line, "\t".join(fields), n, addr_i, id_i, extra, {})
                records.append(_record(outcome, fields))
            yield Chunk(records, pa.Table.from_batches([batch], schema=self.schema))


def _as_text(values: list) -> list[str]:
    return ["" if v is None else v if isinstance(v, str) else str(v) for v in values]


def _record(outcome, values: list) -> Record:
    if hasattr(outcome, "reason"):  # a Reject
        return Record(outcome.line, values, None, outcome.reason)
    if not has_content(normalize(outcome.address)):
        return Record(outcome.line, values, None, "address has no letters or digits left after normalization")
    return Record(outcome.line, values, outcome.address)


def _csv_chunks(reader: CatalogReader) -> Iterator[Chunk]:
    columns = reader.columns
    addr_i = columns.index(reader.address_column)
    id_i = None if reader.id_column is None else columns.index(reader.id_column)
    for rows, rejects in reader.chunks():
        records = []
        for row in rows:
            values = [row.extra.get(c, "") for c in columns]
            values[addr_i] = row.address
            if id_i is not None:
                values[id_i] = row.source_id or ""
            records.append(_record(row, values))
        for rej in rejects:
            records.append(Record(rej.line, _split_raw(rej.raw, reader.delimiter, len(columns)), None, rej.reason))
        records.sort(key=lambda r: r.line)
        yield Chunk(records)


def _split_raw(raw: str, delimiter: str, n: int) -> list[str]:
    """A rejected record's fields for the output's input columns (padded / cut to ``n``)."""
    try:
        fields = next(csv.reader(io.StringIO(raw), delimiter=delimiter), [])
    except csv.Error:
        fields = [raw]
    return (list(fields) + [""] * n)[:n]


def open_input(path: Path, *, address_column: str | None, id_column: str | None, max_chars: int, chunk_size: int):
    """(reader, chunk iterator factory, exact row count or None)."""
    if input_format(path) == "parquet":
        reader = ParquetReader(path, address_column=address_column, id_column=id_column, max_chars=max_chars, chunk_size=chunk_size)
        return reader, reader.record_chunks, reader.rows_total
    reader = read_catalog(path, address_column=address_column, id_column=id_column, max_chars=max_chars,
                          chunk_size=chunk_size, dedupe=False)
    return reader, (lambda: _csv_chunks(reader)), None


# --------------------------------------------------------------------------- output


class PartWriter:
    """Writes one chunk's output rows as a part file (aside, fsync, rename) and merges parts."""

    def __init__(self, fmt: str, out: Path, input_columns: list[str]) -> None:
        self.fmt, self.out = fmt, out
        self.input_columns = input_columns
        prefix = RESULT_PREFIX if set(RESULT_COLUMNS) & set(input_columns) else ""
        self.result_columns = [prefix + c for c in RESULT_COLUMNS]
        self.delimiter = "\t" if out.suffix.lower() in (".tsv", ".tab") else ","
        if fmt == "parquet":
            _require_pyarrow()

    def header(self) -> list[str]:
        return self.input_columns + self.result_columns

    def write_part(self, path: Path, chunk: Chunk, results: list[dict]) -> int:
        tmp = path.with_name(path.name + ".tmp")
        if self.fmt == "parquet":
            self._write_parquet(tmp, chunk, results)
        else:
            with open(tmp, "w", encoding="utf-8", newline="") as fh:
                writer = csv.writer(fh, delimiter=self.delimiter, lineterminator="\n")
                for record, res in zip(chunk.records, results):
                    writer.writerow(_as_text(record.values) + [_cell(res[c]) for c in RESULT_COLUMNS])
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        return path.stat().st_size

    def _result_arrays(self, results: list[dict]):
        import pyarrow as pa

        arrays = []
        for c in RESULT_COLUMNS:
            values = [r[c] for r in results]
            if c == "probability":
                arrays.append(pa.array(values, type=pa.float64()))
            else:
                arrays.append(pa.array([v or "" for v in values], type=pa.string()))
        return arrays

    def _write_parquet(self, tmp: Path, chunk: Chunk, results: list[dict]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if chunk.table is not None:
            inputs = list(chunk.table.columns)
        else:
            inputs = [pa.array([_text(r.values[i]) for r in chunk.records], type=pa.string())
                      for i in range(len(self.input_columns))]
        table = pa.Table.from_arrays(inputs + self._result_arrays(results), names=self.header())
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())

    def merge(self, parts: list[Path]) -> None:
        """Concatenate the parts into the output (aside, then renamed into place)."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(f".{self.out.name}.tmp")
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            writer = None
            try:
                for part in parts:
                    pf = pq.ParquetFile(part)
                    if writer is None:
                        writer = pq.ParquetWriter(tmp, pf.schema_arrow)
                    for i in range(pf.num_row_groups):
                        writer.write_table(pf.read_row_group(i))
            finally:
                if writer is not None:
                    writer.close()
        else:
            with open(tmp, "w", encoding="utf-8", newline="") as dst:
                csv.writer(dst, delimiter=self.delimiter, lineterminator="\n").writerow(self.header())
                dst.flush()
                for part in parts:
                    with open(part, encoding="utf-8", newline="") as src:
                        shutil.copyfileobj(src, dst, 1 << 20)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.out)


def _text(v: Any) -> str:
    return "" if v is None else v if isinstance(v, str) else str(v)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6f}"
    return str(v)


def parts_dir(out: Path, job_id: int) -> Path:
    return out.parent / f".{out.name}.job{job_id}.parts"


def _part_name(seq: int, fmt: str) -> str:
    return f"part-{seq:06d}.{'parquet' if fmt == 'parquet' else 'csv'}"


# --------------------------------------------------------------------------- index identity


def index_identity(index_dir: str | Path, model=None, cross_model=None) -> dict[str, Any]:
    """What a job's rows depend on besides the input: the index build and both models'
    fingerprints (read from disk, no weights loaded). Same model defaulting and the same
    refusal as :func:`mgeo_index.resolver.open_resolver`."""
    from mgeo_index.build import read_manifest
    from mgeo_index.model.manifest import fingerprint, read_manifest as model_manifest
    from mgeo_index.resolver import ModelMismatch

    manifest = read_manifest(index_dir)
    recorded = manifest.get("model_path")
    if model is None and settings.env("MODEL") is None and recorded and Path(recorded).is_dir():
        model = recorded
    bi_path, cross_path = settings.bi_model_path(model), settings.cross_model_path(cross_model)
    bi_manifest = model_manifest(bi_path, "bi-encoder")
    model_manifest(cross_path, "cross-encoder")
    bi_fp = fingerprint(bi_path)
    if bi_fp != manifest["model_fingerprint"]:
        raise ModelMismatch(
            f"the index in {index_dir} was built with model {manifest['model_fingerprint']} ({recorded}), "
            f"but the query model {bi_path} is {bi_fp}. Use --model {recorded} or rebuild the index with this model."
        )
    max_length = bi_manifest.get("max_length")
    if not max_length:
        from mgeo_index.model.bi_encoder import load_bi_encoder

        max_length = load_bi_encoder(bi_path).max_length
    return {
        "build_id": manifest.get("build_id"),
        "index_file": manifest.get("index_file"),
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
               if old.get(k) != params.get(k) and (k in old or k != "backend")]  # jobs from before it was recorded
    if changed:
        problems.append("parameters differ: " + ", ".join(changed))
    was = (job["build_id"], job["index_file"], job["model_fingerprint"], job["cross_model_fingerprint"])
    now = (ident["build_id"], ident["index_file"], ident["model_fingerprint"], ident["cross_model_fingerprint"])
    if was != now:
        problems.append(
            f"job {job['id']} was started over {_identity_text(*was)}, but {index_dir} now gives {_identity_text(*now)}; "
            "resume with the original index and models"
        )
    return problems


# --------------------------------------------------------------------------- the job


def normalize_file(
    input_path: str | Path,
    output_path: str | Path,
    index_dir: str | Path,
    *,
    db: str | None = None,
    model: str | Path | None = None,
    cross_model: str | Path | None = None,
    device: str | None = None,
    backend: str | None = None,
    address_column: str | None = None,
    id_column: str | None = None,
    min_probability: float = DEFAULT_MIN_PROBABILITY,
    margin: float = DEFAULT_MARGIN,
    top_k: int = DEFAULT_TOP_K,
    output_format: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int = DEFAULT_BATCH_SIZE,
    engine: str = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float = 0.0,
    restart: bool = False,
    resolver=None,
    on_progress: Progress | None = None,
    on_job: Callable[[dict], None] | None = None,
) -> JobResult:
    """Run (or resume) the normalize job writing ``output_path``; see the module docstring.

    ``resolver``: an already opened resolver for the local engine (benchmarks, tests).
    ``backend``: the CPU inference backend of the job's resolvers, local or Ray actors (default:
    ``settings.backend``; actors with a GPU always run ``torch``).
    ``on_job(job)`` is called once the job record is known (new or resumed).
    """
    started = time.perf_counter()
    input_path, output_path, index_dir = Path(input_path).resolve(), Path(output_path).resolve(), Path(index_dir)
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', not {engine!r}")
    # one concrete backend for the whole job, named here: it is recorded, and Ray actors get the name
    # rather than falling back to their own environment
    run_device = ray_actor_device(device, gpus_per_worker) if engine == "ray" else settings.device(device)
    if backend is not None:
        from mgeo_index.backends import check  # not at import time: it loads torch

        check(backend)
        if engine == "ray" and gpus_per_worker > 0 and backend != "torch":
            raise ValueError(f"--backend {backend} is for the CPU; GPU actors (--gpus-per-worker) run torch (FP16)")
    backend = getattr(getattr(resolver, "bi", None), "backend", None) or settings.backend(backend, run_device)
    if not 0.0 <= min_probability <= 1.0 or not 0.0 <= margin <= 1.0:
        raise ValueError("--min-probability and --ambiguous-margin must be between 0 and 1")
    if chunk_size < 1 or batch_size < 1 or top_k < 1:
        raise ValueError("--chunk-size, --batch-size and --top-k must be at least 1")
    fmt = output_format or ("parquet" if output_path.suffix.lower() in PARQUET_SUFFIXES else "csv")
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"--format must be csv or parquet, not {fmt!r}")
    if not input_path.is_file():
        raise FileNotFoundError(f"input file {input_path} does not exist")
    if output_path == input_path:
        raise ValueError("--out must not be the input file")
    progress = on_progress or (lambda *_: None)
    policy = Policy(min_probability=min_probability, margin=margin, top_k=top_k)

    ident = index_identity(index_dir, model, cross_model)
    reader, chunks, rows_total = open_input(
        input_path, address_column=address_column, id_column=id_column, max_chars=ident["max_chars"], chunk_size=chunk_size
    )
    fp, newlines = fingerprint_input(input_path)
    if rows_total is None:
        rows_total = max(newlines - 1, 0)  # estimate for the ETA: records can span lines
    params = {
        "address_column": reader.address_column, "id_column": reader.id_column, "min_probability": min_probability,
        "margin": margin, "top_k": top_k, "chunk_size": chunk_size, "batch_size": batch_size, "output_format": fmt,
        "model_path": ident["model_path"], "cross_model_path": ident["cross_model_path"],
        "output_columns": list(RESULT_COLUMNS),  # parts of a job must all have the same columns
        "backend": backend,
    }
    writer = PartWriter(fmt, output_path, list(reader.columns))

    # the URL itself goes to the resolvers, not the driver's environment or index.json: Ray actors may run elsewhere
    db_url = settings.database_url(index_dir, db)
    eng = store.connect(db_url)
    try:
        job = _start_or_resume(eng, input_path, output_path, index_dir, fp, params, ident, fmt, engine, rows_total, restart)
        if on_job:
            on_job(job)
        result = JobResult(job_id=job["id"], output=str(output_path), output_format=fmt, engine=engine,
                           resumed_from=job["rows_done"])
        result.counts = {s: int(job[s]) for s in STATUSES}
        if job["status"] == "complete":  # finished earlier, only the clean-up was left
            result.rows, result.already_complete = job["rows_done"], True
            shutil.rmtree(parts_dir(output_path, job["id"]), ignore_errors=True)
            return result
        spent = lambda: (job["seconds"] or 0.0) + time.perf_counter() - started  # noqa: E731 - all runs together
        try:
            _run(eng, job, writer, chunks, policy, params, ident, result, progress, rows_total,
                 engine=engine, index_dir=index_dir, db=db_url, device=device, backend=backend, resolver=resolver,
                 ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker)
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
    finally:
        eng.dispose()


def _start_or_resume(eng, input_path: Path, output_path: Path, index_dir: Path, fp: str, params: dict, ident: dict,
                     fmt: str, engine: str, rows_total: int, restart: bool) -> dict:
    here = {"host": socket.gethostname(), "pid": os.getpid(), "engine": engine}
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


def _run(eng, job: dict, writer: PartWriter, chunks, policy: Policy, params: dict, ident: dict, result: JobResult,
         progress: Progress, rows_total: int, *, engine: str, index_dir: Path, db, device, backend, resolver, ray_address,
         workers, gpus_per_worker) -> None:
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

    if engine == "ray":
        from mgeo_index.jobs_ray import ray_outcomes

        resolved = ray_outcomes(
            pending(), policy=policy, batch_size=params["batch_size"], index_dir=index_dir, db=db,
            model=ident["model_path"], cross_model=ident["cross_model_path"], device=device, backend=backend,
            address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker,
        )
    else:
        if resolver is None:
            from mgeo_index.resolver import open_resolver

            resolver = open_resolver(index_dir, db=db, model=ident["model_path"], cross_model=ident["cross_model_path"],
                                     device=device, backend=backend)
        resolved = ((c, resolve_outcomes(resolver, c.valid_addresses(), policy, params["batch_size"])) for c in pending())

    for chunk, outcomes in resolved:
        results = _merge_results(chunk, outcomes)
        _add_admin(chunk, results)
        counts = dict.fromkeys(STATUSES, 0)
        for r in results:
            counts[r["status"]] += 1
        seq += 1
        name = _part_name(seq, writer.fmt)
        size = writer.write_part(pdir / name, chunk, results)
        done += len(chunk.records)
        store.add_checkpoint(eng, job["id"], seq=seq, rows_end=done, rows=len(chunk.records), part_file=name,
                             part_bytes=size, counts=counts)
        for s in STATUSES:
            result.counts[s] += counts[s]
        progress(len(chunk.records), rows_total)

    result.rows = done
    writer.merge([pdir / _part_name(i, writer.fmt) for i in range(1, seq + 1)])
    store.update_job(eng, job["id"], status="complete", rows_total=done, finished_at=store._utcnow())
    shutil.rmtree(pdir, ignore_errors=True)


def _merge_results(chunk: Chunk, outcomes: list[dict]) -> list[dict]:
    valid = iter(outcomes)
    results = []
    for record in chunk.records:
        if record.reason is None:
            results.append(next(valid))
        else:
            results.append({"status": "rejected", "match_id": "", "match_address": "", "label": "",
                            "probability": None, "alternatives": "", "reason": record.reason})
    if next(valid, None) is not None:
        raise RuntimeError("more resolver results than valid rows")  # a bug, never expected
    return results


def _add_admin(chunk: Chunk, results: list[dict]) -> None:
    """Fill the admin columns from the parsed input addresses (one batched parse per chunk)."""
    from mgeo_index.text.parser import parse

    valid_rows = [i for i, r in enumerate(chunk.records) if r.reason is None]  # valid_addresses() order
    for res in results:
        res.update(dict.fromkeys(ADMIN_COLUMNS, ""))
    for i, p in zip(valid_rows, parse(chunk.valid_addresses())):
        results[i].update({column: p["admin"][column.removeprefix("admin_")] or "" for column in ADMIN_COLUMNS})


def list_jobs(index_dir: str | Path, db: str | None = None, limit: int | None = None) -> list[dict]:
    """The store's jobs, newest first, each with ``state`` (``effective_status``)."""
    eng = store.connect(settings.database_url(index_dir, db))
    try:
        return [{**job, "state": effective_status(job)} for job in store.list_jobs(eng, limit)]
    finally:
        eng.dispose()

