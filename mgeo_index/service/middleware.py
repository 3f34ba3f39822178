"""The service's ASGI middleware: the request body limit, and the API-key guard with the request
latency histogram."""
from __future__ import annotations

import hmac
import time

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers

from mgeo_index.service.metrics import Metrics

UNPROTECTED = ("/healthz", "/readyz")  # everything else needs the API key when one is set


class BodyLimit:
    """ASGI middleware: request bodies over ``max_bytes`` get 413 (Content-Length or counted while read),
    counted as ``mgeo_rejected_requests_total{reason="too_large"}``."""

    def __init__(self, app, max_bytes: int, metrics: Metrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        async def too_large() -> None:
            self.metrics.rejected.labels(reason="too_large").inc()
            await JSONResponse({"detail": f"request body over {self.max_bytes} bytes (--max-body-bytes)"}, 413)(
                scope, receive, send)

        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await too_large()
        received = 0
        answered = False

        async def limited_receive():
            nonlocal received, answered
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if not answered:
                        answered = True
                        await too_large()
                    return {"type": "http.disconnect"}  # the app stops reading; its answer is dropped
            return message

        async def guarded_send(message):
            if not answered:
                await send(message)

        await self.app(scope, limited_receive, guarded_send)


class Guard:
    """ASGI middleware: the API key on all but /healthz and /readyz, and the request latency histogram."""

    def __init__(self, app, api_key: str | None, metrics: Metrics) -> None:
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if self.api_key and scope["path"] not in UNPROTECTED and not _key_ok(Headers(scope=scope), self.api_key):
            self.metrics.rejected.labels(reason="unauthorized").inc()
            answer = JSONResponse({"detail": "missing or wrong API key (X-API-Key or Authorization: Bearer)"}, 401,
                                  headers={"WWW-Authenticate": "Bearer"})
            await answer(scope, receive, send_and_note)
        else:
            await self.app(scope, receive, send_and_note)
        route = scope.get("route")  # set by the router when a route matched
        self.metrics.request_seconds.labels(endpoint=getattr(route, "path", "other"), status=str(status)).observe(
            time.perf_counter() - started)


def _key_ok(headers: Headers, key: str) -> bool:
    given = headers.get("x-api-key")
    if given is None:
        auth = headers.get("authorization", "")
        given = auth[7:] if auth[:7].lower() == "bearer " else ""
    return hmac.compare_digest(given.encode(), key.encode())
