"""Build and refresh a review queue: which queries a person should look at, with their candidates
computed once, up front, so that taking a decision never runs a model.

A queue is named after what it reviews: ``job:<id>`` (the ``ambiguous`` / ``unmatched`` rows of a
normalize job, and those whose probability is below a threshold) or ``file:<sha256 of the file, 12
hex>`` (every non-empty line of a queries file). Its items live in the store
(:mod:`mgeo_index.store.reviews`), so several reviewers share one queue and a restart loses nothing.
Each item records the cross-encoder that scored it (its fingerprint); pending items scored by another
model than the loaded one (after ``adapt``) are scored again when the queue is opened.
"""
from __future__ import annotations

import csv
import hashlib
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import select, update

from mgeo_index import settings, store
from mgeo_index.jobs.parts import RESULT_PREFIX
from mgeo_index.jobs.policy import RESULT_COLUMNS
from mgeo_index.review.uncertainty import disagreement, margin
from mgeo_index.text import model_text, printable, query_key, with_name

if TYPE_CHECKING:
    from mgeo_index.api import AddressIndex

DEFAULT_BELOW = 0.9  # job rows whose best probability is below this are reviewed even when "matched"
CANDIDATES_SHOWN = 5  # candidates retrieved and shown per review item
REVIEW_STATUSES = ("ambiguous", "unmatched")  # job rows always reviewed ("rejected" rows have nothing to match)
BATCH = 64  # queries resolved per call while building a queue

Progress = Callable[[int, int], None]  # (items done in this step, items to do)


@dataclass(frozen=True)
class QueueInfo:
    """What :func:`open_queue` did: the queue's name, items added and re-scored, and the counts after."""

    name: str
    added: int
    rescored: int
    counts: dict[str, int]
    model_version: str


def queue_name(*, job: int | None = None, file: str | Path | None = None) -> str:
    """``job:<id>`` for a normalize job, ``file:<12 hex of the file's sha256>`` for a queries file (the same
    contents give the same queue wherever the file lies; an edited file starts a new one)."""
    if (job is None) == (file is None):
        raise ValueError("review one normalize job (--job) or one queries file (--file)")
    if job is not None:
        return f"job:{int(job)}"
    if not Path(file).is_file():
        raise FileNotFoundError(f"queries file {file} does not exist")
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return f"file:{digest.hexdigest()[:12]}"


def model_version(index: "AddressIndex") -> str:
    """The loaded cross-encoder's fingerprint: the model version each item and label records."""
    cross = index.cross_encoder
    if cross is None:
        raise ValueError("the review queue needs the cross-encoder: open the index with rerank=True")
    return cross.fingerprint


# --------------------------------------------------------------------------- what to review


#: a row to review: (data row from 1, address, place name or None)
Row = tuple[int, str, "str | None"]


