"""Relational store: catalogs, their entries and index builds (SQLAlchemy 2 + Alembic).

The schema is created and evolved only by the Alembic migrations in ``migrations/``
(installed as ``mgeo_index.migrations``); :func:`connect` applies pending ones.  The
models below mirror those migrations and serve queries and autogenerate.

All functions take an :class:`~sqlalchemy.Engine` and open a short session or
connection of their own.  Timestamps are naive UTC.  An entry's ``id`` doubles as
its FAISS vector id, so ids are never reused (``AUTOINCREMENT`` on SQLite).
"""
from __future__ import annotations

import importlib.resources
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import StaticPool

# SQLite's default limit on bound parameters is 32766 (>= 3.32); stay far below it.
_IN_CHUNK = 900
BUILD_STATUSES = ("running", "complete", "failed")


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Catalog(Base):
    __tablename__ = "catalogs"
    __table_args__ = (UniqueConstraint("name", name="uq_catalogs_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    source: Mapped[str | None] = mapped_column(Text)
    address_column: Mapped[str | None] = mapped_column(String(255))
    id_column: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)
    current_generation_id: Mapped[int | None] = mapped_column(Integer)  # migration 0003: the readers' pointer


_LIVE = text("retired_at IS NULL")


class Entry(Base):
    """A catalog entry.  Removed or replaced entries are *retired* (``retired_at`` set), not deleted,
    while a kept generation may still return them; a key is unique among live entries only."""

    __tablename__ = "entries"
    __table_args__ = (
        Index("uq_entries_catalog_live_key", "catalog_id", "key", unique=True, sqlite_where=_LIVE, postgresql_where=_LIVE),
        Index("ix_entries_catalog_id", "catalog_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    catalog_id: Mapped[int] = mapped_column(
        Integer,
        ForeignKey("catalogs.id", name="fk_entries_catalog_id", ondelete="CASCADE"),
        nullable=False,
    )
    key: Mapped[str] = mapped_column(Text, nullable=False)
    source_id: Mapped[str | None] = mapped_column(Text)
    address: Mapped[str] = mapped_column(Text, nullable=False)
    normalized: Mapped[str] = mapped_column(Text, nullable=False)
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    line: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)
    retired_at: Mapped[datetime | None] = mapped_column(DateTime)


class Build(Base):
    __tablename__ = "builds"
    __table_args__ = (Index("ix_builds_catalog_id", "catalog_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    catalog_id: Mapped[int] = mapped_column(
        Integer,
        ForeignKey("catalogs.id", name="fk_builds_catalog_id", ondelete="CASCADE"),
        nullable=False,
    )
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="running")
    model_fingerprint: Mapped[str | None] = mapped_column(String(255))
    index_factory: Mapped[str | None] = mapped_column(String(255))
    index_path: Mapped[str | None] = mapped_column(Text)
    rows_read: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    rows_inserted: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    rows_skipped: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    rows_rejected: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    entries_total: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    vectors_total: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)


# --------------------------------------------------------------------------- migrations


