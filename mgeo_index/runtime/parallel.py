"""Batches computed side by side on CPU threads, one torch intra-op thread each.

On this project's CPUs the tagger's and the encoders' matrices are small (a few hundred rows of 128–1,024
columns): a second intra-op thread gains 1.1–1.4×, while two batches at once, each on one thread, keep both
cores busy (torch's kernels release the GIL). Results are those of one batch at a time, since parsing is FP32
and the CPU backends are batch-independent (:mod:`mgeo_index.runtime.attention`, :mod:`mgeo_index.runtime.quant`).
"""
from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def side_by_side(device: str, threads: int | None = None) -> int:
    """How many batches to compute at once on ``device``: one on a GPU, else ``threads`` or torch's thread count
    (all cores, unless ``OMP_NUM_THREADS`` or ``torch.set_num_threads`` said otherwise)."""
    import torch

    return 1 if str(device).startswith("cuda") else max(1, threads or torch.get_num_threads())


def in_threads(compute: Callable[[T], Any], batches: Iterable[T], threads: int) -> Iterator[tuple[T, Any]]:
    """``(batch, compute(batch))`` for each batch, in order, ``threads`` batches computed side by side (torch
    then runs one intra-op thread in each: its kernels release the GIL) and no more than ``threads`` ahead of the
    consumer, so a store iterator is read as it is consumed; the thread count is restored afterwards."""
    if threads <= 1:
        for batch in batches:
            yield batch, compute(batch)
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="mgeo-batch") as pool:
            pending: collections.deque = collections.deque()
            for batch in batches:
                pending.append((batch, pool.submit(compute, batch)))
                if len(pending) >= threads:
                    done, future = pending.popleft()
                    yield done, future.result()
            while pending:
                done, future = pending.popleft()
                yield done, future.result()
    finally:
        torch.set_num_threads(before)
