"""serve: the HTTP service. Its defaults are ServeConfig's (mgeo_index.service.config imports no FastAPI)."""
from __future__ import annotations

from typing import Annotated

import typer

from mgeo_index.cli.errors import fail, friendly_errors
from mgeo_index.cli.options import DEFAULT_INDEX_DIR, CrossModel, Db, Device, IndexDir, Model, Numbers, Profile
from mgeo_index.cli.render import err, escape
from mgeo_index.service.config import ServeConfig
from mgeo_index.service import LOOPBACK_HOSTS

_DEFAULT = ServeConfig(index_dir=DEFAULT_INDEX_DIR)  # the option defaults (timeout_ms as the float the option is)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
LOOPBACK = LOOPBACK_HOSTS  # binding one of these keeps the service on this machine


def serve(
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback exposes the service.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    max_batch: Annotated[int, typer.Option(min=1, help="Most queries (or pairs) run together in one batch.")] = _DEFAULT.max_batch,
    max_wait_ms: Annotated[float, typer.Option(min=0.0, help="Longest a request waits for others to share its batch.")] = _DEFAULT.max_wait_ms,
    max_queue: Annotated[int, typer.Option(min=1, help="Queued items per lane (interactive, bulk) before 429.")] = _DEFAULT.max_queue,
    timeout_ms: Annotated[float, typer.Option(min=1.0, help="Per-request deadline (504 after it); X-Timeout-Ms may shorten it.")] = float(_DEFAULT.timeout_ms),
    max_items: Annotated[int, typer.Option(min=1, help="Most queries or pairs in one request (413 above).")] = _DEFAULT.max_items,
    max_chars: Annotated[int, typer.Option(min=1, help="Longest address accepted (422 above).")] = _DEFAULT.max_chars,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body (413 above).")] = _DEFAULT.max_body_bytes,
    max_top_k: Annotated[int, typer.Option(min=1, help="Largest top_k a request may ask for.")] = _DEFAULT.max_top_k,
    cache_size: Annotated[int, typer.Option(min=0, help="In-process LRU entries (0: no cache).")] = _DEFAULT.cache_size,
    cache: Annotated[str | None, typer.Option("--cache", help="Redis URL for a shared cache, e.g. redis://127.0.0.1:6379/0.")] = _DEFAULT.cache_url,
    cache_ttl: Annotated[int, typer.Option("--cache-ttl", min=0, help="Seconds a Redis cache entry lives (0: until the index changes).")] = _DEFAULT.cache_ttl_s,
    api_key: Annotated[str | None, typer.Option(envvar="MGEO_INDEX_API_KEY", show_envvar=True,
                                                help="Require this key (X-API-Key or Authorization: Bearer) on all but /healthz and /readyz.")] = _DEFAULT.api_key,
    watch: Annotated[float, typer.Option(min=0.0, help="Check the index directory for a new build every N seconds (0: only on SIGHUP or POST /v1/admin/reload).")] = _DEFAULT.watch_s,
    log_level: Annotated[str, typer.Option(help="critical, error, warning, info or debug (debug logs request texts).")] = "info",
    allowed_host: Annotated[list[str] | None, typer.Option("--allowed-host", help="A Host header name the service answers to (repeat for several) \\[default: the loopback names when bound to loopback, else any].")] = None,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
    numbers: Numbers = None,
    profile: Profile = None,
) -> None:
    """Serve resolve and match over HTTP: dynamic batching, cache, limits, Prometheus metrics.

    POST /v1/resolve, POST /v1/match, GET /healthz, /readyz, /metrics, OpenAPI docs at /docs.
    A new build of the index directory is swapped in on SIGHUP or POST /v1/admin/reload.

    Example: mgeo-index serve --index-dir idx --port 8000 --cache redis://127.0.0.1:6379/0
    """
    import logging

    try:
        import uvicorn

        from mgeo_index.service.app import create_app
    except ImportError as exc:
        fail(f"{exc}; install the service with pip install 'mgeo-index[serve]'")
    if log_level not in LOG_LEVELS:
        raise typer.BadParameter("--log-level must be critical, error, warning, info or debug")
    with friendly_errors():
        from mgeo_index.catalog.index_json import read_descriptor

        read_descriptor(index_dir)  # no index: say how to build one before starting anything
        check_port_free(host, port)
        config = ServeConfig(
            index_dir=index_dir, db=db, model=model, cross_model=cross_model, device=device, numbers=numbers,
            profile=profile, max_batch=max_batch,
            max_wait_ms=max_wait_ms, max_queue=max_queue, timeout_ms=timeout_ms, max_items=max_items,
            max_chars=max_chars, max_body_bytes=max_body_bytes, max_top_k=max_top_k, cache_size=cache_size,
            cache_url=cache, cache_ttl_s=cache_ttl, api_key=api_key or None, watch_s=watch, reload_signal=True,
            allowed_hosts=allowed_hosts(host, allowed_host),
        )
        application = create_app(config)
    if host not in LOOPBACK and not api_key:
        err.print(f"[yellow]Warning:[/] serving on {escape(host)} without --api-key: anyone who can reach it can use it.")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(application, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30)


def allowed_hosts(host: str, given: list[str] | None) -> tuple[str, ...] | None:
    """The Host header names a server bound to ``host`` answers to: those given; else, on loopback, the loopback
    names (a page on another site cannot reach it by a name that resolves to 127.0.0.1: DNS rebinding); else any."""
    if given:
        return tuple(given)
    return LOOPBACK_HOSTS if host in LOOPBACK else None


def check_port_free(host: str, port: int) -> None:
    """Say so before loading anything when the port is taken (uvicorn would fail after the models load)."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is in use by another program; choose another with --port") from None
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
