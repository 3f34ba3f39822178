"""The FastAPI app of `mgeo-index serve`: endpoints, limits, readiness and index reload.

``create_app(ServeConfig(...))`` returns the app; the index is loaded and warmed up in the background
after start-up (``/healthz`` answers at once, ``/readyz`` and the ``/v1`` endpoints once it is loaded).
Request texts are logged only at DEBUG level. The settings are in ``config.py``, the request bodies in
``schemas.py``, the body limit and the API key in ``middleware.py``, loading the index in ``loader.py``.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mgeo_index.runtime.parallel import torch_threads
from mgeo_index.service import loader
from mgeo_index.service.batcher import LANES, Batcher, DeadlineExceeded, QueueFull, Submission
from mgeo_index.service.cache import cache_key, open_cache
from mgeo_index.service.config import ServeConfig
from mgeo_index.service.metrics import Metrics, create_metrics
from mgeo_index.service.middleware import BodyLimit, Guard
from mgeo_index.service.schemas import MatchRequest, ResolveRequest
from mgeo_index.text import has_content, model_text, normalize, printable, query_key, with_name

log = logging.getLogger("mgeo_index.service")


class HTTPProblem(Exception):
    """An error answer: status, message, optional headers."""

    def __init__(self, status: int, detail: str, reason: str, headers: dict | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.reason, self.headers = status, detail, reason, headers or {}


def _invalid(loc: list, msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ["body", *loc], "msg": msg, "type": "value_error"}])


@dataclass
class State:
    config: ServeConfig
    metrics: Metrics
    cache: object
    batcher: Batcher | None = None
    loaded: loader.Loaded | None = None
    load_error: str | None = None
    reload_lock: asyncio.Lock | None = None


def create_app(config: ServeConfig) -> FastAPI:
    metrics = create_metrics()
    namespace = hashlib.sha256(str(Path(config.index_dir).resolve()).encode()).hexdigest()[:12]
    cache = open_cache(config.cache_url, config.cache_size, namespace, ttl_s=config.cache_ttl_s,
                       on_error=lambda operation: metrics.cache_errors.labels(operation=operation).inc())
    state = State(config=config, metrics=metrics, cache=cache)

    def run_batch(submissions: list[Submission]) -> list:
        return loader.run_batch(state.loaded, submissions)  # read once: in-flight batches keep their index

    def on_batch(items: int, seconds: float) -> None:
        metrics.batch_items.observe(items)
        metrics.batch_seconds.observe(seconds)

    async def load_in_background() -> None:
        try:
            loaded = await _load_and_warm(state)
        except Exception as exc:  # noqa: BLE001 - reported by /readyz and the log; /healthz stays up
            state.load_error = f"{type(exc).__name__}: {exc}"
            log.error("could not load %s: %s", config.index_dir, state.load_error)
            return
        _swap(state, loaded)
        log.info("ready: index %s, build %s, %d entries", config.index_dir, loaded.build_id, loaded.entries)

    async def watch() -> None:
        while True:
            await asyncio.sleep(config.watch_s)
            await _reload_logged(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if config.cache_url:
            try:
                await state.cache.ping()
            except Exception as exc:
                raise RuntimeError(f"cannot reach the cache at {config.cache_url}: {exc}") from exc
        state.reload_lock = asyncio.Lock()
        state.batcher = Batcher(run_batch, max_batch=config.max_batch, max_wait_ms=config.max_wait_ms,
                                max_queue=config.max_queue, on_batch=on_batch)
        for lane in LANES:
            metrics.queue_depth.labels(lane=lane).set_function(lambda lane=lane: state.batcher.queued[lane])
        if _on_cuda(config.device):
            import torch

            metrics.device_memory.set_function(torch.cuda.memory_allocated)
        state.batcher.start()
        tasks = [asyncio.create_task(load_in_background())]
        if config.watch_s > 0:
            tasks.append(asyncio.create_task(watch()))
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

    app = FastAPI(
        title="mgeo-index",
        summary="Chinese address entity resolution: resolve addresses against a catalog, score address pairs.",
        lifespan=lifespan,
    )
    app.state.mgeo = state
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, metrics=metrics)
    app.add_middleware(Guard, api_key=config.api_key, metrics=metrics,  # outermost: before the body is read
                       allowed_hosts=config.allowed_hosts)

    @app.exception_handler(HTTPProblem)
    async def problem(request: Request, exc: HTTPProblem):
        metrics.rejected.labels(reason=exc.reason).inc()
        return JSONResponse({"detail": exc.detail}, exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        metrics.rejected.labels(reason="invalid").inc()
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
        return JSONResponse({"detail": errors}, 422)

    @app.get("/healthz", summary="Alive (answers even while the index loads)")
    async def healthz():
        return {"status": "alive"}

    @app.get("/readyz", summary="Index and models loaded and warmed up")
    async def readyz():
        if state.loaded is None:
            return JSONResponse({"ready": False, "reason": state.load_error or "loading"}, 503, headers={"Retry-After": "5"})
        return {"ready": True, "build_id": state.loaded.build_id, "version": state.loaded.version,
                "entries": state.loaded.entries}

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/resolve", summary="Resolve one address (query) or several (queries): the JSON of `resolve --json`")
    async def resolve(body: ResolveRequest, request: Request):
        if (body.query is None) == (body.queries is None):
            raise _invalid(["query"], "give exactly one of 'query' (one address) or 'queries' (a list)")
        queries = [body.query] if body.query is not None else body.queries
        field = "query" if body.query is not None else "queries"
        if not queries:
            raise _invalid(["queries"], "the list is empty; give at least one address")
        if (body.name is not None and body.query is None) or (body.names is not None and body.queries is None):
            raise _invalid(["name" if body.name is not None else "names"],
                           "give 'name' with 'query', 'names' with 'queries'")
        names = [body.name] if body.query is not None else body.names or [None] * len(queries)
        if len(names) != len(queries):
            raise _invalid(["names"], f"{len(names)} names for {len(queries)} queries; give one per query (null where none)")
        names = [n.strip() if n and n.strip() else None for n in names]
        if len(queries) > config.max_items:
            raise HTTPProblem(413, f"'queries' has {len(queries)} addresses; at most {config.max_items} per request "
                                   "(--max-items): split it", "too_large")
        if body.top_k > config.max_top_k:
            raise _invalid(["top_k"], f"top_k is {body.top_k}; at most {config.max_top_k} (--max-top-k)")
        for i, n in enumerate(names):
            if n is not None and len(n) > config.max_chars:
                raise _invalid(["name"] if field == "query" else ["names", i],
                               f"name is {len(n)} characters; at most {config.max_chars} (--max-chars)")
        normalized = [_check_text(q, [field] if field == "query" else [field, i], config.max_chars)
                      for i, q in enumerate(queries)]
        # a named query is its address with the name after it, and the name: kept and batched as such
        normalized = [query_key(q, n) for q, n in zip(normalized, names)]
        lane = _lane(request, body.priority)
        deadline = _deadline(request, config)
        loaded = _ready(state)
        params = (body.top_k, body.rerank, body.explain, body.retrieval)
        log.debug("resolve %s", queries)
        keys = [cache_key(loaded.cache_version, n, params) for n in normalized]
        cached = await state.cache.get_many(keys)
        hits = sum(c is not None for c in cached)
        metrics.cache_hits.inc(hits)
        metrics.cache_misses.inc(len(keys) - hits)
        hit = [i for i, c in enumerate(cached) if c is not None]
        answers = list(cached)
        if hit:
            # reviewers' decisions (mgeo-index review) on cached results: one store query, so a new label counts at
            # once (fresh results come with them from the batch, one store query for the whole batch)
            confirmed = await aside(
                loaded.resolver.apply_confirmations, [model_text(with_name(queries[i], names[i])) for i in hit],
                [cached[i] for i in hit], top_k=body.top_k, explain=body.explain, rerank=body.rerank)
            for i, answer in zip(hit, confirmed):
                answers[i] = answer
        missing = [i for i, c in enumerate(cached) if c is None]
        if missing:
            version, results = await _submit(
                state, Submission("resolve", params, [(queries[i], names[i]) for i in missing], lane), deadline)
            fresh = {}
            for i, (matches, answer) in zip(missing, results):
                answers[i] = answer
                fresh[cache_key(state.loaded.cache_version, normalized[i], params)] = matches
            if version == state.loaded.version:  # computed on an index swapped out meanwhile: not kept
                await state.cache.set_many(fresh)
        # printable: a lone surrogate (invalid UTF-8 in the body, or a "\ud800" escape) cannot be encoded back
        made_with = loaded.resolver.made_with(body.rerank)
        objects = [{"query": printable(q)} | ({"name": printable(n)} if n else {}) | {"matches": m} | made_with
                   for q, n, m in zip(queries, names, answers)]
        return JSONResponse(objects[0] if body.query is not None else {"results": objects})

    @app.post("/v1/match", summary="Label address pairs exact_match / partial_match / not_match with probabilities")
    async def match(body: MatchRequest, request: Request):
        if not body.pairs:
            raise _invalid(["pairs"], "the list is empty; give at least one {'a': ..., 'b': ...}")
        if len(body.pairs) > config.max_items:
            raise HTTPProblem(413, f"'pairs' has {len(body.pairs)} pairs; at most {config.max_items} per request "
                                   "(--max-items): split it", "too_large")
        for i, pair in enumerate(body.pairs):
            _check_text(pair.a, ["pairs", i, "a"], config.max_chars)
            _check_text(pair.b, ["pairs", i, "b"], config.max_chars)
        lane = _lane(request, body.priority)
        deadline = _deadline(request, config)
        _ready(state)
        log.debug("match %s", body.pairs)
        _, results = await _submit(state, Submission("match", (body.explain,), [(p.a, p.b) for p in body.pairs], lane), deadline)
        return JSONResponse({"results": results})

    @app.post("/v1/admin/reload", summary="Load a new build of the index directory and swap it in")
    async def reload(force: bool = False):
        _ready(state)
        try:
            return await reload_index(state, force=force)
        except Exception as exc:  # noqa: BLE001 - the old index keeps serving
            log.exception("index reload failed, still serving build %s", state.loaded.build_id)
            metrics.reloads.labels(outcome="failed").inc()
            return JSONResponse({"reloaded": False, "build_id": state.loaded.build_id,
                                 "detail": f"reload failed, still serving the loaded index: {exc}"}, 500)

    return app


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


def _check_text(text: str, loc: list, max_chars: int) -> str:
    if len(text) > max_chars:
        raise _invalid(loc, f"address is {len(text)} characters; at most {max_chars} (--max-chars)")
    normalized = normalize(text)
    if not has_content(normalized):
        raise _invalid(loc, "address is empty (no letter or digit left after removing spaces and punctuation)")
    return normalized


def _lane(request: Request, priority: str | None) -> str:
    header = request.headers.get("x-priority")
    if header is not None and header not in LANES:
        raise RequestValidationError([{"loc": ["header", "x-priority"], "msg": f"must be one of {LANES}",
                                       "type": "value_error"}])
    return priority or header or "interactive"


def _deadline(request: Request, config: ServeConfig) -> float:
    """Seconds this request may wait: --timeout-ms, shortened by an X-Timeout-Ms header."""
    timeout = config.timeout_ms
    header = request.headers.get("x-timeout-ms")
    if header is not None:
        try:
            timeout = min(timeout, float(header))
        except ValueError:
            raise RequestValidationError([{"loc": ["header", "x-timeout-ms"], "msg": "must be a number of milliseconds",
                                           "type": "value_error"}]) from None
    return max(timeout, 0.0) / 1000


def _ready(state: State) -> loader.Loaded:
    if state.loaded is None:
        raise HTTPProblem(503, "the index is still loading; see /readyz", "not_ready", {"Retry-After": "5"})
    return state.loaded


async def _submit(state: State, submission: Submission, timeout: float):
    loop = asyncio.get_running_loop()
    submission.deadline = loop.time() + timeout
    try:
        future = state.batcher.submit(submission)
    except QueueFull as exc:
        raise HTTPProblem(429, str(exc), "queue_full", {"Retry-After": str(exc.retry_after)}) from None
    advice = (f"send fewer items a request (this one has {len(submission.items)}), a smaller top_k or no explain, "
              "or allow more time (--timeout-ms, X-Timeout-Ms)")
    try:
        return await asyncio.wait_for(future, timeout)  # on timeout the future is cancelled: a queued submission is dropped
    except DeadlineExceeded as exc:
        if exc.estimate is not None:  # refused at once: this request alone is estimated to take longer
            raise HTTPProblem(504, f"this request would take about {exc.estimate:.1f} s on this server (measured on the "
                                   f"requests before it), more than its deadline ({timeout * 1000:.0f} ms): {advice}",
                              "deadline") from None
        raise HTTPProblem(504, f"no answer within the request deadline ({timeout * 1000:.0f} ms): the queue was "
                               f"too long; retry, or {advice}", "deadline") from None
    except asyncio.TimeoutError:
        raise HTTPProblem(504, f"no answer within the request deadline ({timeout * 1000:.0f} ms): {advice}",
                          "deadline") from None
    except Exception:  # the batch failed: this request gets a 500, the server goes on
        log.exception("batch failed")
        raise HTTPProblem(500, "internal error while resolving; see the server log", "error") from None
