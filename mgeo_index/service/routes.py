"""The service's endpoints (``/healthz``, ``/readyz``, ``/metrics``, ``/v1/resolve``, ``/v1/match``,
``/v1/admin/reload``) and how a request is checked, given its lane and deadline, and submitted to the batcher.
Each endpoint reads the app's :class:`~mgeo_index.service.lifecycle.State` (``app.state.mgeo``)."""
from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mgeo_index.service import loader
from mgeo_index.service.batcher import LANES, DeadlineExceeded, QueueFull, Submission
from mgeo_index.service.cache import cache_key
from mgeo_index.service.config import ServeConfig
from mgeo_index.service.lifecycle import State, aside, reload_index
from mgeo_index.service.schemas import MatchRequest, ResolveRequest
from mgeo_index.text import has_content, model_text, normalize, printable, query_key, with_name

log = logging.getLogger("mgeo_index.service")
router = APIRouter()


class HTTPProblem(Exception):
    """An error answer: status, message, optional headers."""

    def __init__(self, status: int, detail: str, reason: str, headers: dict | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.reason, self.headers = status, detail, reason, headers or {}


def _invalid(loc: list, msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ["body", *loc], "msg": msg, "type": "value_error"}])


def _state(request: Request) -> State:
    return request.app.state.mgeo


@router.get("/healthz", summary="Alive (answers even while the index loads)")
async def healthz():
    return {"status": "alive"}


@router.get("/readyz", summary="Index and models loaded and warmed up")
async def readyz(request: Request):
    state = _state(request)
    if state.loaded is None:
        return JSONResponse({"ready": False, "reason": state.load_error or "loading"}, 503, headers={"Retry-After": "5"})
    return {"ready": True, "build_id": state.loaded.build_id, "version": state.loaded.version,
            "entries": state.loaded.entries}


@router.get("/metrics", summary="Prometheus metrics")
async def prometheus(request: Request):
    return Response(generate_latest(_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.post("/v1/resolve", summary="Resolve one address (query) or several (queries): the JSON of `resolve --json`")
async def resolve(body: ResolveRequest, request: Request):
    state = _state(request)
    queries, names, normalized = _resolve_items(body, state.config)
    lane = _lane(request, body.priority)
    deadline = _deadline(request, state.config)
    loaded = _ready(state)
    log.debug("resolve %s", queries)
    answers = await _answers(state, loaded, body, queries, names, normalized, lane, deadline)
    # printable: a lone surrogate (invalid UTF-8 in the body, or a "\ud800" escape) cannot be encoded back
    made_with = loaded.resolver.made_with(body.rerank)
    objects = [{"query": printable(q)} | ({"name": printable(n)} if n else {}) | {"matches": m} | made_with
               for q, n, m in zip(queries, names, answers)]
    return JSONResponse(objects[0] if body.query is not None else {"results": objects})


def _resolve_items(body: ResolveRequest, config: ServeConfig) -> tuple[list[str], list[str | None], list[str]]:
    """(queries, their names, their keys: the normalized address with the name after it) of a resolve body,
    checked against the limits; a clear 422 or 413 naming the field otherwise."""
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
    return queries, names, [query_key(q, n) for q, n in zip(normalized, names)]


async def _answers(state: State, loaded: loader.Loaded, body: ResolveRequest, queries: list[str],
                   names: list[str | None], normalized: list[str], lane: str, deadline: float) -> list:
    """Each query's matches: from the cache (with reviewers' decisions applied), the others from one batch
    submission (cached when the index they were computed on is still the loaded one)."""
    metrics = state.metrics
    params = (body.top_k, body.rerank, body.explain, body.retrieval)
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
    return answers


@router.post("/v1/match", summary="Label address pairs exact_match / partial_match / not_match with probabilities")
async def match(body: MatchRequest, request: Request):
    state = _state(request)
    config = state.config
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


@router.post("/v1/admin/reload", summary="Load a new build of the index directory and swap it in")
async def reload(request: Request, force: bool = False):
    state = _state(request)
    _ready(state)
    try:
        return await reload_index(state, force=force)
    except Exception as exc:  # noqa: BLE001 - the old index keeps serving
        log.exception("index reload failed, still serving build %s", state.loaded.build_id)
        state.metrics.reloads.labels(outcome="failed").inc()
        return JSONResponse({"reloaded": False, "build_id": state.loaded.build_id,
                             "detail": f"reload failed, still serving the loaded index: {exc}"}, 500)


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
