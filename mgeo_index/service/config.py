"""The settings of `mgeo-index serve` (no FastAPI import: the CLI reads the defaults from here)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mgeo_index.settings import MAX_QUERY_CHARS


@dataclass
class ServeConfig:
    index_dir: Path
    db: str | None = None
    model: Path | None = None
    cross_model: Path | None = None
    device: str | None = None
    numbers: str | None = None  # the number policy of answers (None: the index's; mgeo_index.model.numbers)
    profile: str | None = None  # which bundled cross-encoder reranks (None: the index's, accurate on a GPU, default)
    max_batch: int = 32
    max_wait_ms: float = 3.0
    max_queue: int = 1024  # items per lane
    timeout_ms: float = 10_000  # per-request deadline (X-Timeout-Ms may shorten it)
    max_items: int = 256  # queries or pairs per request
    max_chars: int = MAX_QUERY_CHARS  # per address: longer ones are refused (422), as the resolver would cut them
    max_body_bytes: int = 1 << 20
    max_top_k: int = 100
    cache_size: int = 10_000
    cache_url: str | None = None
    cache_ttl_s: int = 0  # Redis entries expire after this many seconds (0: never)
    api_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None  # Host header names answered (None: any; the CLI: loopback names)
    watch_s: float = 0.0  # poll the index directory for a new build every watch_s seconds (0: off)
    reload_signal: bool = False  # SIGHUP reloads (the CLI turns it on; needs the main thread)
