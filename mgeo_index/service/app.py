"""The FastAPI app of `mgeo-index serve`: endpoints, limits, readiness and index reload.

``create_app(ServeConfig(...))`` returns the app; the index is loaded and warmed up in the background
after start-up (``/healthz`` answers at once, ``/readyz`` and the ``/v1`` endpoints once it is loaded).
Request texts are logged only at DEBUG level. The settings are in ``config.py``, the request bodies in
``schemas.py``, the endpoints in ``routes.py``, the index's life (loading, reload, the lifespan) in
``lifecycle.py``, the body limit and the API key in ``middleware.py``, loading the index in ``loader.py``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from mgeo_index.service.cache import open_cache
from mgeo_index.service.config import ServeConfig
from mgeo_index.service.lifecycle import State, lifespan
from mgeo_index.service.metrics import create_metrics
from mgeo_index.service.middleware import BodyLimit, Guard
from mgeo_index.service.routes import HTTPProblem, router

__all__ = ["ServeConfig", "create_app"]


def create_app(config: ServeConfig) -> FastAPI:
    metrics = create_metrics()
    namespace = hashlib.sha256(str(Path(config.index_dir).resolve()).encode()).hexdigest()[:12]
    cache = open_cache(config.cache_url, config.cache_size, namespace, ttl_s=config.cache_ttl_s,
                       on_error=lambda operation: metrics.cache_errors.labels(operation=operation).inc())
    app = FastAPI(
        title="mgeo-index",
        summary="Chinese address entity resolution: resolve addresses against a catalog, score address pairs.",
        lifespan=lifespan,
    )
    app.state.mgeo = State(config=config, metrics=metrics, cache=cache)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, metrics=metrics)
    app.add_middleware(Guard, api_key=config.api_key, metrics=metrics,  # outermost: before the body is read
                       allowed_hosts=config.allowed_hosts)
    app.add_exception_handler(HTTPProblem, _problem)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.include_router(router)
    return app


async def _problem(request: Request, exc: HTTPProblem):
    request.app.state.mgeo.metrics.rejected.labels(reason=exc.reason).inc()
    return JSONResponse({"detail": exc.detail}, exc.status, headers=exc.headers)


async def _invalid_request(request: Request, exc: RequestValidationError):
    request.app.state.mgeo.metrics.rejected.labels(reason="invalid").inc()
    errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
    return JSONResponse({"detail": errors}, 422)
