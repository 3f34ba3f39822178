"""Index builds: the ``builds`` table, one row per build of a catalog (its status and counts)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Engine, Float, ForeignKey, Index, Integer, String, Text, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from mgeo_index.store.base import Base, _as_dict, _utcnow

BUILD_STATUSES = ("running", "complete", "failed")


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


_BUILD_FIELDS = frozenset(c.key for c in Build.__table__.columns) - {"id", "catalog_id", "started_at"}


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
