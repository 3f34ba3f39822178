"""Catalogs and their entries (with each entry's parsed elements): the ``catalogs``, ``entries`` and
``entry_elements`` tables and the functions that read and write them.

An entry's ``id`` doubles as its FAISS vector id, so ids are never reused (``AUTOINCREMENT`` on SQLite).
"""
from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import (
    JSON,
    DateTime,
    Engine,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapped, Session, mapped_column

from mgeo_index.store.base import _IN_CHUNK, Base, EntryId, _utcnow


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
    numbers: Mapped[str | None] = mapped_column(String(16))  # migration 0008: the number policy (None: the default)
    profile: Mapped[str | None] = mapped_column(String(16))  # migration 0009: the profile (None: chosen at query time)
    name_column: Mapped[str | None] = mapped_column(String(255))  # migration 0010: the entries' names (None: in the text)
    lon_column: Mapped[str | None] = mapped_column(String(255))  # migration 0011: coordinates (None: found by name)
    lat_column: Mapped[str | None] = mapped_column(String(255))


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

    id: Mapped[int] = mapped_column(EntryId, primary_key=True, autoincrement=True)
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


# --------------------------------------------------------------------------- catalogs


def get_or_create_catalog(
    engine: Engine, name: str, *, source: str | None, address_column: str | None, id_column: str | None,
    numbers: str | None = None,
    profile: str | None = None,
    name_column: str | None = None,
    coordinate_columns: tuple[str | None, str | None] = (None, None),
) -> int:
    """Id of catalog ``name``, creating it if needed; source and columns are updated either way, the number policy,
    profile and name column when given (a rebuild without one keeps the catalog's)."""
    with Session(engine) as session, session.begin():
        catalog = session.scalar(select(Catalog).where(Catalog.name == name))
        if catalog is None:
            catalog = Catalog(name=name)
            session.add(catalog)
        catalog.source = None if source is None else str(source)
        catalog.address_column = address_column
        catalog.id_column = id_column
        if name_column is not None:
            catalog.name_column = name_column
        if coordinate_columns[0] is not None:
            catalog.lon_column, catalog.lat_column = coordinate_columns
        if numbers is not None:
            catalog.numbers = numbers
        if profile is not None:
            catalog.profile = profile
        session.flush()
        return catalog.id


def catalog_columns(engine: Engine, name: str) -> tuple[str | None, str | None] | None:
    """``(address_column, id_column)`` catalog ``name`` was built with, or None when there is no such catalog."""
    with Session(engine) as session:
        row = session.execute(select(Catalog.address_column, Catalog.id_column).where(Catalog.name == name)).first()
        return None if row is None else (row.address_column, row.id_column)


def catalog_numbers(engine: Engine, name: str) -> str | None:
    """The number policy catalog ``name`` was built with (None: not set, or no such catalog)."""
    with Session(engine) as session:
        return session.scalar(select(Catalog.numbers).where(Catalog.name == name))


def catalog_profile(engine: Engine, name: str) -> str | None:
    """The profile catalog ``name`` was built for (None: not set, or no such catalog)."""
    with Session(engine) as session:
        return session.scalar(select(Catalog.profile).where(Catalog.name == name))


def catalog_name_column(engine: Engine, name: str) -> str | None:
    """The column that names catalog ``name``'s entries (None: none, names read off the text, or no such catalog)."""
    with Session(engine) as session:
        return session.scalar(select(Catalog.name_column).where(Catalog.name == name))


def catalog_coordinate_columns(engine: Engine, name: str) -> tuple[str | None, str | None]:
    """(longitude, latitude) columns catalog ``name`` was built with (``--lon-column`` / ``--lat-column``); (None,
    None) when none were named (they are then found by name) or there is no such catalog."""
    with Session(engine) as session:
        row = session.execute(select(Catalog.lon_column, Catalog.lat_column).where(Catalog.name == name)).first()
        return (None, None) if row is None else (row.lon_column, row.lat_column)


def catalog_id(engine: Engine, name: str) -> int | None:
    with Session(engine) as session:
        return session.scalar(select(Catalog.id).where(Catalog.name == name))


def catalog_fields(engine: Engine, name: str) -> list[str]:
    """The other columns of catalog ``name`` (every column but its address and id ones), in the file's order, as
    its latest live entry keeps them; empty when it has none (or no entry)."""
    with Session(engine) as session:
        extra = session.scalar(select(Entry.extra).join(Catalog, Entry.catalog_id == Catalog.id)
                               .where(Catalog.name == name, Entry.retired_at.is_(None)).order_by(Entry.id.desc()).limit(1))
    return list(extra or {})


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
        if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg2" and len(params) >= COPY_MIN_ROWS:
            inserted = _copy_ignoring_conflicts(conn, params)
        elif conn.dialect.name in ("sqlite", "postgresql"):
            inserted = _insert_ignoring_conflicts(conn, params)
        else:
            inserted = _insert_missing(conn, catalog_id, params)
    return inserted, len(rows) - inserted


# PostgreSQL bulk loading: from this many rows a chunk goes through COPY into a temporary table and one
# INSERT … SELECT … ON CONFLICT DO NOTHING (README: measured against the batched INSERT).
COPY_MIN_ROWS = 1000
_COPY_COLUMNS = ("catalog_id", "created_at", *_ENTRY_FIELDS)


def _copy_ignoring_conflicts(conn: Connection, params: list[dict[str, Any]]) -> int:
    """:func:`_insert_ignoring_conflicts` through ``COPY``: the rows go to a temporary table in CSV (strings
    quoted, NULL as an unquoted empty field), then into ``entries`` in their order, new keys only."""
    columns = ", ".join(_COPY_COLUMNS)
    conn.exec_driver_sql("CREATE TEMP TABLE entries_load (LIKE entries INCLUDING DEFAULTS, ord bigint) ON COMMIT DROP")
    buffer = io.StringIO()
    for ord_, p in enumerate(params):
        buffer.write(",".join([_copy_field(p[c]) for c in _COPY_COLUMNS] + [str(ord_)]) + "\n")
    buffer.seek(0)
    with conn.connection.dbapi_connection.cursor() as cursor:
        cursor.copy_expert(f"COPY entries_load ({columns}, ord) FROM STDIN WITH (FORMAT csv)", buffer)
    inserted = conn.exec_driver_sql(
        f"INSERT INTO entries ({columns}) SELECT {columns} FROM entries_load ORDER BY ord "
        "ON CONFLICT (catalog_id, key) WHERE retired_at IS NULL DO NOTHING RETURNING id").all()
    conn.exec_driver_sql("DROP TABLE entries_load")
    return len(inserted)


def _copy_field(value: Any) -> str:
    """One CSV field for COPY: NULL as an unquoted empty field, numbers bare, everything else quoted."""
    if value is None:
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, datetime):
        value = value.isoformat(sep=" ")
    elif isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False)
    return '"' + str(value).replace('"', '""') + '"'


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
        EntryId, ForeignKey("entries.id", name="fk_entry_elements_entry_id", ondelete="CASCADE"), primary_key=True
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