def file_queries(path: str | Path) -> list[Row]:
    """(line number from 1, text, None) of every non-empty line of a UTF-8 queries file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"queries file {path} does not exist")
    text = path.read_bytes().decode("utf-8-sig", errors="replace")
    return [(n, printable(line.strip()), None) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def job_queries(engine, job_id: int, below: float = DEFAULT_BELOW) -> list[Row]:
    """(data row from 1, address, name) of the rows of normalize job ``job_id``'s output worth a look: status
    ``ambiguous`` or ``unmatched``, or a best probability below ``below``; the name from the job's name column
    (``normalize --name-column``), None without one or where the row has none."""
    job = store.get_job(engine, job_id)
    if job is None:
        raise ValueError(f"no normalize job {job_id} in this store (mgeo-index jobs lists them)")
    if job["status"] != "complete":
        raise ValueError(f"job {job_id} is {job['status']}: finish it first (run the same normalize command again)")
    out_path = Path(job["output_path"])
    if not out_path.is_file():
        raise FileNotFoundError(f"job {job_id}'s output {out_path} is gone")
    params = job.get("params") or {}
    out = []
    rows = _job_rows(out_path, job["output_format"], params.get("address_column"), params.get("encoding") or "utf-8",
                     params.get("name_column"))
    for row, (address, name, status, probability) in enumerate(rows, 1):
        below_threshold = probability not in (None, "") and float(probability) < below
        if status in REVIEW_STATUSES or (status == "matched" and below_threshold):
            out.append((row, printable(address or ""), printable(str(name or "")).strip() or None))
    return out


def _job_rows(path: Path, fmt: str, address_column: str | None, encoding: str = "utf-8",
              name_column: str | None = None) -> Iterator[tuple[str, Any, str, Any]]:
    """(address, name or None, status, probability) of each row of a job output, in any of its formats (CSV/TSV in the job's
    ``encoding``, JSON Lines, Parquet, xlsx). The result columns come after the input's, ``status`` first
    (``mgeo_status`` where the input has a ``status`` column), whatever follows them (``match_<column>``,
    ``explain``)."""
    if fmt == "parquet":
        from mgeo_index.jobs.inputs import require_pyarrow

        require_pyarrow()
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        yield from _pick(table.column_names, zip(*(c.to_pylist() for c in table.columns)), address_column, name_column)
        return
    if fmt == "xlsx":
        from openpyxl import load_workbook

        rows = load_workbook(path, read_only=True).active.iter_rows(values_only=True)
        yield from _pick(["" if v is None else str(v) for v in next(rows, ())],
                         (["" if v is None else v for v in r] for r in rows), address_column, name_column)
        return
    if fmt == "jsonl":
        with open(path, encoding="utf-8") as fh:
            first = [json.loads(line) for line in itertools.islice(fh, 1)]
            header = list(first[0]) if first else []
            lines = itertools.chain(first, (json.loads(line) for line in fh))
            yield from _pick(header, ([obj.get(c) for c in header] for obj in lines), address_column, name_column)
        return
    with open(path, encoding=encoding, newline="") as fh:
        reader = csv.reader(fh, delimiter="\t" if path.suffix.lower() in (".tsv", ".tab") else ",")
        yield from _pick(next(reader, []), reader, address_column, name_column)


def _pick(header: list[str], rows, address_column: str | None, name_column: str | None = None
          ) -> Iterator[tuple[str, Any, str, Any]]:
    # the job's columns follow the input's: the last status column is the job's (prefixed where the input has one)
    prefix = RESULT_PREFIX if RESULT_PREFIX + "status" in header else ""
    status_at = len(header) - 1 - header[::-1].index(prefix + "status")
    probability_at = status_at + RESULT_COLUMNS.index("probability") - RESULT_COLUMNS.index("status")
    address_at = header.index(address_column) if address_column in header[:status_at] else 0
    name_at = header.index(name_column) if name_column in header[:status_at] else None
    for values in rows:
        if len(values) == len(header):
            yield (values[address_at], None if name_at is None else values[name_at], values[status_at],
                   values[probability_at])


# --------------------------------------------------------------------------- scoring


def score_items(index: "AddressIndex", rows: Sequence[Row], *, top_k: int = CANDIDATES_SHOWN,
                batch_size: int = BATCH, on_progress: Progress | None = None) -> list[dict[str, Any]]:
    """Queue items for (row, query, name) rows: the ``top_k`` explained candidates of each query (resolved with its
    name, as its job resolved it), its margin (over the candidates' probabilities in ranked order) and the network /
    feature-head disagreement on its best candidate. An item's ``query_normalized`` is the text the scorer read (the
    address with its name after it): what a decision labels, and the key reviewers' confirmations are found by."""
    from mgeo_index.query.labelling import component_probabilities

    version = model_version(index)
    resolver = index.resolver
    out: list[dict[str, Any]] = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        queries, names = [q for _, q, _ in batch], [n for _, _, n in batch]
        matches = index.resolve(queries, top_k=top_k, explain=True, names=names)
        read = [model_text(with_name(q, n)) for q, n in zip(queries, names)]
        best = [(i, read[i], model_text(m[0].address)) for i, m in enumerate(matches) if m]
        spread = np.zeros(len(batch))
        if best:
            network, head = component_probabilities(index.cross_encoder, [a for _, a, _ in best], [b for _, _, b in best],
                                                    device=resolver.device)
            for j, (i, _, _) in enumerate(best):
                spread[i] = disagreement(network[j], None if head is None else head[j])
        for (row, query, name), text, found, dis in zip(batch, read, matches, spread):
            candidates = [m.to_dict() for m in found]
            probs = np.array([[(c.get("probabilities") or {}).get(label, 0.0) for label in settings.LABELS]
                              for c in candidates]).reshape(len(candidates), len(settings.LABELS))
            out.append({"row": row, "query": query, "name": name, "query_normalized": text,
                        "candidates": candidates, "model_version": version, "margin": margin(probs),
                        "disagreement": float(dis)})
        if on_progress:
            on_progress(len(batch), len(rows))
    return out


