"""Where a build's two heavy steps are computed: parsing entries into elements (:mod:`mgeo_index.catalog.build`)
and embedding the live entries that have no vector (:func:`mgeo_index.catalog.generations.publish`). Picked by
name (``build --engine local|ray``, also ``add``):

- ``local`` (:class:`BuildEngine`): this process; on a CPU with several threads (torch's thread count), that many
  batches at a time, each on one thread (a tagger's or encoder's small matrices gain little from a second
  intra-op thread; two batches side by side use both cores: :func:`in_threads`);
- ``ray`` (:class:`RayEngine`): Ray Data actor pools (:mod:`mgeo_index.ray_pool`), each actor loading its
  model once (the tagger and gazetteer to parse, the bi-encoder to embed).

An engine only maps batches of stored entries to results, in order, batch by batch, and touches no store
or file. The driver still reads the store, commits each batch of elements as it comes back, writes the
generation's files, moves the pointer and passes the crash points in the same order whichever engine
computes; a Ray build killed at any moment (``kill -9`` included) is therefore finished by running it
again, exactly like a local one. Each Ray actor call parses or embeds exactly the batch the local engine
would (one chunk of ``chunk_size`` entries), with the same backend, so elements are identical and vectors
equal to float rounding (FP32 on the CPU: batch-independent; measured max difference 0 to ~1e-6).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from mgeo_index import ray_pool, settings
from mgeo_index.runtime.parallel import in_threads, side_by_side

ENGINES = ("local", "ray")
# Entries per actor in one Ray Data execution (a "window"): a pool lives for one execution and each actor
# loads its model when it starts (~10 s on a busy 2-core machine), so a window gives every actor minutes
# of work on a CPU while bounding what the driver holds of the texts being parsed.
ROWS_PER_WORKER = 100_000

Batches = Iterable[list[dict[str, Any]]]
OnBatch = Callable[[int], None]


class BuildEngine:
    """The local engine: parses and embeds in this process, on ``device`` (the base of the others)."""

    name = "local"

    def __init__(self, device: str | None = None, threads: int | None = None) -> None:
        self.device = settings.device(device)
        self.threads = side_by_side(self.device, threads)  # chunks computed at once, one thread each

    def start(self) -> None:
        """Make the engine ready, raising a clear error when it cannot run (before the store is touched)."""

    def prepare(self, bi, backend: str | None) -> None:
        """Make the driver's loaded model ready for this engine (the local one embeds with it)."""
        from mgeo_index.runtime import backends

        bi.to(self.device)
        backends.ensure(bi, backend, device=self.device)

    def describe(self) -> dict[str, Any]:
        """What the build records of its engine (``builds.stats``)."""
        return {"engine": self.name, "device": self.device, "threads": self.threads}

    def parse(self, batches: Batches) -> Iterator[tuple[list[dict], list[dict]]]:
        """``(batch, parse() of its entries' normalized texts)`` for each batch, in order."""
        from mgeo_index.text.parser import parse

        return in_threads(lambda batch: parse([e["normalized"] for e in batch]), batches, self.threads)

    def encode(self, batches: Batches, bi, on_batch: OnBatch | None = None) -> Iterator[tuple[list[dict], np.ndarray]]:
        """``(batch, float32 vectors of its entries' normalized texts)`` for each batch, in order."""
        from mgeo_index.runtime import inference

        inner = on_batch if self.threads == 1 else None  # one chunk at a time: progress by the encoder's own batches
        for batch, vectors in in_threads(
            lambda batch: inference.encode(bi, [e["normalized"] for e in batch], device=self.device, on_batch=inner),
            batches, self.threads,
        ):
            if on_batch is not None and inner is None:
                on_batch(len(batch))  # from this thread, as each chunk is handed back
            yield batch, vectors


