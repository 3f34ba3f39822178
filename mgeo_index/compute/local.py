"""The local runner: every item computed on this machine, in this process or in ``workers`` worker processes."""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from mgeo_index import settings
from mgeo_index.compute.task import Task


class LocalRunner:
    """Computes on this machine, on ``device``. With one worker (the default), in this process: on a CPU with
    several threads (torch's thread count, or ``threads``), that many items at a time for tasks that allow it,
    each on one thread (a tagger's or encoder's small matrices gain little from a second intra-op thread; two
    batches side by side use both cores). With ``workers`` above one (CPU only), in that many worker processes
    (:mod:`mgeo_index.compute.processes`), each building the task's actor once and sharing the CPU's cores."""

    name = "local"
    gpus_per_worker = 0.0

    def __init__(self, device: str | None = None, threads: int | None = None, workers: int | None = None) -> None:
        from mgeo_index.runtime.parallel import side_by_side

        if workers is not None and workers < 1:
            raise ValueError(f"--workers must be at least 1, not {workers}")
        self.device = settings.device(device)
        if (workers or 1) > 1 and self.device != "cpu":
            raise ValueError(f"--workers {workers} is for the CPU; on {self.device} one process computes")
        self.workers = workers or 1  # processes computing at once
        self.threads = (side_by_side(self.device, threads) if self.workers == 1
                        else worker_threads(self.workers, threads))

    def require(self) -> None:
        """Raise a clear error when the runner cannot run here (nothing to check for this one)."""

    def start(self) -> None:
        """Make the runner ready (nothing to start for this one: worker processes start with a map)."""

    def describe(self) -> dict[str, Any]:
        """What a build records of where it ran (``builds.stats``)."""
        return {"runner": self.name, "device": self.device, "threads": self.threads,
                **({"workers": self.workers} if self.workers > 1 else {})}

    def map(self, items: Iterable[Any], task: Task) -> Iterator[tuple[Any, Any]]:
        """``(item, result)`` for each item, in order, as each is done."""
        if self.workers > 1:
            from mgeo_index.compute.processes import in_processes

            return in_processes(task, items, self.workers, self.threads)
        from mgeo_index.runtime.parallel import in_threads

        return in_threads(task.local(), items, self.threads if task.side_by_side else 1)


def worker_threads(workers: int, threads: int | None = None) -> int:
    """torch threads per worker process: ``threads``, else the CPUs this process may use shared among them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, threads or cpus // workers)
