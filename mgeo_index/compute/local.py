"""The local runner: every item computed in this process."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from mgeo_index import settings
from mgeo_index.compute.task import Task


class LocalRunner:
    """Computes in this process, on ``device``; on a CPU with several threads (torch's thread count, or
    ``threads``), that many items at a time for tasks that allow it, each on one thread (a tagger's or encoder's
    small matrices gain little from a second intra-op thread; two batches side by side use both cores)."""

    name = "local"
    workers = 1  # processes computing at once
    gpus_per_worker = 0.0

    def __init__(self, device: str | None = None, threads: int | None = None) -> None:
        from mgeo_index.runtime.parallel import side_by_side

        self.device = settings.device(device)
        self.threads = side_by_side(self.device, threads)

    def require(self) -> None:
        """Raise a clear error when the runner cannot run here (nothing to check for this one)."""

    def start(self) -> None:
        """Make the runner ready (nothing to start for this one)."""

    def describe(self) -> dict[str, Any]:
        """What a build records of where it ran (``builds.stats``)."""
        return {"engine": self.name, "device": self.device, "threads": self.threads}

    def map(self, items: Iterable[Any], task: Task) -> Iterator[tuple[Any, Any]]:
        """``(item, result)`` for each item, in order, as each is done."""
        from mgeo_index.runtime.parallel import in_threads

        return in_threads(task.local(), items, self.threads if task.side_by_side else 1)
