"""The review page: a small FastAPI app, server-rendered with Jinja2 (autoescaped: every address is
shown as text), that shows the most uncertain pending item of one queue and records decisions.

Nothing here runs a model: candidates, probabilities and explanations were computed when the queue was
built (:mod:`mgeo_index.review.queue`), so a decision is a few SQL statements and a redirect to the
next item (POST → 303 → GET). The page works without JavaScript (every decision is a form button);
``static/review.js`` only maps keys to those forms.

Security: the CLI binds loopback by default. With API keys (``NAME:KEY`` names the reviewer; a bare
key is "reviewer") a request needs the key, in ``X-API-Key`` / ``Authorization: Bearer`` or the
HttpOnly, SameSite=Strict session cookie set by the login form (a random session id the server keeps, never
the key; ended by logout and after 12 hours, and by a restart). Without keys the reviewer is the OS user. Wrong keys are throttled per client (THROTTLE_FAILURES in THROTTLE_WINDOW_S seconds, then 429 until the
window passes). POSTs from another origin are refused (CSRF), an allowed-hosts list stops DNS rebinding, ids and
versions outside 64-bit range are refused (422), and a strict Content-Security-Policy forbids inline script.

Answers: a browser (form post) gets 303 redirects with a one-shot flash cookie; a client asking for
``Accept: application/json`` gets JSON and the status: 404 (item not in this queue), 409 (decided by
someone else meanwhile, stale model version), 422 (bad decision or candidate), 401 (no key).
"""
from __future__ import annotations

import getpass
import hmac
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape

from mgeo_index import store
from mgeo_index.compare.elements import EXPLAIN_ORDER
from mgeo_index.service.middleware import LOOPBACK_HOSTS, host_allowed, same_origin  # noqa: F401 (LOOPBACK_HOSTS: re-exported)
from mgeo_index.store.reviews import DECISIONS, ReviewConflict, ReviewError

HERE = Path(__file__).parent
SESSION_COOKIE = "mgeo_review_session"
FLASH_COOKIE = "mgeo_review_flash"
CLAIM_SECONDS = 120.0  # an item shown to one reviewer is not offered to another for this long
STATE_TEXT = {"agree": "agrees", "differ": "differs", "only_a": "only in the query", "only_b": "only in the candidate"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # not no-referrer: browsers would then send Origin: null on our own posts
    "Cache-Control": "no-store",
}


def parse_api_keys(values: Sequence[str] | None) -> dict[str, str]:
    """``NAME:KEY`` (or a bare ``KEY``, named "reviewer") options as {key: reviewer name}."""
    out: dict[str, str] = {}
    for value in values or ():
        name, sep, key = value.partition(":")
        name, key = (name.strip(), key.strip()) if sep else ("reviewer", value.strip())
        if not key or not name:
            raise ValueError(f"--api-key {value!r}: expected KEY or NAME:KEY with a non-empty key and name")
        if key in out and out[key] != name:
            raise ValueError(f"--api-key: the same key is given to {out[key]} and {name}")
        out[key] = name
    return out


SESSION_S = 12 * 3600  # a login lasts this long
THROTTLE_FAILURES = 10  # wrong keys a client may send within THROTTLE_WINDOW_S before it gets 429
THROTTLE_WINDOW_S = 60.0
MAX_ID = 2**63 - 1  # what the store's integer columns hold


class Throttle:
    """Wrong keys per client: after ``failures`` within ``window_s`` seconds, the client is refused until its
    oldest failure leaves the window (a key cannot be guessed at request speed)."""

    def __init__(self, failures: int = THROTTLE_FAILURES, window_s: float = THROTTLE_WINDOW_S) -> None:
        self.failures, self.window_s = failures, window_s
        self.seen: dict[str, deque[float]] = {}
        self.lock = threading.Lock()

    def retry_after(self, client: str) -> int:
        """Seconds the client must wait (0: it may try)."""
        with self.lock:
            times = self._recent(client)
            return 0 if len(times) < self.failures else max(1, int(times[0] + self.window_s - time.monotonic()) + 1)

    def failed(self, client: str) -> None:
        with self.lock:
            self._recent(client).append(time.monotonic())

    def _recent(self, client: str) -> deque[float]:
        times = self.seen.setdefault(client, deque())
        while times and times[0] < time.monotonic() - self.window_s:
            times.popleft()
        if len(self.seen) > 10_000:  # forget idle clients
            for other in [c for c, t in self.seen.items() if not t and c != client]:
                del self.seen[other]
        return times


