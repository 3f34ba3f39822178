"""The review page: a small FastAPI app, server-rendered with Jinja2 (autoescaped: every address is
shown as text), that shows the most uncertain pending item of one queue and records decisions.

Nothing here runs a model: candidates, probabilities and explanations were computed when the queue was
built (:mod:`mgeo_index.review.queue`), so a decision is a few SQL statements and a redirect to the
next item (POST → 303 → GET). The page works without JavaScript (every decision is a form button);
``static/review.js`` only maps keys to those forms.

Security: the CLI binds loopback by default. With API keys (``NAME:KEY`` names the reviewer; a bare
key is "reviewer") a request needs the key, in ``X-API-Key`` / ``Authorization: Bearer`` or the
HttpOnly, SameSite=Strict session cookie set by the login form (which holds a keyed hash, not the
key). Without keys the reviewer is the OS user. POSTs from another origin are refused (CSRF), an
allowed-hosts list stops DNS rebinding, and a strict Content-Security-Policy forbids inline script.

Answers: a browser (form post) gets 303 redirects with a one-shot flash cookie; a client asking for
``Accept: application/json`` gets JSON and the status: 404 (item not in this queue), 409 (decided by
someone else meanwhile, stale model version), 422 (bad decision or candidate), 401 (no key).
"""
from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape

from mgeo_index import store
from mgeo_index.features import EXPLAIN_ORDER
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


def _session_token(name: str, key: str) -> str:
    """The cookie a login sets: the reviewer's name and a hash keyed by their API key (the key itself
    never travels in a cookie; the token stays valid across restarts with the same keys)."""
    return f"{quote(name)}.{hmac.new(key.encode(), b'mgeo-review-session:' + name.encode(), hashlib.sha256).hexdigest()}"


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
            return next((name for key, name in self.keys.items() if hmac.compare_digest(given.encode(), key.encode())), None)
        token = request.cookies.get(SESSION_COOKIE, "")
        return next((name for key, name in self.keys.items()
                     if hmac.compare_digest(token.encode(), _session_token(name, key).encode())), None)

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
        "query": item["query"], "margin": round(float(item["margin"]), 6),
        "disagreement": round(float(item["disagreement"]), 6),
        "candidates": [{"rank": n, "id": c["id"], "source_id": c.get("source_id"), "address": c["address"],
                        "label": c.get("label"), "probability": c.get("probability"),
                        "probabilities": c.get("probabilities") or {}, "source": c.get("source"),
                        "explain": explain_rows(c.get("explain"))}
                       for n, c in enumerate(item["candidates"], 1)],
    }


# --------------------------------------------------------------------------- the app


def create_app(state: ReviewState, *, allowed_hosts: Sequence[str] | None = None) -> FastAPI:
    """The review app over ``state``. ``allowed_hosts``: Host header values accepted (None: any)."""
    env = _environment()
    app = FastAPI(title="mgeo-index review", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.review = state
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if not host_allowed(request.headers, allowed_hosts):
            return _secured(Response("unknown Host header", 400, media_type="text/plain"))
        if request.method == "POST" and not same_origin(request.headers):
            return _secured(Response("cross-origin form posts are refused", 403, media_type="text/plain"))
        return _secured(await call_next(request))

    def render(name: str, status: int = 200, **context) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(title=state.title, **context), status_code=status)

    def wants_json(request: Request) -> bool:
        return "application/json" in request.headers.get("accept", "")

    def answer(request: Request, status: int, message: str, kind: str = "error", **extra) -> Response:
        """A JSON answer with ``status`` for API clients; for a browser, back to the page with the message."""
        if wants_json(request):
            return JSONResponse({"detail" if kind == "error" else "message": message, **extra}, status_code=status)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(FLASH_COOKIE, quote(json.dumps({"kind": kind, "text": message}, ensure_ascii=False)),
                            max_age=60, httponly=True, samesite="strict")
        return response

    def unauthorized(request: Request) -> Response:
        if wants_json(request):
            return JSONResponse({"detail": "missing or wrong API key (X-API-Key or Authorization: Bearer)"}, 401,
                                headers={"WWW-Authenticate": "Bearer"})
        return RedirectResponse("/login", status_code=303)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request):
        reviewer = state.reviewer(request)
        if reviewer is None:
            return unauthorized(request)
        item = state.next_item(reviewer)
        counts = store.review_counts(state.engine, state.queue)
        flash = _read_flash(request)
        if wants_json(request):
            return JSONResponse({"queue": state.queue, "reviewer": reviewer, "counts": counts,
                                 "item": item_view(item) if item else None})
        response = render("review.html", item=item_view(item) if item else None, counts=counts, reviewer=reviewer,
                          queue=state.queue, flash=flash, logout=bool(state.keys))
        if flash:
            response.delete_cookie(FLASH_COOKIE)
        return response

    @app.post("/decide")
    def decide(request: Request, item_id: int = Form(...), version: int = Form(...), model_version: str = Form(""),
               decision: str = Form(...), candidate: int | None = Form(None)):
        reviewer = state.reviewer(request)
        if reviewer is None:
            return unauthorized(request)
        item = store.get_review_item(state.engine, item_id)
        if item is None or item["queue"] != state.queue:
            return answer(request, 404, f"item {item_id} is not in this review queue ({state.queue})")
        stale = state.stale_reason(model_version, item)
        if stale:
            return answer(request, 409, stale)
        if decision not in DECISIONS:
            return answer(request, 422, f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
        try:
            done = store.decide(state.engine, item_id, decision, reviewer=reviewer, model_version=model_version,
                                candidate=None if candidate is None else candidate - 1, expected_version=version)
        except ReviewConflict as exc:
            return answer(request, 409, str(exc))
        except ReviewError as exc:
            return answer(request, 422, str(exc))
        state.release(item_id)
        what = decision if candidate is None or decision not in ("exact", "partial") else f"{decision} (candidate {candidate})"
        if wants_json(request):
            return JSONResponse({"message": f"recorded: {what}", "item": item_view(done), "status": done["status"]})
        return RedirectResponse("/", status_code=303)

    @app.post("/undo")
    def undo(request: Request):
        reviewer = state.reviewer(request)
        if reviewer is None:
            return unauthorized(request)
        item = store.undo_last(state.engine, state.queue, reviewer)
        if item is None:
            return answer(request, 409, f"{reviewer} has no decision in this queue to undo")
        return answer(request, 200, f"undone: your decision on “{item['query']}”; it is shown again", kind="info",
                      item=item_view(item))

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request):
        if not state.keys:
            return RedirectResponse("/", status_code=303)
        return render("login.html", flash=_read_flash(request))

    @app.post("/login")
    def login(request: Request, key: str = Form("")):
        found = next(((k, n) for k, n in state.keys.items() if hmac.compare_digest(key.encode(), k.encode())), None)
        if found is None:
            return render("login.html", status=401, flash={"kind": "error", "text": "wrong key"})
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(SESSION_COOKIE, _session_token(found[1], found[0]), httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", max_age=12 * 3600)
        return response

    @app.post("/logout")
    def logout():
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    @app.get("/healthz")
    def healthz():
        return {"status": "ok", "queue": state.queue}

    return app


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
