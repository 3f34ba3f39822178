"""The Ray runner (``build``, ``add`` and ``normalize --runner ray``): items computed on Ray Data actor pools, and
the Ray plumbing under it.

- :class:`RayRunner`: ``workers`` actors on the cluster at ``address`` (else a local Ray), each with
  ``gpus_per_worker`` GPUs for the tasks that want them, or one CPU;
- :func:`import_ray`: Ray Data, or the one-line install hint;
- :func:`start`: join the cluster at ``--ray-address`` (probed first, so that an unreachable address is one
  clear error within seconds instead of Ray's two minutes of retries ending in ``SystemExit``) or start a
  local Ray; then check that the cluster has the GPUs the actors ask for (Ray Data would otherwise wait
  for them forever);
- :func:`map_ordered`: an actor pool (``ActorPoolStrategy``: each actor built once, so it loads its models
  once) over a list of items, one item per actor call, the output rows yielded in input order as they come.

Nothing here imports Ray at import time.
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Iterator
from typing import Any

from mgeo_index.compute.task import Task

INSTALL_HINT = "the Ray runner (--runner ray) needs Ray Data: pip install 'mgeo-index[ray]' (ray[data] and pyarrow)"
PROBE_SECONDS = 5.0  # a cluster address that does not answer a TCP connect within this is refused
CLIENT_PORT = 10001  # Ray Client's default port (ray://HOST)
GCS_PORT = 6379  # the head's default GCS port (HOST)
ENV_VARS = ("TRITON_INTERPRET", "MGEO_INDEX_DB", "MGEO_INDEX_DEVICE")  # passed on to a local Ray's workers


class RayUnavailable(ConnectionError):
    """The Ray cluster named by ``--ray-address`` cannot be reached (or none runs where ``auto`` looks)."""


def import_ray():
    """The ``ray`` module with Ray Data loaded, or an :class:`ImportError` naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return ray


def check_options(workers: int | None, gpus_per_worker: float) -> None:
    """Refuse worker counts and GPU shares no pool can have (before anything starts)."""
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be at least 1, not {workers}")
    if gpus_per_worker < 0:
        raise ValueError(f"--gpus-per-worker must be 0 (CPU actors) or more, not {gpus_per_worker:g}")


def default_workers(address: str | None, workers: int | None) -> int:
    """``workers``, else one actor on a cluster and one per CPU on a local Ray."""
    return workers or (1 if address else max(os.cpu_count() or 1, 1))


def actor_device(device: str | None, gpus_per_worker: float) -> str:
    """Where a Ray actor computes: CUDA when it is given GPUs, else ``device`` or the CPU (not the driver's
    default: actors of a remote cluster need not look like the driver)."""
    return "cuda" if gpus_per_worker > 0 else (device or "cpu")


def probe(address: str) -> None:
    """Raise :class:`RayUnavailable` unless something accepts a TCP connection at ``address``
    (``HOST:PORT`` of the head's GCS, or ``ray://HOST[:PORT]`` of Ray Client); ``auto`` and ``local`` are
    left to Ray."""
    if address in ("auto", "local"):
        return
    client = address.startswith("ray://")
    target = address[len("ray://"):] if client else address
    target = target.split("/", 1)[0]
    host, sep, port = target.rpartition(":")
    if not sep or not host:
        host, port = target, str(CLIENT_PORT if client else GCS_PORT)
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_SECONDS).close()
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise RayUnavailable(
            f"cannot reach the Ray cluster at {address} ({reason}). Start it there (`ray start --head`), "
            f"or give the head's HOST:PORT (GCS, default port {GCS_PORT}) or ray://HOST:{CLIENT_PORT} (Ray Client); "
            f"without --ray-address a local Ray is started"
        ) from None


