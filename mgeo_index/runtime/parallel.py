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


def one_blas_thread() -> None:
    """Every BLAS library loaded in this process but torch's own (numpy's OpenBLAS, FAISS's) on one thread.

    An OpenBLAS that spread a call over its threads keeps the idle ones spinning for a while afterwards; on a small
    machine they take the cores from the torch threads that compute next. A warm one-query ``resolve`` over the
    CCKS catalog (2-core AVX512 machine) took 45 ms at p50 and 180 ms at p99 beside them, 20 ms and 37 ms on
    one BLAS thread, while a normalize job's rows/s did not move: what numpy multiplies here (the tagger's
    matrices, a query's vector against its candidates') is small, and torch's threads do the heavy work. FAISS's
    OpenBLAS is an OpenMP build, so FAISS's own loops in the calling thread also run on one thread (a one-query
    search of 39,627 vectors: 1.3 ms instead of 2.4 ms). Called where a torch model gets its backend
    (:func:`mgeo_index.runtime.backends.apply`); libraries loaded later keep their own setting."""
    import os

    import torch
    from threadpoolctl import ThreadpoolController

    torch_dir = os.path.dirname(torch.__file__) + os.sep  # a torch built against a shared BLAS keeps its threads
    for library in ThreadpoolController().lib_controllers:
        if library.user_api == "blas" and library.num_threads > 1 and not library.filepath.startswith(torch_dir):
            library.set_num_threads(1)


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
