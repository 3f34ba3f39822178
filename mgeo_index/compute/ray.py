"""Ray Data plumbing shared by the Ray engines (``normalize --engine ray``, ``build --engine ray``).

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
from collections.abc import Iterator
from typing import Any

INSTALL_HINT = "the Ray engine needs Ray Data: pip install 'mgeo-index[ray]' (ray[data] and pyarrow)"
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
