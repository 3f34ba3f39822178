"""The service's index over its life: the state one app holds, loading and warming up in the background after
start-up, swapping a new build in (reload: ``/v1/admin/reload``, SIGHUP, ``--watch``), and the app's lifespan
(the batcher, the cache, the background tasks) that starts and stops them."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

from fastapi import FastAPI

from mgeo_index.runtime.parallel import torch_threads
from mgeo_index.service import loader
from mgeo_index.service.batcher import LANES, Batcher, Submission
from mgeo_index.service.config import ServeConfig
from mgeo_index.service.metrics import Metrics

log = logging.getLogger("mgeo_index.service")


@dataclass
class State:
    config: ServeConfig
    metrics: Metrics
    cache: object
    batcher: Batcher | None = None
    loaded: loader.Loaded | None = None
    load_error: str | None = None
    reload_lock: asyncio.Lock | None = None


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    """Check the cache, start the batcher, load the index in the background (and watch it, reload it on
    SIGHUP when asked); stop them all on shutdown."""
    state: State = app.state.mgeo
    config, metrics = state.config, state.metrics
    if config.cache_url:
        try:
            await state.cache.ping()
        except Exception as exc:
            raise RuntimeError(f"cannot reach the cache at {config.cache_url}: {exc}") from exc
    state.reload_lock = asyncio.Lock()
    state.batcher = _batcher(state)
    for lane in LANES:
        metrics.queue_depth.labels(lane=lane).set_function(lambda lane=lane: state.batcher.queued[lane])
    if _on_cuda(config.device):
        import torch

        metrics.device_memory.set_function(torch.cuda.memory_allocated)
    state.batcher.start()
    tasks = [asyncio.create_task(_load_in_background(state))]
    if config.watch_s > 0:
        tasks.append(asyncio.create_task(_watch(state)))
    loop = asyncio.get_running_loop()
    if config.reload_signal:
        loop.add_signal_handler(signal.SIGHUP, lambda: tasks.append(asyncio.create_task(_reload_logged(state))))
    try:
        yield
    finally:
        if config.reload_signal:
            loop.remove_signal_handler(signal.SIGHUP)
        for task in tasks:
            task.cancel()
        await state.batcher.stop()
        await state.cache.close()


def _batcher(state: State) -> Batcher:
    """The one batcher: each batch reads the loaded index once, so batches in flight keep theirs on reload."""
    config, metrics = state.config, state.metrics

    def run_batch(submissions: list[Submission]) -> list:
        return loader.run_batch(state.loaded, submissions)

    def on_batch(items: int, seconds: float) -> None:
        metrics.batch_items.observe(items)
        metrics.batch_seconds.observe(seconds)

    return Batcher(run_batch, max_batch=config.max_batch, max_wait_ms=config.max_wait_ms,
                   max_queue=config.max_queue, on_batch=on_batch)


async def _load_in_background(state: State) -> None:
    try:
        loaded = await _load_and_warm(state)
    except Exception as exc:  # noqa: BLE001 - reported by /readyz and the log; /healthz stays up
        state.load_error = f"{type(exc).__name__}: {exc}"
        log.error("could not load %s: %s", state.config.index_dir, state.load_error)
        return
    _swap(state, loaded)
    log.info("ready: index %s, build %s, %d entries", state.config.index_dir, loaded.build_id, loaded.entries)


async def _watch(state: State) -> None:
    while True:
        await asyncio.sleep(state.config.watch_s)
        await _reload_logged(state)


async def aside(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a side thread (the event loop's default executor), with one torch thread: the
    batch thread alone keeps an OpenMP pool. A side thread's own pool (an index loaded there, a query encoded for a
    reviewer's confirmation) would slow every small batch about 4x (:func:`mgeo_index.runtime.parallel.torch_threads`)."""
    def call():
        with torch_threads(1):
            return fn(*args, **kwargs)

    return await asyncio.to_thread(call)


def _on_cuda(device: str | None) -> bool:
    from mgeo_index import settings

    try:
        return settings.device(device).startswith("cuda")
    except Exception:  # noqa: BLE001
        return False


async def _load_and_warm(state: State) -> loader.Loaded:
    """Open the index on a side thread (the old one keeps serving), warm it up on the batch worker thread."""
    c = state.config
    loaded = await aside(loader.load, c.index_dir, db=c.db, model=c.model, cross_model=c.cross_model,
                         device=c.device, numbers=c.numbers, profile=c.profile)
    await state.batcher.run_exclusive(lambda: loader.warm_up(loaded.resolver, min(c.max_batch, 16)))
    return loaded


def _swap(state: State, loaded: loader.Loaded) -> None:
    state.loaded = loaded  # one assignment: the next batch sees the new index, running ones keep theirs
    state.metrics.index_entries.set(loaded.entries)
    state.metrics.index_build.clear()
    state.metrics.index_build.labels(build_id=loaded.build_id, version=loaded.version).set(1)


async def reload_index(state: State, force: bool = False) -> dict:
    """Load the index directory's current build aside, warm it up, swap it in, empty the cache."""
    async with state.reload_lock:
        old = state.loaded
        current = await aside(loader.index_version, state.config.index_dir, old, state.config.db)
        if current == old.version and not force:
            return {"reloaded": False, "build_id": old.build_id, "version": old.version}
        loaded = await _load_and_warm(state)
        _swap(state, loaded)
        # entries of other versions go; a forced reload of the same build starts from an empty cache
        await state.cache.clear(keep=None if force else loaded.version)
        state.metrics.reloads.labels(outcome="reloaded").inc()
        log.info("index reloaded: build %s → %s (%d entries)", old.build_id, loaded.build_id, loaded.entries)
        return {"reloaded": True, "build_id": loaded.build_id, "version": loaded.version,
                "previous_build_id": old.build_id, "entries": loaded.entries}


async def _reload_logged(state: State) -> None:
    """Reload for SIGHUP and --watch: failures are logged and counted, the loaded index keeps serving."""
    if state.loaded is None:
        return  # still loading: that load picks up the newest build anyway
    try:
        await reload_index(state)
    except Exception as exc:  # noqa: BLE001
        state.metrics.reloads.labels(outcome="failed").inc()
        log.error("index reload failed, still serving build %s: %s", state.loaded.build_id, exc)