def rescore_stale(index: "AddressIndex", queue: str, *, top_k: int = CANDIDATES_SHOWN,
                  on_progress: Progress | None = None) -> int:
    """Score again the pending items of ``queue`` that another model scored (the active model changed:
    ``adapt``). Each update is conditional on the item still being pending at the version read, so a
    decision taken meanwhile is never overwritten. Returns how many items were re-scored."""
    from mgeo_index.store.reviews import ReviewItem

    engine = index.resolver.engine
    version = model_version(index)
    with engine.connect() as conn:
        stale = conn.execute(select(ReviewItem.id, ReviewItem.row, ReviewItem.query, ReviewItem.name, ReviewItem.version,
                                    ReviewItem.margin)
                             .where(ReviewItem.queue == queue, ReviewItem.status == "pending",
                                    ReviewItem.model_version != version).order_by(ReviewItem.id)).all()
    if not stale:
        return 0
    fresh = score_items(index, [(r.row, r.query, r.name) for r in stale], top_k=top_k, on_progress=on_progress)
    changed = 0
    with engine.begin() as conn:
        for old, new in zip(stale, fresh):
            changed += conn.execute(update(ReviewItem).where(
                ReviewItem.id == old.id, ReviewItem.status == "pending", ReviewItem.version == old.version).values(
                candidates=new["candidates"], model_version=version, disagreement=new["disagreement"],
                margin=-1.0 if old.margin < 0 else new["margin"],  # an undone item stays first
                version=ReviewItem.version + 1)).rowcount
    return changed


def open_queue(index: "AddressIndex", *, job: int | None = None, file: str | Path | None = None,
               below: float = DEFAULT_BELOW, top_k: int = CANDIDATES_SHOWN,
               on_progress: Callable[[str, int, int], None] | None = None) -> QueueInfo:
    """Build or refresh the queue of a normalize job or a queries file: items not in it yet are resolved
    and added (a query text already in the queue is not added twice), pending items scored by another
    model are re-scored. ``on_progress(step, advance, total)`` with step ``score`` or ``rescore``."""
    engine = index.resolver.engine
    name = queue_name(job=job, file=file)
    wanted = job_queries(engine, job, below) if job is not None else file_queries(file)
    known = store.queue_rows(engine, name)
    seen: set[str] = set()
    todo = []
    for row, query, place in wanted:
        key = query_key(query, place)
        if key in seen:
            continue
        seen.add(key)
        if row not in known:
            todo.append((row, query, place))
    step = (lambda n, total: on_progress("score", n, total)) if on_progress else None
    added = store.add_review_items(engine, name, score_items(index, todo, top_k=top_k, on_progress=step)) if todo else 0
    restep = (lambda n, total: on_progress("rescore", n, total)) if on_progress else None
    rescored = rescore_stale(index, name, top_k=top_k, on_progress=restep)
    return QueueInfo(name=name, added=added, rescored=rescored, counts=store.review_counts(engine, name),
                     model_version=model_version(index))
