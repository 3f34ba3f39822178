"""The store's foundation: the declarative ``Base`` every table derives from, engines (:func:`connect`,
SQLite pragmas) and the Alembic helpers that create and evolve the schema.

The schema is created and evolved only by the Alembic migrations in ``migrations/`` (installed as
``mgeo_index.migrations``); :func:`connect` applies pending ones. A database already at the newest revision is
opened without loading Alembic (a one-shot ``resolve`` then spends no time on it).
"""
from __future__ import annotations

import importlib.resources
import os
import re
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Engine, Integer, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.pool import StaticPool

# SQLite's default limit on bound parameters is 32766 (>= 3.32); stay far below it.
_IN_CHUNK = 900


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


#: An entry id (= its FAISS vector id): 64-bit (migration 0006). SQLite's INTEGER is 64-bit already and must
#: stay INTEGER to be the AUTOINCREMENT rowid.
EntryId = BigInteger().with_variant(Integer(), "sqlite")


def _as_dict(obj: Base) -> dict[str, Any]:
    return {c.key: getattr(obj, c.key) for c in obj.__table__.columns}


# --------------------------------------------------------------------------- migrations


def migrations_dir() -> Path:
    """Directory of the Alembic scripts: the installed package, else the source checkout."""
    try:
        location = Path(str(importlib.resources.files("mgeo_index.migrations")))
        if (location / "env.py").is_file():
            return location
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str):
    """An in-code Alembic config (no alembic.ini) pointing at our migrations and ``url``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolates '%', which URL-encoded passwords may contain.
    cfg.set_main_option("sqlalchemy.url", str(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The database's Alembic revision, or None for an unmigrated database."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return _revision(conn)
    finally:
        engine.dispose()


def _revision(conn) -> str | None:
    """The revision recorded in ``alembic_version`` (what Alembic's MigrationContext reads), None without one."""
    from sqlalchemy import inspect

    if not inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise RuntimeError(f"the database records {len(rows)} schema revisions ({', '.join(rows)}); expected one")
    return rows[0] if rows else None


@lru_cache(maxsize=1)
def schema_head() -> str:
    """The newest migration's revision id, read from the migration files' ``revision`` / ``down_revision`` lines
    without loading Alembic (a test holds it to :func:`alembic_head`): the one revision no other names as its
    ``down_revision``."""
    revisions, parents = set(), set()
    for file in (migrations_dir() / "versions").glob("*.py"):
        source = file.read_text(encoding="utf-8")
        found = re.search(r'^revision(?::[^=]*)?=\s*["\']([^"\']+)["\']', source, flags=re.M)
        down = re.search(r"^down_revision(?::[^=]*)?=(.*)$", source, flags=re.M)
        if found:
            revisions.add(found.group(1))
        if found and down:
            parents.update(re.findall(r'["\']([^"\']+)["\']', down.group(1)))
    heads = revisions - parents
    if len(heads) != 1:
        raise RuntimeError(f"the migrations in {migrations_dir()} have {len(heads)} heads ({sorted(heads)}); expected one")
    return heads.pop()


def upgrade_if_behind(url: str) -> None:
    """:func:`upgrade` a database that is not at :func:`schema_head` (asking it costs one query; Alembic is
    loaded only to migrate)."""
    if current_revision(url) != schema_head():
        upgrade(url)


def alembic_head() -> str:
    """The newest migration's revision id (what ``upgrade`` brings a database to)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


# --------------------------------------------------------------------------- engine


def _is_sqlite_memory(url: str) -> bool:
    u = make_url(url)
    return u.get_backend_name() == "sqlite" and (u.database in (None, "", ":memory:") or "mode=memory" in str(u))


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")  # ignored (stays 'memory') for in-memory DBs
    finally:
        cursor.close()


def exists(url: str) -> bool:
    """Whether there may be a store at ``url`` already: False only for a SQLite file not created yet
    (asking a server whether its database is empty takes a connection: True)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or _is_sqlite_memory(url) or not u.database or u.database.startswith("file:"):
        return True
    return Path(u.database).expanduser().exists()


class ReadOnlyStore(ValueError):
    """A read-only SQLite store that cannot be used as it is (an older schema, a pending write-ahead log)."""


def _read_only_file(u) -> Path | None:
    """The SQLite file of ``u`` when it exists and cannot be written here (a read-only copy or mount)."""
    if u.get_backend_name() != "sqlite" or not u.database or u.database.startswith("file:") or u.database == ":memory:":
        return None
    from mgeo_index.files import writable

    path = Path(u.database).expanduser()
    if not path.is_file():
        return None
    # access(2), not open(): closing any descriptor of the file would drop this process's SQLite locks on it
    # (POSIX record locks belong to the process); access() sees immutable files and read-only mounts, as root too
    return None if os.access(path, os.W_OK) and writable(path.parent) else path


def read_only(url: str) -> Path | None:
    """The SQLite file of the store at ``url`` when it exists and cannot be written here (a read-only copy of an
    index), else None: what a command that must write (a job's record) checks before it starts."""
    return _read_only_file(make_url(url))


def _connect_read_only(path: Path) -> Engine:
    """The store in a read-only place, opened read-only and immutable (no lock or WAL files to create): for
    reading an index a writer checkpointed (every generation switch does)."""
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise ReadOnlyStore(f"{path} is read-only and its write-ahead log {wal.name} holds changes not yet in it; open "
                            "the index once where it is writable (any mgeo-index command), then copy it again")
    engine = create_engine(f"sqlite:///file:{path}?mode=ro&immutable=1&uri=true")
    with engine.connect() as conn:
        revision = _revision(conn)
    if revision != schema_head():
        engine.dispose()
        raise ReadOnlyStore(f"{path} is read-only and at schema {revision}, but this version reads {schema_head()}: "
                            f"run `mgeo-index db upgrade` on it where it is writable")
    event.listen(engine, "connect", lambda dbapi_conn, _record: dbapi_conn.execute("PRAGMA query_only=ON"))
    return engine


def checkpoint(engine: Engine) -> None:
    """SQLite: move the write-ahead log into the database file, so a copy of the file alone (a read-only
    deployment) holds every committed change. Nothing elsewhere."""
    if engine.dialect.name == "sqlite" and not _is_sqlite_memory(str(engine.url)):
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def connect(url: str) -> Engine:
    """Engine for ``url`` with all migrations applied.

    SQLite: the database file's directory is created, and every connection gets
    ``foreign_keys=ON`` and WAL journaling.  An in-memory SQLite database lives in
    a single shared connection (StaticPool), migrated through that connection. A SQLite file that cannot be
    written here (a read-only copy of an index) is opened read-only (:func:`_connect_read_only`): queries work,
    writes fail.
    """
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        upgrade_if_behind(url)
        return create_engine(url, pool_pre_ping=True)
    read_only = _read_only_file(u)
    if read_only is not None:
        return _connect_read_only(read_only)

    memory = _is_sqlite_memory(url)
    if not memory and u.database and not u.database.startswith("file:"):
        Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if memory:
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        # Migrate first through a private engine (see migrations/env.py), then hook pragmas.
        upgrade_if_behind(url)
        engine = create_engine(url)
    event.listen(engine, "connect", _sqlite_pragmas)
    if memory:
        from alembic import command

        cfg = alembic_config(url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    return engine
