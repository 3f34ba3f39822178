"""The engine a job runs on, picked by name (``--engine local|ray``), and :func:`normalize_file`, which
runs a job on the engine named. The job itself (:mod:`~mgeo_index.normalize.job`) only ever sees an
:class:`~mgeo_index.normalize.job.Engine`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mgeo_index.normalize.job import Engine, JobResult, run_job
from mgeo_index.normalize.local import local_engine
from mgeo_index.normalize.ray import ray_engine

ENGINES = ("local", "ray")


def make_engine(name: str, *, device: str | None = None, backend: str | None = None, resolver=None,
                ray_address: str | None = None, workers: int | None = None, gpus_per_worker: float = 0.0) -> Engine:
    """The engine called ``name``: ``local`` (``device``, an already opened ``resolver``) or ``ray``
    (``ray_address``, ``workers``, ``gpus_per_worker``; ``backend`` is checked against GPU actors)."""
    if name == "local":
        return local_engine(device=device, resolver=resolver)
    if name == "ray":
        return ray_engine(device=device, backend=backend, address=ray_address, workers=workers,
                          gpus_per_worker=gpus_per_worker)
    raise ValueError(f"engine must be 'local' or 'ray', not {name!r}")


def normalize_file(
    input_path: str | Path,
    output_path: str | Path,
    index_dir: str | Path,
    *,
    engine: str = "local",
    device: str | None = None,
    backend: str | None = None,
    resolver=None,
    ray_address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float = 0.0,
    **options: Any,
) -> JobResult:
    """Run (or resume) the normalize job writing ``output_path`` on the engine named ``engine``.

    ``resolver``: an already opened resolver for the local engine (benchmarks, tests).
    ``backend``: the CPU inference backend of the job's resolvers, local or Ray actors (default:
    ``settings.backend``; actors with a GPU always run ``torch``).
    ``options``: the job's own (:func:`~mgeo_index.normalize.job.run_job`): ``db``, ``model``,
    ``cross_model``, ``address_column``, ``id_column``, ``min_probability``, ``margin``, ``top_k``,
    ``output_format``, ``chunk_size``, ``batch_size``, ``restart``, ``on_progress``, ``on_job``.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be 'local' or 'ray', not {engine!r}")
    if backend is not None:
        from mgeo_index.runtime.backends import check  # not at import time: it loads torch

        check(backend)
    chosen = make_engine(engine, device=device, backend=backend, resolver=resolver, ray_address=ray_address,
                         workers=workers, gpus_per_worker=gpus_per_worker)
    return run_job(input_path, output_path, index_dir, engine=chosen, backend=backend, **options)
