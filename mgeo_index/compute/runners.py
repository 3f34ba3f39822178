"""The runner called by name: ``--runner local|ray`` of ``build``, ``add`` and ``normalize``."""
from __future__ import annotations

from mgeo_index.compute.local import LocalRunner
from mgeo_index.compute.ray import RayRunner

RUNNERS = ("local", "ray")
Runner = LocalRunner | RayRunner


def make_runner(name: str = "local", *, device: str | None = None, backend: str | None = None,
                ray_address: str | None = None, workers: int | None = None, gpus_per_worker: float = 0.0,
                threads: int | None = None) -> Runner:
    """The runner called ``name``, its options checked, nothing started: ``local`` on ``device`` (``threads``
    items side by side on a CPU, or ``workers`` worker processes), or ``ray`` (``ray_address``, ``workers``,
    ``gpus_per_worker``; ``device`` is then the CPU actors'; ``backend`` is checked against GPU actors)."""
    if name == "local":
        ray_only = [option for option, given in (("--ray-address", ray_address is not None),
                                                 ("--gpus-per-worker", bool(gpus_per_worker))) if given]
        if ray_only:
            raise ValueError(f"{', '.join(ray_only)} {'is' if len(ray_only) == 1 else 'are'} for --runner ray")
        return LocalRunner(device, threads, workers)
    if name == "ray":
        return RayRunner(device=device, backend=backend, address=ray_address, workers=workers,
                         gpus_per_worker=gpus_per_worker)
    raise ValueError(f"--runner must be local or ray, not {name!r}")