def migrations_dir() -> Path:
    """Directory of the Alembic scripts: the installed package, else the source checkout."""
    try:
        location = Path(str(importlib.resources.files("mgeo_index.migrations")))
        if (location / "env.py").is_file():
            return location
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str) -> Config:
    """An in-code Alembic config (no alembic.ini) pointing at our migrations and ``url``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolates '%', which URL-encoded passwords may contain.
    cfg.set_main_option("sqlalchemy.url", str(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The database's Alembic revision, or None for an unmigrated database."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


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


def connect(url: str) -> Engine:
    """Engine for ``url`` with all migrations applied.

    SQLite: the database file's directory is created, and every connection gets
    ``foreign_keys=ON`` and WAL journaling.  An in-memory SQLite database lives in
    a single shared connection (StaticPool), migrated through that connection.
    """
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        upgrade(url)
        return create_engine(url, pool_pre_ping=True)

    memory = _is_sqlite_memory(url)
    if not memory and u.database and not u.database.startswith("file:"):
        Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if memory:
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        # Migrate first through a private engine (see migrations/env.py), then hook pragmas.
        upgrade(url)
        engine = create_engine(url)
    event.listen(engine, "connect", _sqlite_pragmas)
    if memory:
        cfg = alembic_config(url)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    return engine


# --------------------------------------------------------------------------- catalogs


def get_or_create_catalog(
    engine: Engine, name: str, *, source: str | None, address_column: str | None, id_column: str | None
) -> int:
    """Id of catalog ``name``, creating it if needed; source and columns are updated either way."""
    with Session(engine) as session, session.begin():
        catalog = session.scalar(select(Catalog).where(Catalog.name == name))
        if catalog is None:
            catalog = Catalog(name=name)
            session.add(catalog)
        catalog.source = None if source is None else str(source)
        catalog.address_column = address_column
        catalog.id_column = id_column
        session.flush()
        return catalog.id


def catalog_columns(engine: Engine, name: str) -> tuple[str | None, str | None] | None:
    """``(address_column, id_column)`` catalog ``name`` was built with, or None when there is no such catalog."""
    with Session(engine) as session:
        row = session.execute(select(Catalog.address_column, Catalog.id_column).where(Catalog.name == name)).first()
        return None if row is None else (row.address_column, row.id_column)


def catalog_id(engine: Engine, name: str) -> int | None:
    with Session(engine) as session:
        return session.scalar(select(Catalog.id).where(Catalog.name == name))


# --------------------------------------------------------------------------- entries

_ENTRY_FIELDS = ("key", "source_id", "address", "normalized", "extra", "line")


def insert_entries(engine: Engine, catalog_id: int, rows: list[dict[str, Any]]) -> tuple[int, int]:
    """Insert rows whose ``(catalog_id, key)`` is new; return ``(inserted, skipped)``.

    Idempotent: rows already present (or repeated within ``rows``; the first wins)
    count as skipped.  SQLite and PostgreSQL use ``INSERT .. ON CONFLICT DO NOTHING
    RETURNING id`` in one batched statement; other dialects pre-select existing keys.
    """
    unique: dict[str, dict[str, Any]] = {}
    for row in rows:
        unique.setdefault(row["key"], row)
    now = _utcnow()
    params = [
        {"catalog_id": catalog_id, "created_at": now, **{f: row.get(f) for f in _ENTRY_FIELDS}}
        for row in unique.values()
    ]
    if not params:
        return 0, len(rows)

    with engine.begin() as conn:
        if conn.dialect.name in ("sqlite", "postgresql"):
            inserted = _insert_ignoring_conflicts(conn, params)
        else:
            inserted = _insert_missing(conn, catalog_id, params)
    return inserted, len(rows) - inserted


def _insert_ignoring_conflicts(conn: Connection, params: list[dict[str, Any]]) -> int:
    """``INSERT .. ON CONFLICT (catalog_id, key) DO NOTHING RETURNING id``; the rows
    returned are the ones actually inserted (batched by SQLAlchemy's insertmanyvalues)."""
    table = Entry.__table__
    insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
    stmt = insert(table).on_conflict_do_nothing(
        index_elements=["catalog_id", "key"], index_where=table.c.retired_at.is_(None)
    ).returning(table.c.id)
    return len(conn.execute(stmt, params).all())


def _insert_missing(conn: Connection, catalog_id: int, params: list[dict[str, Any]]) -> int:
    """Portable fallback: look up which keys exist, insert the others."""
    keys = [p["key"] for p in params]
    existing: set[str] = set()
    for i in range(0, len(keys), _IN_CHUNK):
        existing.update(
            conn.scalars(
                select(Entry.key).where(
                    Entry.catalog_id == catalog_id, Entry.retired_at.is_(None), Entry.key.in_(keys[i : i + _IN_CHUNK])
                )
            )
        )
    fresh = [p for p in params if p["key"] not in existing]
    if fresh:
        conn.execute(Entry.__table__.insert(), fresh)
    return len(fresh)


def upsert_entries(engine: Engine, catalog_id: int, rows: list[dict[str, Any]]) -> tuple[int, int, int]:
    """Insert new keys, replace entries whose address changed; return ``(inserted, updated, unchanged)``.

    A key already live with the same normalized address keeps its entry (and vector): its raw address,
    source id and extra columns are refreshed in place.  A key whose normalized address changed is an
    *update*: the old entry is retired and a new entry (new id, so it is re-embedded) takes its key,
    in one transaction.  Rows repeated within ``rows``: the first wins.  Idempotent.
    """
    unique: dict[str, dict[str, Any]] = {}
    for row in rows:
        unique.setdefault(row["key"], row)
    keys = list(unique)
    updated = unchanged = 0
    now = _utcnow()
    with engine.begin() as conn:
        live: dict[str, tuple[int, str, str]] = {}
        for i in range(0, len(keys), _IN_CHUNK):
            query = select(Entry.key, Entry.id, Entry.normalized, Entry.address).where(
                Entry.catalog_id == catalog_id, Entry.retired_at.is_(None), Entry.key.in_(keys[i : i + _IN_CHUNK])
            )
            live.update({r.key: (r.id, r.normalized, r.address) for r in conn.execute(query)})
        retire, fresh = [], []
        for key, row in unique.items():
            current = live.get(key)
            if current is None:
                fresh.append(row)
            elif current[1] != row["normalized"]:
                retire.append(current[0])
                fresh.append(row)
                updated += 1
            else:
                unchanged += 1
                if current[2] != row["address"]:
                    values = {f: row.get(f) for f in ("address", "source_id", "extra", "line")}
                    conn.execute(update(Entry).where(Entry.id == current[0]).values(**values))
        for i in range(0, len(retire), _IN_CHUNK):
            conn.execute(update(Entry).where(Entry.id.in_(retire[i : i + _IN_CHUNK])).values(retired_at=now))
        if fresh:
            params = [{"catalog_id": catalog_id, "created_at": now, **{f: r.get(f) for f in _ENTRY_FIELDS}} for r in fresh]
            conn.execute(Entry.__table__.insert(), params)
    return len(fresh) - updated, updated, unchanged


def retire_entries(engine: Engine, catalog_id: int, keys: Iterable[str]) -> tuple[list[int], list[str]]:
    """Retire the live entries with these keys (catalog ids); return ``(retired entry ids, keys not live)``.

    Keys that are not live (never stored, or already removed) are returned, not an error: re-running
    an interrupted removal must succeed.
    """
    wanted = list(dict.fromkeys(str(k) for k in keys))
    found: dict[str, int] = {}
    with engine.begin() as conn:
        for i in range(0, len(wanted), _IN_CHUNK):
            query = select(Entry.key, Entry.id).where(
                Entry.catalog_id == catalog_id, Entry.retired_at.is_(None), Entry.key.in_(wanted[i : i + _IN_CHUNK])
            )
            found.update({k: entry_id for k, entry_id in conn.execute(query)})
        ids = sorted(found.values())
        now = _utcnow()
        for i in range(0, len(ids), _IN_CHUNK):
            conn.execute(update(Entry).where(Entry.id.in_(ids[i : i + _IN_CHUNK])).values(retired_at=now))
    return ids, [k for k in wanted if k not in found]


def purge_retired(engine: Engine, catalog_id: int, keep_ids: np.ndarray) -> int:
    """Delete retired entries of the catalog except ``keep_ids`` (still returned by a kept generation)."""
    keep = set(int(i) for i in keep_ids)
    with engine.begin() as conn:
        retired = conn.scalars(select(Entry.id).where(Entry.catalog_id == catalog_id, Entry.retired_at.is_not(None))).all()
        doomed = [i for i in retired if i not in keep]
        for i in range(0, len(doomed), _IN_CHUNK):
            conn.execute(delete(Entry).where(Entry.id.in_(doomed[i : i + _IN_CHUNK])))
    return len(doomed)


def count_entries(engine: Engine, catalog_id: int) -> int:
    """Live entries of the catalog."""
    with engine.connect() as conn:
        query = select(func.count()).select_from(Entry).where(Entry.catalog_id == catalog_id, Entry.retired_at.is_(None))
        return int(conn.scalar(query) or 0)


def entry_ids(engine: Engine, catalog_id: int) -> np.ndarray:
    """All live entry ids of the catalog, ascending, as an int64 array."""
    with engine.connect() as conn:
        result = conn.execution_options(yield_per=50_000).scalars(
            select(Entry.id).where(Entry.catalog_id == catalog_id, Entry.retired_at.is_(None)).order_by(Entry.id)
        )
        return np.fromiter(result, dtype=np.int64)


def _keyset_batches(engine: Engine, select_after: Callable[[int], Any], batch_size: int) -> Iterator[list[dict[str, Any]]]:
    """Batches of the rows of ``select_after(last_id)`` (a select ordered by ``id``), by keyset pagination:
    each query is cheap and no connection is held between batches."""
    last = -1
    while True:
        with engine.connect() as conn:
            batch = [dict(r._mapping) for r in conn.execute(select_after(last).limit(batch_size))]
        if not batch:
            return
        last = batch[-1]["id"]
        yield batch
        if len(batch) < batch_size:
            return


def iter_entries(
    engine: Engine, catalog_id: int, ids: Iterable[int] | None = None, batch_size: int = 5000
) -> Iterator[list[dict[str, Any]]]:
    """Yield batches of ``{"id", "address", "normalized"}`` dicts in ascending id order.

    Keyset pagination (``id > last``) keeps each query cheap; without ``ids`` the live entries are
    read, with ``ids`` exactly those entries (of this catalog, live or retired).  No connection is held between batches.
    """
    columns = (Entry.id, Entry.address, Entry.normalized)
    if ids is None:
        yield from _keyset_batches(
            engine,
            lambda last: select(*columns)
            .where(Entry.catalog_id == catalog_id, Entry.retired_at.is_(None), Entry.id > last)
            .order_by(Entry.id),
            batch_size,
        )
    else:
        wanted = sorted({int(i) for i in ids})
        step = min(batch_size, _IN_CHUNK)
        pending: list[dict[str, Any]] = []
        for i in range(0, len(wanted), step):
            stmt = (
                select(*columns)
                .where(Entry.catalog_id == catalog_id, Entry.id.in_(wanted[i : i + step]))
                .order_by(Entry.id)
            )
            with engine.connect() as conn:
                pending.extend(dict(r._mapping) for r in conn.execute(stmt))
            while len(pending) >= batch_size:
                yield pending[:batch_size]
                pending = pending[batch_size:]
        if pending:
            yield pending


def get_entries(engine: Engine, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Entries by id (any catalog); ids that do not exist are absent from the result."""
    columns = (Entry.id, Entry.catalog_id, Entry.source_id, Entry.address, Entry.normalized, Entry.extra)
    wanted = list(dict.fromkeys(int(i) for i in ids))
    out: dict[int, dict[str, Any]] = {}
    with engine.connect() as conn:
        for i in range(0, len(wanted), _IN_CHUNK):
            for r in conn.execute(select(*columns).where(Entry.id.in_(wanted[i : i + _IN_CHUNK]))):
                out[r.id] = dict(r._mapping)
    return out


def ids_by_normalized(engine: Engine, catalog_id: int, normalized: list[str]) -> list[int | None]:
    """For each normalized address, the smallest id of a live entry of the catalog that has it (else None)."""
    wanted = list(dict.fromkeys(normalized))
    found: dict[str, int] = {}
    with engine.connect() as conn:
        for i in range(0, len(wanted), _IN_CHUNK):
            query = (
                select(Entry.normalized, func.min(Entry.id))
                .where(
                    Entry.catalog_id == catalog_id, Entry.retired_at.is_(None), Entry.normalized.in_(wanted[i : i + _IN_CHUNK])
                )
                .group_by(Entry.normalized)
            )
            found.update({text: entry_id for text, entry_id in conn.execute(query)})
    return [found.get(text) for text in normalized]


# --------------------------------------------------------------------------- parsed elements


class EntryElements(Base):
    """Parsed elements and admin codes of one entry (migration ``0004_elements``)."""

    __tablename__ = "entry_elements"
    __table_args__ = (
        Index("ix_entry_elements_city_code", "city_code"),
        Index("ix_entry_elements_district_code", "district_code"),
    )

    entry_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("entries.id", name="fk_entry_elements_entry_id", ondelete="CASCADE"), primary_key=True
    )
    elements: Mapped[list[Any]] = mapped_column(JSON, nullable=False)
    admin: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    province_code: Mapped[str | None] = mapped_column(String(12))
    city_code: Mapped[str | None] = mapped_column(String(12))
    district_code: Mapped[str | None] = mapped_column(String(12))
    town_code: Mapped[str | None] = mapped_column(String(12))
    parser: Mapped[str] = mapped_column(String(64), nullable=False)


def entries_to_parse(engine: Engine, catalog_id: int, parser: str, batch_size: int = 5000) -> Iterator[list[dict[str, Any]]]:
    """Batches of ``{"id", "normalized"}`` of the catalog's live entries that have no parsed elements yet
    or whose elements were parsed by another parser version than ``parser``."""
    yield from _keyset_batches(
        engine,
        lambda last: select(Entry.id, Entry.normalized)
        .outerjoin(EntryElements, EntryElements.entry_id == Entry.id)
        .where(Entry.catalog_id == catalog_id, Entry.retired_at.is_(None), Entry.id > last,
               or_(EntryElements.entry_id.is_(None), EntryElements.parser != parser))
        .order_by(Entry.id),
        batch_size,
    )


def store_elements(engine: Engine, rows: list[dict[str, Any]]) -> int:
    """Store parsed rows ``{"entry_id", "elements", "admin", "parser"}`` (codes taken from admin), replacing
    what those entries had, in one transaction."""
    params = [
        {
            "entry_id": r["entry_id"], "elements": r["elements"], "admin": r["admin"], "parser": r["parser"],
            **{f"{k}_code": r["admin"].get(f"{k}_code") for k in ("province", "city", "district", "town")},
        }
        for r in rows
    ]
    if params:
        with engine.begin() as conn:
            ids = [p["entry_id"] for p in params]
            for i in range(0, len(ids), _IN_CHUNK):
                conn.execute(delete(EntryElements).where(EntryElements.entry_id.in_(ids[i : i + _IN_CHUNK])))
            conn.execute(EntryElements.__table__.insert(), params)
    return len(params)


def get_elements(engine: Engine, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Parsed elements by entry id: ``{"elements", "admin", ...}``; entries not parsed are absent."""
    wanted = list(dict.fromkeys(int(i) for i in ids))
    out: dict[int, dict[str, Any]] = {}
    with engine.connect() as conn:
        for i in range(0, len(wanted), _IN_CHUNK):
            stmt = select(EntryElements).where(EntryElements.entry_id.in_(wanted[i : i + _IN_CHUNK]))
            for r in conn.execute(stmt):
                out[r.entry_id] = dict(r._mapping)
    return out


# --------------------------------------------------------------------------- builds

_BUILD_FIELDS = frozenset(c.key for c in Build.__table__.columns) - {"id", "catalog_id", "started_at"}


def _as_dict(obj: Base) -> dict[str, Any]:
    return {c.key: getattr(obj, c.key) for c in obj.__table__.columns}


def start_build(engine: Engine, catalog_id: int, *, model_fingerprint: str, index_factory: str) -> int:
    with Session(engine) as session, session.begin():
        build = Build(
            catalog_id=catalog_id,
            status="running",
            model_fingerprint=model_fingerprint,
            index_factory=index_factory,
        )
        session.add(build)
        session.flush()
        return build.id


def _update_build(engine: Engine, build_id: int, values: dict[str, Any]) -> None:
    unknown = set(values) - _BUILD_FIELDS
    if unknown:
        raise TypeError(f"unknown build field(s): {', '.join(sorted(unknown))}")
    if values.get("status", "running") not in BUILD_STATUSES:
        raise ValueError(f"build status must be one of {BUILD_STATUSES}, got {values['status']!r}")
    with engine.begin() as conn:
        result = conn.execute(update(Build).where(Build.id == build_id).values(**values))
        if result.rowcount == 0:
            raise LookupError(f"no build with id {build_id}")


def finish_build(engine: Engine, build_id: int, **fields: Any) -> None:
    """Mark the build complete (``finished_at`` = now) and store the given columns."""
    _update_build(engine, build_id, {"status": "complete", "finished_at": _utcnow(), **fields})


def fail_build(engine: Engine, build_id: int, error: str) -> None:
    _update_build(engine, build_id, {"status": "failed", "finished_at": _utcnow(), "error": error})


def latest_build(engine: Engine, catalog_id: int) -> dict[str, Any] | None:
    """The most recent *complete* build of the catalog, as a dict of its columns."""
    with Session(engine) as session:
        build = session.scalar(
            select(Build)
            .where(Build.catalog_id == catalog_id, Build.status == "complete")
            .order_by(Build.id.desc())
            .limit(1)
        )
        return None if build is None else _as_dict(build)


def list_builds(engine: Engine, catalog_id: int | None = None) -> list[dict[str, Any]]:
    """All builds (of one catalog, if given), oldest first."""
    stmt = select(Build).order_by(Build.id)
    if catalog_id is not None:
        stmt = stmt.where(Build.catalog_id == catalog_id)
    with Session(engine) as session:
        return [_as_dict(b) for b in session.scalars(stmt)]


# --------------------------------------------------------------------------- jobs (migration 0002)

JOB_STATUSES = ("running", "interrupted", "failed", "complete", "abandoned")
JOB_COUNTS = ("matched", "ambiguous", "unmatched", "rejected")


class Job(Base):
    """One normalize run over one input file, resumable: ``rows_done`` input records are
    final in ``parts_done`` part files, each recorded as a :class:`JobCheckpoint`."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_output_path", "output_path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), nullable=False, default="normalize")
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="running")
    input_path: Mapped[str] = mapped_column(Text, nullable=False)
    input_fingerprint: Mapped[str] = mapped_column(String(128), nullable=False)
    input_format: Mapped[str] = mapped_column(String(16), nullable=False)
    output_path: Mapped[str] = mapped_column(Text, nullable=False)
    output_format: Mapped[str] = mapped_column(String(16), nullable=False)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    index_dir: Mapped[str | None] = mapped_column(Text)
    build_id: Mapped[int | None] = mapped_column(Integer)
    index_file: Mapped[str | None] = mapped_column(Text)
    model_fingerprint: Mapped[str | None] = mapped_column(String(255))
    cross_model_fingerprint: Mapped[str | None] = mapped_column(String(255))
    engine: Mapped[str | None] = mapped_column(String(16))
    rows_total: Mapped[int | None] = mapped_column(Integer)
    rows_done: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    parts_done: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    matched: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    ambiguous: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    unmatched: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    rejected: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    runs: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)


class JobCheckpoint(Base):
    __tablename__ = "job_checkpoints"

    job_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("jobs.id", name="fk_job_checkpoints_job_id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    rows_end: Mapped[int] = mapped_column(Integer, nullable=False)  # input records final after this part
    rows: Mapped[int] = mapped_column(Integer, nullable=False)
    part_file: Mapped[str] = mapped_column(Text, nullable=False)
    part_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)


_JOB_FIELDS = frozenset(c.key for c in Job.__table__.columns) - {"id"}


def create_job(engine: Engine, /, **fields: Any) -> int:
    unknown = set(fields) - _JOB_FIELDS
    if unknown:
        raise TypeError(f"unknown job field(s): {', '.join(sorted(unknown))}")
    with Session(engine) as session, session.begin():
        job = Job(**fields)
        session.add(job)
        session.flush()
        return job.id


def update_job(engine: Engine, job_id: int, /, **values: Any) -> None:
    unknown = set(values) - _JOB_FIELDS
    if unknown:
        raise TypeError(f"unknown job field(s): {', '.join(sorted(unknown))}")
    if values.get("status", "running") not in JOB_STATUSES:
        raise ValueError(f"job status must be one of {JOB_STATUSES}, got {values['status']!r}")
    with engine.begin() as conn:
        result = conn.execute(update(Job).where(Job.id == job_id).values(updated_at=_utcnow(), **values))
        if result.rowcount == 0:
            raise LookupError(f"no job with id {job_id}")


def get_job(engine: Engine, job_id: int) -> dict[str, Any] | None:
    with Session(engine) as session:
        job = session.get(Job, job_id)
        return None if job is None else _as_dict(job)


def latest_job(engine: Engine, output_path: str) -> dict[str, Any] | None:
    """The most recent job writing ``output_path``, whatever its status."""
    with Session(engine) as session:
        job = session.scalar(select(Job).where(Job.output_path == output_path).order_by(Job.id.desc()).limit(1))
        return None if job is None else _as_dict(job)


def list_jobs(engine: Engine, limit: int | None = None) -> list[dict[str, Any]]:
    """Jobs, newest first."""
    stmt = select(Job).order_by(Job.id.desc())
    if limit:
        stmt = stmt.limit(limit)
    with Session(engine) as session:
        return [_as_dict(j) for j in session.scalars(stmt)]


def add_checkpoint(
    engine: Engine, job_id: int, *, seq: int, rows_end: int, rows: int, part_file: str, part_bytes: int,
    counts: dict[str, int],
) -> None:
    """Record part ``seq`` and advance the job, in one transaction: either both or neither."""
    now = _utcnow()
    with engine.begin() as conn:
        conn.execute(
            JobCheckpoint.__table__.insert(),
            {"job_id": job_id, "seq": seq, "rows_end": rows_end, "rows": rows, "part_file": part_file,
             "part_bytes": part_bytes, "counts": counts, "created_at": now},
        )
        values: dict[str, Any] = {"rows_done": rows_end, "parts_done": seq, "updated_at": now}
        for name in JOB_COUNTS:
            values[name] = getattr(Job, name) + int(counts.get(name, 0))
        result = conn.execute(update(Job).where(Job.id == job_id, Job.parts_done == seq - 1).values(**values))
        if result.rowcount != 1:
            raise LookupError(f"job {job_id} is not at part {seq - 1}; is another process running it?")


def job_checkpoints(engine: Engine, job_id: int) -> list[dict[str, Any]]:
    with Session(engine) as session:
        stmt = select(JobCheckpoint).where(JobCheckpoint.job_id == job_id).order_by(JobCheckpoint.seq)
        return [_as_dict(c) for c in session.scalars(stmt)]


# --------------------------------------------------------------------------- generations (migration 0003)


class Generation(Base):
    """One complete, immutable set of index files of a catalog; ``catalogs.current_generation_id``
    names the one readers use."""

    __tablename__ = "generations"
    __table_args__ = (Index("ix_generations_catalog_id", "catalog_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    catalog_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("catalogs.id", name="fk_generations_catalog_id", ondelete="CASCADE"), nullable=False
    )
    parent_id: Mapped[int | None] = mapped_column(Integer)
    build_id: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    index_file: Mapped[str] = mapped_column(Text, nullable=False)
    sparse_file: Mapped[str | None] = mapped_column(Text)
    index_factory: Mapped[str] = mapped_column(String(255), nullable=False)
    dim: Mapped[int] = mapped_column(Integer, nullable=False)
    ntotal: Mapped[int] = mapped_column(Integer, nullable=False)
    ids_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    checksums: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    model_fingerprint: Mapped[str] = mapped_column(String(255), nullable=False)
    model_path: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)


_GENERATION_FIELDS = frozenset(c.key for c in Generation.__table__.columns) - {"id", "catalog_id", "parent_id", "created_at"}


class GenerationConflict(Exception):
    """Another writer moved the catalog's pointer since this one read it."""


def current_generation(engine: Engine, catalog_id: int) -> dict[str, Any] | None:
    """The generation readers use now (``catalogs.current_generation_id``), or None."""
    with Session(engine) as session:
        generation = session.scalar(
            select(Generation).join(Catalog, Catalog.current_generation_id == Generation.id).where(Catalog.id == catalog_id)
        )
        return None if generation is None else _as_dict(generation)


def list_generations(engine: Engine, catalog_id: int) -> list[dict[str, Any]]:
    """The catalog's recorded generations, newest first."""
    with Session(engine) as session:
        stmt = select(Generation).where(Generation.catalog_id == catalog_id).order_by(Generation.id.desc())
        return [_as_dict(g) for g in session.scalars(stmt)]


def switch_generation(
    engine: Engine, catalog_id: int, *, expected: int | None, build_id: int | None = None,
    build_fields: dict[str, Any] | None = None, **fields: Any,
) -> int:
    """Record a new generation, point the catalog at it and finish its build: one transaction.

    ``expected`` is the generation the writer started from; if the pointer moved meanwhile nothing
    is changed and :class:`GenerationConflict` is raised (compare-and-swap).
    """
    unknown = set(fields) - _GENERATION_FIELDS
    if unknown:
        raise TypeError(f"unknown generation field(s): {', '.join(sorted(unknown))}")
    with Session(engine) as session, session.begin():
        generation = Generation(catalog_id=catalog_id, parent_id=expected, build_id=build_id, **fields)
        session.add(generation)
        session.flush()
        pointer = Catalog.current_generation_id
        moved = session.execute(
            update(Catalog)
            .where(Catalog.id == catalog_id, pointer.is_(None) if expected is None else pointer == expected)
            .values(current_generation_id=generation.id)
        )
        if moved.rowcount != 1:
            raise GenerationConflict(
                f"catalog {catalog_id}: the current generation is no longer {expected}; another writer switched it"
            )
        if build_id is not None:
            values = {"status": "complete", "finished_at": _utcnow(), **(build_fields or {})}
            session.execute(update(Build).where(Build.id == build_id).values(**values))
        return generation.id


def delete_generations(engine: Engine, ids: Iterable[int]) -> None:
    """Forget generations (never the current one of its catalog)."""
    ids = [int(i) for i in ids]
    with engine.begin() as conn:
        current = set(conn.scalars(select(Catalog.current_generation_id).where(Catalog.current_generation_id.is_not(None))))
        if current & set(ids):
            raise ValueError(f"generation {sorted(current & set(ids))[0]} is current; it cannot be deleted")
        for i in range(0, len(ids), _IN_CHUNK):
            conn.execute(delete(Generation).where(Generation.id.in_(ids[i : i + _IN_CHUNK])))
