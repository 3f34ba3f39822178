"""Batches computed side by side on CPU threads, one torch intra-op thread each.

On this project's CPUs the tagger's and the encoders' matrices are small (a few hundred rows of 128–1,024
columns): a second intra-op thread gains 1.1–1.4×, while two batches at once, each on one thread, keep both
cores busy (torch's kernels release the GIL). Results are those of one batch at a time, since parsing is FP32
and the CPU backends are batch-independent (:mod:`mgeo_index.runtime.attention`, :mod:`mgeo_index.runtime.quant`).
"""
from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def side_by_side(device: str, threads: int | None = None) -> int:
    """How many batches to compute at once on ``device``: one on a GPU, else ``threads`` or torch's thread count
    (all cores, unless ``OMP_NUM_THREADS`` or ``torch.set_num_threads`` said otherwise)."""
    import torch

    return 1 if str(device).startswith("cuda") else max(1, threads or torch.get_num_threads())


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the block, then restored: this thread's, and the count a
    thread that first computes meanwhile takes up (torch keeps one per OpenMP thread).

    With one, a side thread computes without an OpenMP thread pool of its own. That matters where another thread
    does the real work: libgomp, managing more threads than there are cores, lets every pool's idle threads sleep
    at once, and each parallel region of the working thread then waits for a wake-up. The cross-encoder on 8
    pairs took 16 ms instead of 4.5 ms (2-core machine) in a thread that computed after a model was loaded in
    another with two threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_blas_thread() -> None:
    """numpy's BLAS (every BLAS loaded in this process but torch's and FAISS's own) on one thread.

    An OpenBLAS that spread a call over its threads keeps the idle ones spinning for a while afterwards; on a small
    machine they take the cores from the torch threads that compute next. numpy's multiplies here are small (the
    tagger's matrices, a query's vector against its candidates'): a warm one-query ``resolve`` over the CCKS
    catalog (2-core AVX512 machine) took 45–54 ms at p50 and 160–180 ms at p99 beside numpy's spinning threads,
    and a normalize job's rows/s do not move without them. FAISS's BLAS keeps its threads: a batch search of 256
    queries takes 27 ms with them and 52 ms on one. Called where a torch model gets its backend
    (:func:`mgeo_index.runtime.backends.apply`); libraries loaded later keep their own setting."""
    import os

    import torch
    from threadpoolctl import ThreadpoolController

    torch_dir = os.path.dirname(torch.__file__) + os.sep  # a torch built against a shared BLAS keeps its threads
    for library in ThreadpoolController().lib_controllers:
        if (library.user_api == "blas" and library.num_threads > 1 and not library.filepath.startswith(torch_dir)
                and not os.path.basename(os.path.dirname(library.filepath)).startswith("faiss")):  # faiss_cpu.libs
            library.set_num_threads(1)


def in_threads(compute: Callable[[T], Any], batches: Iterable[T], threads: int) -> Iterator[tuple[T, Any]]:
    """``(batch, compute(batch))`` for each batch, in order, ``threads`` batches computed side by side (torch
    then runs one intra-op thread in each: its kernels release the GIL) and no more than ``threads`` ahead of the
    consumer, so a store iterator is read as it is consumed; the thread count is restored afterwards."""
    if threads <= 1:
        for batch in batches:
            yield batch, compute(batch)
        return
    with torch_threads(1), ThreadPoolExecutor(threads, thread_name_prefix="mgeo-batch") as pool:
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append((batch, pool.submit(compute, batch)))
            if len(pending) >= threads:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
