"""The Ray Data engine for normalize jobs: the same micro-batches as the local engine, resolved by
``map_batches`` over an actor pool (each actor opens its own resolver: model + index replica).

The driver keeps reading, validating, writing parts and checkpointing exactly as the local engine
does; only the resolving moves to the actors. Input is sent in *windows* of chunks: each window is a
dataset whose rows are micro-batches (one list of addresses per row, ``batch_size=1``), so every
actor call resolves exactly the micro-batch the local engine would resolve, which makes the results
identical row for row. Each window re-creates the actor pool (Ray Data pools live as long as one
dataset execution), so windows are sized to keep the model loading small next to the work.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from mgeo_index import ray_pool
from mgeo_index.normalize.inputs import Chunk
from mgeo_index.normalize.job import Engine, Resolving
from mgeo_index.normalize.policy import Policy, micro_batches, resolve_outcomes

INSTALL_HINT = ray_pool.INSTALL_HINT
CHUNKS_PER_WORKER = 4  # chunks per actor in one window
_import_ray = ray_pool.import_ray
ray_actor_device = ray_pool.actor_device


def ray_engine(*, device: str | None = None, backend: str | None = None, address: str | None = None,
               workers: int | None = None, gpus_per_worker: float = 0.0) -> Engine:
    """The Ray engine: ``workers`` actors (on the cluster at ``address``, else a local Ray), each with
    ``gpus_per_worker`` GPUs, or a CPU and ``device``. Ray itself is imported when a job requires the engine,
    before the job is recorded."""
    ray_pool.check_options(workers, gpus_per_worker)
    if backend is not None and gpus_per_worker > 0 and backend != "torch":
        raise ValueError(f"--backend {backend} is for the CPU; GPU actors (--gpus-per-worker) run torch (FP16)")

    def outcomes(chunks: Iterator[Chunk], resolving: Resolving) -> Iterator[tuple[Chunk, list[dict]]]:
        return ray_outcomes(
            chunks, policy=resolving.policy, batch_size=resolving.batch_size, index_dir=resolving.index_dir,
            db=resolving.db, model=resolving.model, cross_model=resolving.cross_model, device=device,
            backend=resolving.backend, address=address, workers=workers, gpus_per_worker=gpus_per_worker,
        )

    return Engine(name="ray", device=ray_actor_device(device, gpus_per_worker), outcomes=outcomes, require=_import_ray)


class ResolveBatch:
    """The actor: one resolver per actor, one micro-batch per call."""

    def __init__(self, index_dir: str, db: str | None, model: str, cross_model: str, device: str,
                 backend: str | None, min_probability: float, margin: float, top_k: int) -> None:
        from mgeo_index.query.resolver import open_resolver

        self.resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device,
                                      backend=backend)
        self.policy = Policy(min_probability=min_probability, margin=margin, top_k=top_k)
        self.memo: dict[str, dict] = {}  # this actor's answers, reused for repeated addresses

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        outcomes = []
        for addresses in batch["addresses"]:
            addresses = [str(a) for a in addresses]
            found = resolve_outcomes(self.resolver, addresses, self.policy, batch_size=max(len(addresses), 1),
                                     memo=self.memo)
            outcomes.append(json.dumps(found, ensure_ascii=False))
        return {"seq": np.asarray(batch["seq"]), "outcomes": np.asarray(outcomes, dtype=object)}


def ray_outcomes(
    chunks: Iterator[Chunk],
    *,
    policy: Policy,
    batch_size: int,
    index_dir: Path,
    db: str | None,
    model: str,
    cross_model: str,
    device: str | None,
    backend: str | None = None,
    address: str | None = None,
    workers: int | None = None,
    gpus_per_worker: float = 0.0,
) -> Iterator[tuple[Chunk, list[dict]]]:
    """``(chunk, outcomes of its valid rows)`` in input order, resolved on a Ray actor pool."""
    ray = _import_ray()
    workers = ray_pool.default_workers(address, workers)
    ray_pool.start(ray, address, workers, gpus_per_worker)
    actor_device = ray_actor_device(device, gpus_per_worker)
    kwargs = {
        "index_dir": str(Path(index_dir).resolve()), "db": db, "model": model, "cross_model": cross_model,
        "device": actor_device, "backend": backend, "min_probability": policy.min_probability, "margin": policy.margin, "top_k": policy.top_k,
    }
    window: list[Chunk] = []
    for chunk in chunks:
        window.append(chunk)
        if len(window) >= workers * CHUNKS_PER_WORKER:
            yield from _run_window(ray, window, batch_size, workers, gpus_per_worker, kwargs)
            window = []
    if window:
        yield from _run_window(ray, window, batch_size, workers, gpus_per_worker, kwargs)


def _run_window(ray, window: list[Chunk], batch_size: int, workers: int, gpus: float, kwargs: dict):
    items, owner = [], []
    for ci, chunk in enumerate(window):
        for batch in micro_batches(chunk.valid_addresses(), batch_size):
            items.append({"seq": len(items), "addresses": batch})
            owner.append(ci)
    results: list[list[dict]] = [[] for _ in window]
    for row in ray_pool.map_ordered(ray, items, ResolveBatch, kwargs, workers=workers, gpus_per_worker=gpus):
        results[owner[int(row["seq"])]].extend(json.loads(row["outcomes"]))
    yield from zip(window, results)
