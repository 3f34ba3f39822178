"""Result cache: normalized query + request parameters + index version → matches.

In-process LRU by default (``--cache-size``, 0 turns it off), or Redis (``--cache redis://…``), shared
by every server process on the same index. Keys carry the index version, so a result computed on an
old index is never served for a new one; ``clear(keep=version)`` drops every other version's entries when
the index changes (a shared Redis keeps what other processes already computed on the new version).
Redis trouble at run time never fails a request: it counts as a miss, is logged and goes to ``on_error``
(the server's ``mgeo_cache_errors_total``).
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable

import cachetools

log = logging.getLogger("mgeo_index.service")


def cache_key(version: str, normalized_query: str, params: tuple) -> str:
    digest = hashlib.sha256(json.dumps([normalized_query, list(params)], ensure_ascii=False).encode()).hexdigest()
    return f"{version}:{digest[:32]}"


class LRUCache:
    """In-process LRU of ``size`` entries (0: no caching)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: cachetools.LRUCache | None = cachetools.LRUCache(size) if size > 0 else None

    async def get_many(self, keys: list[str]) -> list[list | None]:
        if self._data is None:
            return [None] * len(keys)
        return [self._data.get(k) for k in keys]

    async def set_many(self, items: dict[str, list]) -> None:
        if self._data is not None:
            self._data.update(items)

    async def clear(self, keep: str | None = None) -> None:
        """Drop every entry, or every entry not of index version ``keep``."""
        if self._data is None:
            return
        if keep is None:
            self._data.clear()
            return
        for key in [k for k in self._data if not k.startswith(keep + ":")]:
            del self._data[key]

    def __len__(self) -> int:
        return len(self._data) if self._data is not None else 0

    async def close(self) -> None:
        pass


class RedisCache:
    """Redis keys ``<prefix><version>:<hash>`` holding the matches as JSON; ``ttl_s`` 0 = no expiry."""

    def __init__(self, url: str, prefix: str, ttl_s: int = 0, on_error: Callable[[str], None] | None = None) -> None:
        import redis.asyncio as redis

        self.url = url
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.on_error = on_error
        self._client = redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        self._error_types = (redis.RedisError, OSError)

    async def ping(self) -> None:
        await self._client.ping()

    async def get_many(self, keys: list[str]) -> list[list | None]:
        if not keys:
            return []
        try:
            values = await self._client.mget([self.prefix + k for k in keys])
        except self._error_types as exc:
            self._trouble("read", exc)
            return [None] * len(keys)
        return [json.loads(v) if v is not None else None for v in values]

    async def set_many(self, items: dict[str, list]) -> None:
        if not items:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for k, v in items.items():
                    pipe.set(self.prefix + k, json.dumps(v, ensure_ascii=False), ex=self.ttl_s or None)
                await pipe.execute()
        except self._error_types as exc:
            self._trouble("write", exc)

    async def clear(self, keep: str | None = None) -> None:
        """Delete every key under this index's prefix, or every one not of index version ``keep``."""
        kept = None if keep is None else (self.prefix + keep + ":").encode()
        try:
            batch = []
            async for key in self._client.scan_iter(match=self.prefix + "*", count=1000):
                if kept is not None and key.startswith(kept):
                    continue
                batch.append(key)
                if len(batch) >= 1000:
                    await self._client.delete(*batch)
                    batch.clear()
            if batch:
                await self._client.delete(*batch)
        except self._error_types as exc:
            self._trouble("clear", exc)

    async def close(self) -> None:
        await self._client.aclose()

    def _trouble(self, what: str, exc: Exception) -> None:
        if self.on_error is not None:
            self.on_error(what)
        log.warning("redis cache %s failed (%s): %s", what, self.url, exc)


def open_cache(url: str | None, size: int, namespace: str, *, ttl_s: int = 0,
               on_error: Callable[[str], None] | None = None) -> LRUCache | RedisCache:
    """``url`` None → LRU of ``size``; ``redis://…`` → Redis under ``mgeo-index:<namespace>:``, entries
    expiring after ``ttl_s`` seconds (0: never)."""
    if ttl_s < 0:
        raise ValueError(f"--cache-ttl must be 0 (no expiry) or more seconds, not {ttl_s}")
    if not url:
        if ttl_s:
            raise ValueError("--cache-ttl is for the shared Redis cache (--cache redis://…); the in-process "
                             "LRU holds entries until the index changes or they are evicted")
        return LRUCache(size)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--cache must be a redis://, rediss:// or unix:// URL, not {url!r}")
    return RedisCache(url, prefix=f"mgeo-index:{namespace}:", ttl_s=ttl_s, on_error=on_error)