def start(ray, address: str | None, workers: int, gpus_per_worker: float = 0.0) -> None:
    """Join the cluster at ``address`` or start a local Ray (once per process: a Ray already started here is
    kept), then check that it has the GPUs ``workers`` actors of ``gpus_per_worker`` GPUs each need."""
    if address:
        probe(address)
    if not ray.is_initialized():
        logging.getLogger("ray").setLevel(logging.WARNING)
        try:
            if address:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            else:
                env = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
                ray.init(num_cpus=max(workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING, runtime_env={"env_vars": env} if env else None)
        except ConnectionError as exc:
            raise RayUnavailable(f"cannot join the Ray cluster at {address}: {exc}") from None
    if gpus_per_worker > 0:
        have = float(ray.cluster_resources().get("GPU", 0.0))
        need = workers * gpus_per_worker
        if have < need:
            where = f"the Ray cluster at {address}" if address else "the local Ray (this machine)"
            raise ValueError(
                f"--gpus-per-worker {gpus_per_worker:g} with {workers} workers needs {need:g} GPUs; {where} has "
                f"{have:g}. Use fewer workers, a smaller share, or --gpus-per-worker 0 (CPU actors)"
            )


def map_ordered(ray, items: list[dict[str, Any]], actor: type, kwargs: dict[str, Any], *, workers: int,
                gpus_per_worker: float = 0.0) -> Iterator[dict[str, Any]]:
    """The output row of ``actor`` for each item, in input order, each as soon as it and every item before
    it are done. Items carry ``seq``: their position; the actor returns it with its output (one input row,
    one output row). One Ray Data execution, on a pool of ``workers`` actors (fewer for fewer items), each
    with ``gpus_per_worker`` GPUs or one CPU."""
    if not items:
        return
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ds = ray.data.from_items(items, override_num_blocks=min(len(items), workers * 4)).map_batches(
        actor,
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(items))),
        fn_constructor_kwargs=kwargs,
        **({"num_gpus": gpus_per_worker} if gpus_per_worker else {"num_cpus": 1}),
    )
    pending: dict[int, dict[str, Any]] = {}
    expected = 0
    for row in ds.iter_rows():
        pending[int(row["seq"])] = row
        while expected in pending:
            yield pending.pop(expected)
            expected += 1
    if expected != len(items):
        raise RuntimeError(f"Ray returned {expected + len(pending)} of {len(items)} batches in order")


class RayRunner:
    """Computes on Ray Data actor pools: ``workers`` actors on the cluster at ``address`` (else a local Ray), each
    with ``gpus_per_worker`` GPUs (tasks that want them) or one CPU, on ``device`` (CUDA with GPUs). Items go in
    windows (one Ray Data execution each, ``workers × task.items_per_actor`` items), each actor call computing
    exactly one item, so results are those of the local runner."""

    name = "ray"

    def __init__(self, *, device: str | None = None, backend: str | None = None, address: str | None = None,
                 workers: int | None = None, gpus_per_worker: float = 0.0) -> None:
        check_options(workers, gpus_per_worker)
        if backend is not None and gpus_per_worker > 0 and backend != "torch":
            raise ValueError(f"--backend {backend} is for the CPU; GPU actors (--gpus-per-worker) run torch (FP16)")
        self.address = address
        self.workers = default_workers(address, workers)
        self.gpus_per_worker = float(gpus_per_worker)
        self.device = actor_device(device, gpus_per_worker)
        self.ray = None

    def require(self) -> None:
        """Raise (with the install hint) unless Ray Data can be imported here."""
        import_ray()

    def start(self) -> None:
        """Join the cluster or start a local Ray and check its GPUs (once)."""
        if self.ray is None:
            ray = import_ray()
            start(ray, self.address, self.workers, self.gpus_per_worker)
            self.ray = ray

    def describe(self) -> dict[str, Any]:
        return {"runner": self.name, "device": self.device, "workers": self.workers,
                "gpus_per_worker": self.gpus_per_worker, **({"ray_address": self.address} if self.address else {})}

    def map(self, items: Iterable[Any], task: Task) -> Iterator[tuple[Any, Any]]:
        """``(item, result)`` for each item, in order, window by window."""
        self.start()
        size = self.workers * max(task.items_per_actor, 1)
        window: list[Any] = []
        for item in items:
            window.append(item)
            if len(window) >= size:
                yield from self._window(window, task)
                window = []
        if window:
            yield from self._window(window, task)

    def _window(self, window: list[Any], task: Task) -> Iterator[tuple[Any, Any]]:
        rows = [{"seq": i, **task.pack(item)} for i, item in enumerate(window)]
        done = map_ordered(self.ray, rows, task.actor, task.kwargs, workers=self.workers,
                           gpus_per_worker=self.gpus_per_worker if task.gpus else 0.0)
        for item, row in zip(window, done):
            yield item, task.unpack(item, row)
