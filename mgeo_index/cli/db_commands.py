"""db upgrade / downgrade / current: the store's Alembic migrations."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mgeo_index import settings
from mgeo_index.cli.errors import friendly_errors
from mgeo_index.cli.options import Db
from mgeo_index.cli.render import console

StoreDir = Annotated[Path | None, typer.Option("--index-dir", "-i")]


def _db_url(index_dir: Path | None, db: str | None) -> str:
    if index_dir is None and not (db or settings.env("DB")):
        raise typer.BadParameter("give --index-dir or --db (or set MGEO_INDEX_DB)")
    return settings.database_url(index_dir or Path("."), db)


def _revision(url: str) -> str:
    from mgeo_index import store

    return f"database at revision {store.current_revision(url) or 'base (no migrations applied)'}"


def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    index_dir: Annotated[Path | None, typer.Option("--index-dir", "-i", help="Index directory (its SQLite store).")] = None,
    db: Db = None,
) -> None:
    """Apply pending migrations.

    Example: mgeo-index db upgrade --db postgresql://localhost/mgeo
    """
    from mgeo_index import store

    with friendly_errors():
        if index_dir is not None and not (db or settings.env("DB")):
            index_dir.mkdir(parents=True, exist_ok=True)  # its SQLite store is created here
        url = _db_url(index_dir, db)
        if url.startswith("sqlite:///"):  # a SQLite file named by --db: its folder may be new too
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        store.upgrade(url, revision)
        console.print(_revision(url))


def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, e.g. base or -1.")],
    index_dir: StoreDir = None,
    db: Db = None,
) -> None:
    """Revert migrations down to REVISION.

    Example: mgeo-index db downgrade base --index-dir idx
    """
    from mgeo_index import store

    with friendly_errors():
        url = _db_url(index_dir, db)
        store.downgrade(url, revision)
        console.print(_revision(url))


def db_current(
    index_dir: StoreDir = None,
    db: Db = None,
) -> None:
    """Print the database's migration revision.

    Example: mgeo-index db current --index-dir idx
    """
    from mgeo_index import store

    with friendly_errors():
        console.print(store.current_revision(_db_url(index_dir, db)) or "empty (no migrations applied)")