class RayEngine(BuildEngine):
    """Parses and embeds on Ray Data actor pools: ``workers`` actors on the cluster at ``address`` (else a
    local Ray), each with ``gpus_per_worker`` GPUs (embedding) or one CPU; parsing runs on CPU actors."""

    name = "ray"

    def __init__(self, *, device: str | None = None, backend: str | None = None, address: str | None = None,
                 workers: int | None = None, gpus_per_worker: float = 0.0) -> None:
        ray_pool.check_options(workers, gpus_per_worker)
        if backend is not None and gpus_per_worker > 0 and backend != "torch":
            raise ValueError(f"--backend {backend} is for the CPU; GPU actors (--gpus-per-worker) run torch (FP16)")
        self.address = address
        self.workers = ray_pool.default_workers(address, workers)
        self.gpus_per_worker = float(gpus_per_worker)
        self.device = ray_pool.actor_device(device, gpus_per_worker)
        self.backend: str | None = None  # the actors' inference backend (set by prepare)
        self.ray = None

    def start(self) -> None:
        self.ray = ray_pool.import_ray()
        ray_pool.start(self.ray, self.address, self.workers, self.gpus_per_worker)

    def prepare(self, bi, backend: str | None) -> None:
        """The driver never runs the model: only check that actors can load it (from its directory) and name
        the backend they apply (torch on GPUs; else the one given, the model's own, or the default)."""
        from mgeo_index.runtime import backends

        if not bi.path:
            raise ValueError("the Ray engine's actors load the bi-encoder from its directory: give a saved model "
                             "(--model DIR), not one built in this process")
        if self.gpus_per_worker > 0:
            self.backend = "torch"
        else:
            self.backend = backends.require(backend or getattr(bi, "backend", None) or settings.backend(None, self.device))

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "device": self.device, "workers": self.workers,
                "gpus_per_worker": self.gpus_per_worker, **({"ray_address": self.address} if self.address else {})}

    def _windows(self, batches: Batches) -> Iterator[list[list[dict]]]:
        window: list[list[dict]] = []
        rows = 0
        for batch in batches:
            window.append(batch)
            rows += len(batch)
            if rows >= self.workers * ROWS_PER_WORKER:
                yield window
                window, rows = [], 0
        if window:
            yield window

    def _mapped(self, batches: Batches, actor: type, kwargs: dict, gpus: float) -> Iterator[tuple[list[dict], dict]]:
        for window in self._windows(batches):
            items = [{"seq": i, "texts": [e["normalized"] for e in batch]} for i, batch in enumerate(window)]
            yield from zip(window, ray_pool.map_ordered(self.ray, items, actor, kwargs, workers=self.workers,
                                                        gpus_per_worker=gpus))

    def parse(self, batches: Batches) -> Iterator[tuple[list[dict], list[dict]]]:
        from mgeo_index.text.parser import parser_version

        version = parser_version()
        for batch, row in self._mapped(batches, ParseBatch, {}, 0.0):  # the tagger is small: CPU actors
            if row["parser"] != version:
                raise ValueError(f"the Ray actors parse with {row['parser']}, this process with {version}: "
                                 f"install the same mgeo-index on every node")
            yield batch, json.loads(row["parsed"])

    def encode(self, batches: Batches, bi, on_batch: OnBatch | None = None) -> Iterator[tuple[list[dict], np.ndarray]]:
        kwargs = {"model": bi.path, "device": self.device, "backend": self.backend}
        for batch, row in self._mapped(batches, EncodeBatch, kwargs, self.gpus_per_worker):
            if row["fingerprint"] != bi.fingerprint:
                raise ValueError(f"the Ray actors loaded the model at {bi.path} as {row['fingerprint']}, this process "
                                 f"as {bi.fingerprint}: the model directory must be the same on every node")
            vectors = np.frombuffer(row["vectors"], dtype=np.float32).reshape(len(batch), bi.dim)
            if on_batch is not None:
                on_batch(len(batch))
            yield batch, vectors


class ParseBatch:
    """The parsing actor: the shipped tagger and gazetteer, loaded once; one batch of texts per call."""

    def __init__(self) -> None:
        from mgeo_index.text.parser import parse, parser_version

        self.parse, self.version = parse, parser_version()

    def __call__(self, batch: dict) -> dict:
        parsed = [
            json.dumps([{"elements": p["elements"], "admin": p["admin"]} for p in self.parse([str(t) for t in texts])],
                       ensure_ascii=False)
            for texts in batch["texts"]
        ]
        return {"seq": np.asarray(batch["seq"]), "parsed": np.asarray(parsed, dtype=object),
                "parser": np.asarray([self.version] * len(parsed), dtype=object)}


class EncodeBatch:
    """The embedding actor: the bi-encoder loaded once from ``model`` onto ``device`` with ``backend``; one
    batch of texts per call, its float32 vectors returned as bytes."""

    def __init__(self, model: str, device: str, backend: str) -> None:
        from mgeo_index.runtime import backends
        from mgeo_index.model.bi_encoder import load_bi_encoder

        self.device = device
        self.bi = backends.apply(load_bi_encoder(model).to(device), backend, device=device)

    def __call__(self, batch: dict) -> dict:
        from mgeo_index.runtime import inference

        vectors = [
            np.ascontiguousarray(inference.encode(self.bi, [str(t) for t in texts], device=self.device), dtype=np.float32).tobytes()
            for texts in batch["texts"]
        ]
        return {"seq": np.asarray(batch["seq"]), "vectors": np.asarray(vectors, dtype=object),
                "fingerprint": np.asarray([self.bi.fingerprint] * len(vectors), dtype=object)}


def make_build_engine(name: str = "local", *, device: str | None = None, backend: str | None = None,
                      ray_address: str | None = None, workers: int | None = None,
                      gpus_per_worker: float = 0.0) -> BuildEngine:
    """The engine called ``name`` (options checked; nothing started): ``local`` on ``device``, or ``ray``
    (``ray_address``, ``workers``, ``gpus_per_worker``; ``device`` is then the CPU actors')."""
    if name == "local":
        ray_only = [option for option, given in (("--ray-address", ray_address is not None),
                                                 ("--workers", workers is not None),
                                                 ("--gpus-per-worker", bool(gpus_per_worker))) if given]
        if ray_only:
            raise ValueError(f"{', '.join(ray_only)} {'is' if len(ray_only) == 1 else 'are'} for --engine ray")
        return BuildEngine(device)
    if name == "ray":
        return RayEngine(device=device, backend=backend, address=ray_address, workers=workers,
                         gpus_per_worker=gpus_per_worker)
    raise ValueError(f"--engine must be local or ray, not {name!r}")
