"""A build's two heavy steps as runner tasks (:mod:`mgeo_index.compute`): parsing entries into elements
(:mod:`mgeo_index.catalog.build`) and embedding the live entries that have no vector
(:func:`mgeo_index.catalog.generations.publish`), each item one chunk of stored entries.

Whichever runner computes, the driver reads the store, commits each chunk's elements as it comes back, writes
the generation's files, moves the pointer and passes the crash points in the same order; a Ray build killed at
any moment (``kill -9`` included) is therefore finished by running it again, exactly like a local one. Each Ray
actor call parses or embeds exactly the chunk the local runner would, with the same backend, so elements are
identical and vectors equal to float rounding (FP32 on the CPU: batch-independent; measured max difference 0 to
~1e-6).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from mgeo_index.runtime.plan import torch_plan
from mgeo_index.compute.task import Task

# Entries per actor in one Ray Data execution (a "window"): a pool lives for one execution and each actor
# loads its model when it starts (~10 s on a busy 2-core machine), so a window gives every actor minutes
# of work on a CPU while bounding what the driver holds of the texts being parsed.
ROWS_PER_WORKER = 100_000


def _chunks_per_actor(chunk_size: int) -> int:
    """Chunks of ``chunk_size`` entries per actor in one window (ROWS_PER_WORKER entries, at least one chunk)."""
    return max(ROWS_PER_WORKER // max(chunk_size, 1), 1)


def _texts(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {"texts": [e["normalized"] for e in batch]}


def parse_task(chunk_size: int) -> Task:
    """``parse()`` of each chunk's normalized texts (the tagger is small: CPU actors)."""
    from mgeo_index.text.parser import parser_version

    version = parser_version()

    def local():
        from mgeo_index.text.parser import parse

        return lambda batch: parse([e["normalized"] for e in batch])

    def unpack(batch, row):
        if row["parser"] != version:
            raise ValueError(f"the Ray actors parse with {row['parser']}, this process with {version}: "
                             f"install the same mgeo-index on every node")
        return json.loads(row["parsed"])

    return Task(local=local, actor=ParseBatch, pack=_texts, unpack=unpack,
                items_per_actor=_chunks_per_actor(chunk_size))


def encode_task(runner, bi, backend: str | None, chunk_size: int) -> Task:
    """Float32 vectors of each chunk's normalized texts, by ``bi``. Made before anything is stored, so it refuses
    early: the local runner in one process embeds with ``bi`` itself (moved to its device, ``backend`` applied);
    its worker processes and Ray actors load
    it from its directory (none: refused) with ``backend`` (torch on GPUs; else the one given, the model's own, or
    the default), and each chunk's vectors are checked to come from the same model."""
    from mgeo_index.runtime import backends

    kwargs: dict[str, Any] = {}
    if runner.name == "local" and runner.workers == 1:
        bi.to(runner.device)
        backends.ensure(bi, backend, device=runner.device)
        plan = getattr(bi, "plan", None)
    else:
        if not bi.path:
            raise ValueError("worker processes and Ray actors load the bi-encoder from its directory: give a saved "
                             "model (--model DIR), not one built in this process")
        on_gpus = runner.gpus_per_worker > 0
        plan = torch_plan("torch" if on_gpus else backend or getattr(bi, "backend", None),
                          "cuda" if on_gpus else runner.device)
        kwargs = {"model": bi.path, "device": runner.device, "backend": backends.require(plan.backend)}

    def local():
        from mgeo_index.runtime import inference

        return lambda batch: inference.encode(bi, [e["normalized"] for e in batch], device=runner.device)

    def unpack(batch, row):
        if row["fingerprint"] != bi.fingerprint:
            raise ValueError(f"the Ray actors loaded the model at {bi.path} as {row['fingerprint']}, this process "
                             f"as {bi.fingerprint}: the model directory must be the same on every node")
        return np.frombuffer(row["vectors"], dtype=np.float32).reshape(len(batch), bi.dim)

    return Task(local=local, actor=EncodeBatch, pack=_texts, unpack=unpack, gpus=True, kwargs=kwargs,
                items_per_actor=_chunks_per_actor(chunk_size), plan=plan)


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
        from mgeo_index.model.loading import stored_bi
        from mgeo_index.runtime import backends

        self.device = device
        self.bi = backends.apply(stored_bi(model).to(device), backend, device=device)

    def __call__(self, batch: dict) -> dict:
        from mgeo_index.runtime import inference

        vectors = [
            np.ascontiguousarray(inference.encode(self.bi, [str(t) for t in texts], device=self.device), dtype=np.float32).tobytes()
            for texts in batch["texts"]
        ]
        return {"seq": np.asarray(batch["seq"]), "vectors": np.asarray(vectors, dtype=object),
                "fingerprint": np.asarray([self.bi.fingerprint] * len(vectors), dtype=object)}
