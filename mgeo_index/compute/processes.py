"""Items computed in worker processes on this machine: the local runner with ``--workers N``.

Each worker is a fresh Python process (``spawn``: nothing of this process's torch, OpenMP or database state is
inherited) that builds the task's actor once, as a Ray actor is built (:class:`~mgeo_index.compute.task.Task`), and
computes one item per call with ``threads`` torch threads. On a small model several processes use a CPU's cores
better than one process's intra-op threads: the Python around the network (parsing, pair features) holds one
interpreter's lock, and the network's small matrices gain little from a second thread. Results are those of the
local runner in one process, since the actor computes an item exactly as the task's local function does.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from mgeo_index.compute.task import Task

AHEAD = 2  # items handed to each worker before the first result is awaited: none waits while another is read

_actor = None  # the task's actor, built once in each worker process
_failure: BaseException | None = None  # why it could not be built: raised by each call, so it reaches the caller


def _start(actor: type, kwargs: dict[str, Any], threads: int) -> None:
    global _actor, _failure
    os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch is first imported in this worker
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import torch

        torch.set_num_threads(threads)
        _actor = actor(**kwargs)
    except Exception as exc:  # noqa: BLE001 - a failing initializer would only break the pool, its reason lost
        _failure = exc


def _call(row: dict[str, Any]) -> dict[str, Any]:
    """One item through the actor, in the one-row batch shape Ray Data gives it."""
    if _failure is not None:
        raise _failure
    out = _actor({key: [value] for key, value in row.items()})
    return {key: values[0] for key, values in out.items()}


def in_processes(task: Task, items: Iterable[Any], workers: int, threads: int = 1) -> Iterator[tuple[Any, Any]]:
    """``(item, result)`` for each item, in order, computed by ``workers`` processes of ``threads`` torch threads
    each, no more than ``AHEAD`` items per worker ahead of the consumer (so an input is read as it is consumed)."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start,
                               initargs=(task.actor, task.kwargs, threads))
    pending: collections.deque = collections.deque()

    def result(item: Any, future) -> tuple[Any, Any]:
        try:
            return item, task.unpack(item, future.result())
        except BrokenProcessPool:
            raise RuntimeError(f"a worker process died (out of memory?); run again with fewer --workers "
                               f"(each of the {workers} loads its own model and index)") from None

    finished = False
    try:
        for seq, item in enumerate(items):
            pending.append((item, pool.submit(_call, {"seq": seq, **task.pack(item)})))
            if len(pending) >= AHEAD * workers:
                yield result(*pending.popleft())
        while pending:
            yield result(*pending.popleft())
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=not finished)
