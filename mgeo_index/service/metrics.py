"""Prometheus metrics of one server (own registry, so several apps can live in one process)."""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class Metrics:
    registry: CollectorRegistry
    request_seconds: Histogram  # endpoint, status
    batch_items: Histogram
    batch_seconds: Histogram
    queue_depth: Gauge  # lane
    cache_hits: Counter
    cache_misses: Counter
    cache_errors: Counter  # operation: read, write, clear (Redis trouble; requests still answered)
    rejected: Counter  # reason: queue_full, deadline, too_large, invalid, unauthorized, bad_host, cross_origin, not_ready, error
    index_entries: Gauge
    index_build: Gauge  # build_id, version; value 1 for the index being served
    reloads: Counter  # outcome
    device_memory: Gauge


def create_metrics() -> Metrics:
    r = CollectorRegistry()
    return Metrics(
        registry=r,
        request_seconds=Histogram("mgeo_request_seconds", "Request latency", ["endpoint", "status"], buckets=LATENCY_BUCKETS, registry=r),
        batch_items=Histogram("mgeo_batch_items", "Items (queries or pairs) per batch run", buckets=BATCH_BUCKETS, registry=r),
        batch_seconds=Histogram("mgeo_batch_seconds", "Time to run one batch", buckets=LATENCY_BUCKETS, registry=r),
        queue_depth=Gauge("mgeo_queue_depth", "Items waiting to be batched", ["lane"], registry=r),
        cache_hits=Counter("mgeo_cache_hits", "Queries answered from the cache", registry=r),
        cache_misses=Counter("mgeo_cache_misses", "Queries not in the cache", registry=r),
        cache_errors=Counter("mgeo_cache_errors", "Shared cache operations that failed (counted as misses)", ["operation"], registry=r),
        rejected=Counter("mgeo_rejected_requests", "Requests refused", ["reason"], registry=r),
        index_entries=Gauge("mgeo_index_entries", "Vectors in the served index", registry=r),
        index_build=Gauge("mgeo_index_build_info", "The served index (value 1)", ["build_id", "version"], registry=r),
        reloads=Counter("mgeo_index_reloads", "Index reloads", ["outcome"], registry=r),
        device_memory=Gauge("mgeo_device_memory_bytes", "GPU memory allocated by torch (0 on CPU)", registry=r),
    )
