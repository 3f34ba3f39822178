"""review: build or refresh a review queue (a normalize job's uncertain rows, or a queries file) and serve
the browser page that takes people's decisions (:mod:`mgeo_index.review`)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mgeo_index.cli.errors import fail, friendly_errors
from mgeo_index.cli.options import DEFAULT_INDEX_DIR, Backend, CrossModel, Db, Device, IndexDir, Model, Profile, QueriesFile
from mgeo_index.cli.render import err, escape, progress
from mgeo_index.cli.serve_commands import LOG_LEVELS, LOOPBACK, allowed_hosts, check_port_free


def review(
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    job: Annotated[int | None, typer.Option("--job", help="Review this normalize job's ambiguous, unmatched and low-probability rows (mgeo-index jobs lists them).")] = None,
    file: QueriesFile = None,
    below: Annotated[float, typer.Option(min=0.0, max=1.0, help="With --job: also review matched rows whose probability is below this.")] = 0.9,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=9, help="Candidates shown per item (keys 1–9).")] = 5,
    order: Annotated[str, typer.Option(help="uncertainty: the rows the model is least sure of first (to settle a job); random: a representative sample (to teach adapt your policy: it learns more from it).")] = "uncertainty",
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback exposes the page (use --api-key).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8100,
    api_key: Annotated[list[str] | None, typer.Option(
        "--api-key", envvar="MGEO_INDEX_REVIEW_API_KEYS", show_envvar=True,
        help="NAME:KEY (repeatable; NAME is recorded as the reviewer) or a bare KEY (named 'reviewer'); "
             "the page then asks for a key. Without one, decisions are recorded under the OS user.")] = None,
    serve: Annotated[bool, typer.Option("--serve/--no-serve", help="Serve the page after building the queue (--no-serve: build it and exit).")] = True,
    log_level: Annotated[str, typer.Option(help="critical, error, warning, info or debug.")] = "warning",
    forwarded_allow_ips: Annotated[str | None, typer.Option(help="Behind a reverse proxy: its addresses (comma-separated, or *), whose X-Forwarded-For names the client. By default no forwarded header is read: a client cannot pick the address its wrong keys are counted under.")] = None,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
    profile: Profile = None,
) -> None:
    """Review uncertain matches in a browser: 1–9 same place, p N partial, n none, s skip, u undo.

    Builds (or refreshes) the queue first: each query's candidates are computed once, ordered by how much
    a label would teach (smallest margin between the best two first). Decisions are stored as labels.

    Example: mgeo-index review --index-dir idx --job 3 --port 8100
    """
    import getpass

    if (job is None) == (file is None):
        raise typer.BadParameter("give one of --job ID or --file QUERIES")
    if order not in ("uncertainty", "random"):
        raise typer.BadParameter("--order must be uncertainty or random")
    if log_level not in LOG_LEVELS:
        raise typer.BadParameter("--log-level must be critical, error, warning, info or debug")
    try:
        import uvicorn

        from mgeo_index.review.app import ReviewState, create_app, parse_api_keys
    except ImportError as exc:
        fail(f"{exc}; install the review page with pip install 'mgeo-index[serve]'")
    with friendly_errors():
        keys = parse_api_keys(api_key)
        if serve:
            check_port_free(host, port)
        from mgeo_index import AddressIndex
        from mgeo_index.review.queue import queue_name

        queue_name(job=job, file=file)  # a missing file is said before the models load

        index = AddressIndex.open(index_dir, db=db, model=model, cross_model=cross_model, device=device, backend=backend,
                                  profile=profile)
        info = _open_queue(index, job=job, file=file, below=below, top_k=top_k)
    counts = info.counts
    err.print(f"Queue {escape(info.name)}: {counts['total']} items ({info.added} new, {info.rescored} re-scored), "
              f"{counts['pending']} pending, {counts['decided']} decided, {counts['skipped']} skipped; "
              f"model {info.model_version}", highlight=False)
    if not serve:
        return
    state = ReviewState(engine=index.resolver.engine, queue=info.name, model_version=info.model_version, keys=keys,
                        local_user=getpass.getuser(), title=str(Path(index_dir)), order=order)
    loopback = host in LOOPBACK
    application = create_app(state, allowed_hosts=allowed_hosts(host, None))
    if not loopback and not keys:
        err.print(f"[yellow]Warning:[/] serving on {escape(host)} without --api-key: anyone who can reach it can label.")
    shown = f"[{host}]" if ":" in host else host
    err.print(f"Review at http://{escape(shown)}:{port}/  (Ctrl-C to stop)", highlight=False)
    # forwarded headers only from the proxies named (uvicorn would otherwise trust any local client's)
    uvicorn.run(application, host=host, port=port, log_level=log_level, proxy_headers=forwarded_allow_ips is not None,
                forwarded_allow_ips=forwarded_allow_ips)


def _open_queue(index, **queue):
    """The review queue built or refreshed (:func:`mgeo_index.review.queue.open_queue`), with a progress bar a
    step: scoring the queries, re-scoring when the model changed."""
    from mgeo_index.review.queue import open_queue

    with progress() as bar:
        tasks: dict[str, int] = {}

        def on_progress(step: str, advance: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bar.add_task("Scoring queries" if step == "score" else "Re-scoring (model changed)",
                                           total=total)
            bar.update(tasks[step], advance=advance)

        return open_queue(index, on_progress=on_progress, **queue)