@dataclass
class ReviewState:
    """What the app serves: one queue of one store, the model version its items must carry, the
    reviewers' keys, and which item each reviewer has open (so two reviewers get different items)."""

    engine: Any
    queue: str
    model_version: str
    keys: dict[str, str] = field(default_factory=dict)
    local_user: str = field(default_factory=getpass.getuser)
    title: str = ""
    order: str = "uncertainty"  # store.QUEUE_ORDERS
    claims: dict[int, tuple[str, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: dict[str, tuple[str, float]] = field(default_factory=dict)  # session id -> (reviewer, expiry)
    throttle: Throttle = field(default_factory=Throttle)

    def __post_init__(self) -> None:
        self.active_at_start = _active_fingerprint(self.engine)  # adapt or a rollback changes it: items go stale

    def reviewer(self, request: Request) -> str | None:
        """The reviewer making ``request``: by key (header or session cookie), the OS user without keys,
        None when keys are required and none matched."""
        if not self.keys:
            return self.local_user
        given = request.headers.get("x-api-key")
        if given is None:
            auth = request.headers.get("authorization", "")
            given = auth[7:] if auth[:7].lower() == "bearer " else None
        if given is not None:
            return self.by_key(given)
        return self.session_reviewer(request)

    def session_reviewer(self, request: Request) -> str | None:
        """The reviewer of ``request``'s session cookie when it is a live session (one a login started), else
        None."""
        token = request.cookies.get(SESSION_COOKIE, "")
        with self.lock:
            name, expires = self.sessions.get(token, (None, 0.0))
            if name is not None and expires < time.time():
                del self.sessions[token]
                return None
        return name

    def by_key(self, given: str) -> str | None:
        """The reviewer whose key this is (compared in constant time), or None."""
        return next((name for key, name in self.keys.items() if hmac.compare_digest(given.encode(), key.encode())), None)

    def start_session(self, name: str) -> str:
        """A new random session id for reviewer ``name`` (the key never travels in a cookie)."""
        token = secrets.token_urlsafe(32)
        with self.lock:
            now = time.time()
            for old in [t for t, (_, expires) in self.sessions.items() if expires < now]:
                del self.sessions[old]
            self.sessions[token] = (name, now + SESSION_S)
        return token

    def end_session(self, token: str) -> None:
        with self.lock:
            self.sessions.pop(token, None)

    def stale_reason(self, shown_version: str, item: dict) -> str | None:
        """Why a decision made on a page showing ``shown_version`` must be refused, or None."""
        active = _active_fingerprint(self.engine)
        if active != self.active_at_start:
            return (f"the active model changed to {active or 'the shipped model'} (adapt ran) since this review started "
                    f"with {self.model_version}: restart mgeo-index review to re-score the queue")
        if item["model_version"] != self.model_version:
            return (f"item {item['id']} was scored by model {item['model_version']}, this review runs "
                    f"{self.model_version}: restart mgeo-index review to re-score the queue")
        if shown_version != item["model_version"]:
            return (f"the page showed model {shown_version or '(none)'} but item {item['id']} is now scored by "
                    f"{item['model_version']}: your decision was not recorded, look at it again")
        return None

    def next_item(self, reviewer: str) -> dict | None:
        """The next pending item in the queue's order (the most uncertain first, or ``order`` random) not open
        on another reviewer's page (any pending one when all are), claimed for ``reviewer``."""
        now = time.monotonic()
        with self.lock:
            for item_id, (who, at) in list(self.claims.items()):
                if now - at > CLAIM_SECONDS:
                    del self.claims[item_id]
            others = [i for i, (who, _) in self.claims.items() if who != reviewer]
            found = store.next_review_items(self.engine, self.queue, limit=1, exclude=others, order=self.order) or \
                store.next_review_items(self.engine, self.queue, limit=1, order=self.order)
            if not found:
                return None
            for item_id in [i for i, (who, _) in self.claims.items() if who == reviewer]:
                del self.claims[item_id]  # one open item per reviewer
            self.claims[found[0]["id"]] = (reviewer, now)
            return found[0]

    def release(self, item_id: int) -> None:
        with self.lock:
            self.claims.pop(item_id, None)


def _active_fingerprint(engine) -> str | None:
    """The fingerprint of the active adapted cross-encoder (None: the shipped one)."""
    active = store.active_model_version(engine)
    return None if active is None else active["fingerprint"]


# --------------------------------------------------------------------------- rendering


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.globals["STATE_TEXT"] = STATE_TEXT
    return env


ENVIRONMENT = _environment()


def explain_rows(explain: dict | None) -> list[dict]:
    """The per-element comparison of a candidate in the parser's element order: element, state, the
    query's and the candidate's (standardized) values."""
    explain = explain or {}
    order = [name for name in EXPLAIN_ORDER if name in explain] + [n for n in explain if n not in EXPLAIN_ORDER]
    return [{"element": name, "state": explain[name].get("state", ""), "query": explain[name].get("query"),
             "candidate": explain[name].get("candidate"), "text": explain[name].get("text", "")} for name in order]


def item_view(item: dict) -> dict:
    """An item as the page and the JSON API show it."""
    return {
        "id": item["id"], "version": item["version"], "model_version": item["model_version"], "row": item["row"],
        "query": item["query"], "name": item.get("name"), "margin": round(float(item["margin"]), 6),
        "disagreement": round(float(item["disagreement"]), 6),
        "candidates": [{"rank": n, "id": c["id"], "source_id": c.get("source_id"), "address": c["address"],
                        "name": c.get("name"),
                        "label": c.get("label"), "probability": c.get("probability"),
                        "probabilities": c.get("probabilities") or {}, "source": c.get("source"),
                        "explain": explain_rows(c.get("explain"))}
                       for n, c in enumerate(item["candidates"], 1)],
    }


# --------------------------------------------------------------------------- the app


def create_app(state: ReviewState, *, allowed_hosts: Sequence[str] | None = None) -> FastAPI:
    """The review app over ``state``. ``allowed_hosts``: Host header values accepted (None: any)."""
    app = FastAPI(title="mgeo-index review", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.review = state
    app.state.allowed_hosts = allowed_hosts
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.middleware("http")(_guard)
    app.include_router(router)
    return app


async def _guard(request: Request, call_next):
    """Every request: the Host header, the origin of a POST, the wrong-key throttle; the security headers on every
    answer."""
    state: ReviewState = request.app.state.review
    if not host_allowed(request.headers, request.app.state.allowed_hosts):
        return _secured(Response("unknown Host header", 400, media_type="text/plain"))
    if request.method == "POST" and not same_origin(request.headers):
        return _secured(Response("cross-origin form posts are refused", 403, media_type="text/plain"))
    # a client that sent too many wrong keys may not try more (a key, a login); a live session (its login came
    # before) and the health check go on: one client's wrong keys lock out no reviewer
    wait = state.throttle.retry_after(_client(request)) if state.keys and request.url.path != "/healthz" else 0
    if wait and state.session_reviewer(request) is None:
        return _secured(Response(f"too many wrong keys; try again in {wait} s", 429, media_type="text/plain",
                                 headers={"Retry-After": str(wait)}))
    return _secured(await call_next(request))


def _state(request: Request) -> ReviewState:
    return request.app.state.review


def _render(request: Request, name: str, status: int = 200, **context) -> HTMLResponse:
    return HTMLResponse(ENVIRONMENT.get_template(name).render(title=_state(request).title, **context), status_code=status)


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def _answer(request: Request, status: int, message: str, kind: str = "error", **extra) -> Response:
    """A JSON answer with ``status`` for API clients; for a browser, back to the page with the message."""
    if _wants_json(request):
        return JSONResponse({"detail" if kind == "error" else "message": message, **extra}, status_code=status)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(FLASH_COOKIE, quote(json.dumps({"kind": kind, "text": message}, ensure_ascii=False)),
                        max_age=60, httponly=True, samesite="strict")
    return response


def _unauthorized(request: Request) -> Response:
    headers = request.headers
    if headers.get("x-api-key") is not None or headers.get("authorization") or request.cookies.get(SESSION_COOKIE):
        _state(request).throttle.failed(_client(request))  # a wrong key or a dead session: counted
    if _wants_json(request):
        return JSONResponse({"detail": "missing or wrong API key (X-API-Key or Authorization: Bearer)"}, 401,
                            headers={"WWW-Authenticate": "Bearer"})
    return RedirectResponse("/login", status_code=303)


router = APIRouter()


@router.get("/", response_class=HTMLResponse)
def page(request: Request):
    state = _state(request)
    reviewer = state.reviewer(request)
    if reviewer is None:
        return _unauthorized(request)
    item = state.next_item(reviewer)
    counts = store.review_counts(state.engine, state.queue)
    flash = _read_flash(request)
    if _wants_json(request):
        return JSONResponse({"queue": state.queue, "reviewer": reviewer, "counts": counts,
                             "item": item_view(item) if item else None})
    response = _render(request, "review.html", item=item_view(item) if item else None, counts=counts,
                       reviewer=reviewer, queue=state.queue, flash=flash, logout=bool(state.keys))
    if flash:
        response.delete_cookie(FLASH_COOKIE)
    return response


@router.post("/decide")
def decide(request: Request, item_id: int = Form(...), version: int = Form(...), model_version: str = Form(""),
           decision: str = Form(...), candidate: int | None = Form(None)):
    state = _state(request)
    reviewer = state.reviewer(request)
    if reviewer is None:
        return _unauthorized(request)
    if not all(0 <= n <= MAX_ID for n in (item_id, version, candidate or 0)):
        return _answer(request, 422, f"item_id, version and candidate must be between 0 and {MAX_ID}")
    item = store.get_review_item(state.engine, item_id)
    if item is None or item["queue"] != state.queue:
        return _answer(request, 404, f"item {item_id} is not in this review queue ({state.queue})")
    stale = state.stale_reason(model_version, item)
    if stale:
        return _answer(request, 409, stale)
    if decision not in DECISIONS:
        return _answer(request, 422, f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
    try:
        done = store.decide(state.engine, item_id, decision, reviewer=reviewer, model_version=model_version,
                            candidate=None if candidate is None else candidate - 1, expected_version=version)
    except ReviewConflict as exc:
        return _answer(request, 409, str(exc))
    except ReviewError as exc:
        return _answer(request, 422, str(exc))
    state.release(item_id)
    what = decision if candidate is None or decision not in ("exact", "partial") else f"{decision} (candidate {candidate})"
    if _wants_json(request):
        return JSONResponse({"message": f"recorded: {what}", "item": item_view(done), "status": done["status"]})
    return RedirectResponse("/", status_code=303)


@router.post("/undo")
def undo(request: Request):
    state = _state(request)
    reviewer = state.reviewer(request)
    if reviewer is None:
        return _unauthorized(request)
    item = store.undo_last(state.engine, state.queue, reviewer)
    if item is None:
        return _answer(request, 409, f"{reviewer} has no decision in this queue to undo")
    return _answer(request, 200, f"undone: your decision on “{item['query']}”; it is shown again", kind="info",
                   item=item_view(item))


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request):
    if not _state(request).keys:
        return RedirectResponse("/", status_code=303)
    return _render(request, "login.html", flash=_read_flash(request))


@router.post("/login")
def login(request: Request, key: str = Form("")):
    state = _state(request)
    name = state.by_key(key)
    if name is None:
        state.throttle.failed(_client(request))
        return _render(request, "login.html", status=401, flash={"kind": "error", "text": "wrong key"})
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(SESSION_COOKIE, state.start_session(name), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", max_age=SESSION_S)
    return response


@router.post("/logout")
def logout(request: Request):
    _state(request).end_session(request.cookies.get(SESSION_COOKIE, ""))  # the session ends here, not only in this browser
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response


@router.get("/logout")
def logout_page():  # a link or a typed URL: logging out takes the page's button (a POST), so a link cannot
    return RedirectResponse("/", status_code=303)


@router.get("/healthz")
def healthz(request: Request):
    return {"status": "ok", "queue": _state(request).queue}


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _read_flash(request: Request) -> dict | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        value = json.loads(unquote(raw))
        return {"kind": str(value.get("kind", "info")), "text": str(value.get("text", ""))}
    except (ValueError, AttributeError):
        return None
