"""A job's resolving as a runner task (:mod:`mgeo_index.compute`): each chunk's valid queries (addresses, with
the places' names where the input has a name column) resolved and decided
(:func:`~mgeo_index.jobs.policy.resolve_outcomes`), by a resolver opened once per process or actor.

Where several workers compute at once (worker processes, or Ray with more than one actor), a chunk is cut into
micro-batches of ``batch_size`` addresses, smaller where that leaves a worker without two (:func:`spread`), one
actor call each, so that a small input still spreads over the workers; in one process the whole chunk is one
item, so repeats across the chunk are resolved once and micro-batches are full.
Either way every address is resolved by the same code with the same policy and results do not depend on what an
address is batched with, so both runners write the same rows.
"""
from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from mgeo_index.compute.task import Task
from mgeo_index.jobs.inputs import Chunk
from mgeo_index.jobs.policy import MEMO_LIMIT, Policy, forget_oldest, resolve_outcomes
from mgeo_index.text import query_key

CHUNKS_PER_WORKER = 4  # chunks' worth of micro-batches per Ray actor in one window


# One item of work: (addresses, names), the names "" where a row has none.
Queries = tuple[list[str], list[str]]


def resolve_task(resolving, *, resolver=None, chunk_size: int, workers: int = 1) -> Task:
    """Outcomes of :data:`Queries`. ``resolver``: one already opened in this process (benchmarks, tests), used
    by the local runner instead of one opened for the job. ``workers``: the runner's; with several, the actors keep
    no answers (:func:`resolve_chunks` keeps them here and hands a worker no address twice)."""

    def local():
        opened = resolver
        if opened is None:
            from mgeo_index.query.resolver import open_resolver

            opened = open_resolver(resolving.index_dir, db=resolving.db, model=resolving.model,
                                   cross_model=resolving.cross_model, device=resolving.device,
                                   backend=resolving.backend)
        memo: dict[str, dict] = {}  # answers of this run, reused for later repeats
        return lambda queries: resolve_outcomes(opened, queries[0], resolving.policy, resolving.batch_size, memo,
                                                names=queries[1])

    kwargs = {"index_dir": str(Path(resolving.index_dir).resolve()), "db": resolving.db, "model": resolving.model,
              "cross_model": resolving.cross_model, "device": resolving.device, "backend": resolving.backend,
              "policy": asdict(resolving.policy), "batch_size": resolving.batch_size, "remember": workers == 1}
    per_chunk = -(-max(chunk_size, 1) // max(resolving.batch_size, 1))
    return Task(local=local, actor=ResolveBatch, kwargs=kwargs, gpus=True, side_by_side=False,
                pack=lambda queries: {"addresses": list(queries[0]), "names": list(queries[1])},
                unpack=lambda queries, row: json.loads(row["outcomes"]),
                items_per_actor=CHUNKS_PER_WORKER * per_chunk)


def spread(rows: int, batch_size: int, workers: int) -> int:
    """Addresses per item when ``workers`` compute a chunk of ``rows`` at once: micro-batches of ``batch_size``, cut
    smaller where that gives every worker at least two (so a small input keeps all of them busy)."""
    return max(1, min(batch_size, -(-rows // (2 * workers))))


def resolve_chunks(runner, chunks: Iterator[Chunk], task: Task, batch_size: int) -> Iterator[tuple[Chunk, list[dict]]]:
    """``(chunk, outcomes of its valid rows)`` in input order, as each chunk is done, on ``runner``.

    One worker gets whole chunks (its own memo answers repeats). Several get micro-batches of the distinct addresses
    (as the resolver reads them) that no earlier item carried: each is resolved by one worker once, and its answer
    given here to every row that has it, in this chunk or a later one (the last ``MEMO_LIMIT`` answers kept)."""
    fine = runner.workers > 1
    owners: deque[tuple[Chunk, list[str], int]] = deque()  # chunks handed to the runner: (chunk, keys, items)
    answers: dict[str, dict | None] = {}  # several workers: each query's outcome, None while it is computed

    def items() -> Iterator[Queries]:
        for chunk in chunks:
            addresses, names = chunk.valid_queries()
            if not fine:
                parts, keys = [(addresses, names)] if addresses else [], []
            else:
                keys = [query_key(a, n) for a, n in zip(addresses, names)]
                todo: dict[str, tuple[str, str]] = {}
                for key, address, name in zip(keys, addresses, names):
                    if key not in answers and key not in todo:
                        todo[key] = (address, name)
                answers.update(dict.fromkeys(todo))
                pending, size = list(todo.values()), spread(len(todo), batch_size, runner.workers)
                parts = [([a for a, _ in pending[i : i + size]], [n for _, n in pending[i : i + size]])
                         for i in range(0, len(pending), size)]
            owners.append((chunk, keys, len(parts)))
            yield from parts

    def complete(collected: list[dict]) -> tuple[Chunk, list[dict]]:
        chunk, keys, _ = owners.popleft()
        if not fine:
            return chunk, collected
        outcomes = [dict(answers[key]) for key in keys]
        if len(answers) > MEMO_LIMIT:  # none a chunk in hand still needs (those computed now among them)
            forget_oldest(answers, keep={key for _, waiting, _ in owners for key in waiting})
        return chunk, outcomes

    def finished() -> Iterator[tuple[Chunk, list[dict]]]:  # the chunks at the front that wait for no item
        while owners and owners[0][2] == 0:
            yield complete([])

    collected: list[dict] = []
    got = 0
    for part, outcomes in runner.map(items(), task):
        yield from finished()
        if fine:
            answers.update(zip((query_key(a, n) for a, n in zip(*part)), outcomes))
        collected += outcomes
        got += 1
        if got == owners[0][2]:
            yield complete(collected)
            collected, got = [], 0
    yield from finished()
    if owners:
        raise RuntimeError(f"the runner returned no results for {len(owners)} chunks")  # a bug, never expected


class ResolveBatch:
    """The actor of Ray and of worker processes: one resolver per actor, one :data:`Queries` per call."""

    def __init__(self, index_dir: str, db: str | None, model: str, cross_model: str, device: str,
                 backend: str | None, policy: dict, batch_size: int, remember: bool = True) -> None:
        from mgeo_index.query.resolver import open_resolver

        self.resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device,
                                      backend=backend)
        self.policy = Policy(**policy)
        self.batch_size = batch_size
        # this actor's answers, reused for repeated addresses in later calls (not where the driver keeps them)
        self.memo: dict[str, dict] | None = {} if remember else None

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        outcomes = [json.dumps(resolve_outcomes(self.resolver, [str(a) for a in addresses], self.policy,
                                                self.batch_size, self.memo, names=[str(n) for n in names]),
                               ensure_ascii=False)
                    for addresses, names in zip(batch["addresses"], batch["names"])]
        return {"seq": np.asarray(batch["seq"]), "outcomes": np.asarray(outcomes, dtype=object)}
