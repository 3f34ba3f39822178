"""The service's ASGI middleware: the request body limit, and the guard (Host and Origin checks, the API key)
with the request latency histogram. The Host and Origin checks are the review app's too."""
from __future__ import annotations

import hmac
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers

from mgeo_index.service import LOOPBACK_HOSTS  # noqa: F401 (the review app's import)
from mgeo_index.service.metrics import Metrics

UNPROTECTED = ("/healthz", "/readyz")  # everything else needs the API key when one is set
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def host_allowed(headers: Headers, allowed_hosts: Sequence[str] | None) -> bool:
    """Whether the request's Host header names this server (``allowed_hosts``; None: any): a page on another
    site whose name resolves to this server's address (DNS rebinding) sends its own name."""
    if allowed_hosts is None:
        return True
    host = headers.get("host", "")
    name = urlsplit(f"//{host}").hostname or ""
    return name in allowed_hosts or f"[{name}]" in allowed_hosts


def same_origin(headers: Headers) -> bool:
    """A request whose Origin (or, without one, Referer) is this server's, or that names none (non-browser
    clients). Browsers send Origin on cross-site posts, so another site's page cannot post here."""
    origin = headers.get("origin") or headers.get("referer")
    if origin is None:
        return True
    return origin != "null" and urlsplit(origin).netloc == headers.get("host", "")


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
    """ASGI middleware: a Host header this server answers to (``allowed_hosts``; None: any), no cross-origin
    browser posts (every POST: the admin reload changes state, the queries spend compute), the API key on all but
    /healthz and /readyz, and the request latency histogram."""

    def __init__(self, app, api_key: str | None, metrics: Metrics, allowed_hosts: Sequence[str] | None = None) -> None:
        self.app, self.api_key, self.metrics, self.allowed_hosts = app, api_key, metrics, allowed_hosts

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

        headers = Headers(scope=scope)
        if not host_allowed(headers, self.allowed_hosts):
            self.metrics.rejected.labels(reason="bad_host").inc()
            await JSONResponse({"detail": "unknown Host header (serve --allowed-host)"}, 400)(scope, receive, send_and_note)
        elif scope["method"] in WRITE_METHODS and not same_origin(headers):
            self.metrics.rejected.labels(reason="cross_origin").inc()
            await JSONResponse({"detail": "cross-origin requests are refused"}, 403)(scope, receive, send_and_note)
        elif self.api_key and scope["path"] not in UNPROTECTED and not _key_ok(headers, self.api_key):
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
