"""`mgeo-index bench`: the engine against the naive way, side by side, in one run.

Naive = what slow address-model deployments do: tokenize one item at a time, batch of 1, pad to 64,
FP32. Every figure is measured in the same process on the same inputs, and reported as a ratio.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from mgeo_index import engine
from mgeo_index.text import normalize

NAIVE_PAD = 64


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def naive_encode(bi, texts: Sequence[str]) -> np.ndarray:
    out = []
    with torch.no_grad():
        for text in texts:
            enc = bi.tokenizer(text, padding="max_length", truncation=True, max_length=NAIVE_PAD, return_tensors="pt")
            out.append(torch.nn.functional.normalize(bi(**enc), dim=-1)[0].numpy())
    return np.stack(out)


def naive_score(cross, first: Sequence[str], second: Sequence[str]) -> np.ndarray:
    out = []
    with torch.no_grad():
        for a, b in zip(first, second):
            enc = cross.tokenizer(a, b, padding="max_length", truncation=True, max_length=NAIVE_PAD, return_tensors="pt")
            out.append(torch.softmax(cross(**enc), dim=-1)[0].numpy())
    return np.stack(out)


def bench_encode(bi, texts: Sequence[str], naive_n: int = 200) -> dict:
    texts = [normalize(t) for t in texts]
    engine.encode(bi, texts[:64])  # warm-up
    t0 = time.perf_counter()
    fast = engine.encode(bi, texts)
    fast_s = time.perf_counter() - t0
    sample = texts[:naive_n]
    t0 = time.perf_counter()
    slow = naive_encode(bi, sample)
    slow_s = time.perf_counter() - t0
    agree = float(np.abs(fast[: len(sample)] - slow).max())
    return {"engine_per_s": _rate(len(texts), fast_s), "naive_per_s": _rate(len(sample), slow_s),
            "ratio": _rate(len(texts), fast_s) / _rate(len(sample), slow_s), "n": len(texts), "naive_n": len(sample),
            "max_abs_diff": agree}


def bench_score(cross, first: Sequence[str], second: Sequence[str], naive_n: int = 200) -> dict:
    """Network scoring only (the stacked feature head is the same per-pair cost on both sides)."""
    first, second = [normalize(t) for t in first], [normalize(t) for t in second]
    head, cross.feature_head = getattr(cross, "feature_head", None), None
    try:
        engine.score_pairs(cross, first[:64], second[:64])
        t0 = time.perf_counter()
        engine.score_pairs(cross, first, second)
        fast_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        naive_score(cross, first[:naive_n], second[:naive_n])
        slow_s = time.perf_counter() - t0
    finally:
        cross.feature_head = head
    n_slow = min(naive_n, len(first))
    return {"engine_per_s": _rate(len(first), fast_s), "naive_per_s": _rate(n_slow, slow_s),
            "ratio": _rate(len(first), fast_s) / _rate(n_slow, slow_s), "n": len(first), "naive_n": n_slow}


def bench_resolve(resolver, queries: Sequence[str], *, top_k: int = 10, warmup: int = 10) -> dict:
    """Single-query latency on a warm process (one query per call, as online traffic arrives)."""
    for q in queries[:warmup]:
        resolver.resolve([q], top_k=top_k)
    latencies = []
    for q in queries:
        t0 = time.perf_counter()
        resolver.resolve([q], top_k=top_k)
        latencies.append((time.perf_counter() - t0) * 1000)
    lat = np.asarray(latencies)
    return {"queries": len(lat), "top_k": top_k, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "mean_ms": float(lat.mean()),
            "catalog_size": int(resolver.index.ntotal)}
