""":func:`normalize_file`: a normalize job run (or resumed) on the runner named (``--runner local|ray``,
:mod:`mgeo_index.compute`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mgeo_index.compute.runners import RUNNERS, make_runner
from mgeo_index.jobs.job import JobResult, run_job


def normalize_file(
    input_path: str | Path,
    output_path: str | Path,
    index_dir: str | Path,
    *,
    runner: str = "local",
    device: str | None = None,
    backend: str | None = None,
    resolver=None,
    ray_address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float = 0.0,
    **options: Any,
) -> JobResult:
    """Run (or resume) the normalize job writing ``output_path`` on the runner named ``runner`` (``local``:
    ``workers`` worker processes, else this one; or ``ray``: ``ray_address``, ``workers``, ``gpus_per_worker``).

    ``resolver``: an already opened resolver for the local runner (benchmarks, tests).
    ``backend``: the CPU inference backend of the job's resolvers, local or Ray actors (default:
    the plan's, :func:`mgeo_index.runtime.plan.plan`; actors with a GPU always run ``torch``).
    ``options``: the job's own, :class:`~mgeo_index.jobs.job.JobOptions`' fields by name (``db``, ``model``,
    ``address_column``, ``top_k``, …), and ``restart``, ``on_progress``, ``on_job`` (:func:`~mgeo_index.jobs.job.run_job`).
    """
    if runner not in RUNNERS:
        raise ValueError(f"--runner must be local or ray, not {runner!r}")
    if backend is not None:
        from mgeo_index.runtime.backends import check  # not at import time: it loads torch

        check(backend)
    chosen = make_runner(runner, device=device, backend=backend, ray_address=ray_address, workers=workers,
                         gpus_per_worker=gpus_per_worker)
    return run_job(input_path, output_path, index_dir, runner=chosen, resolver=resolver, backend=backend, **options)
