"""Index generations (migration 0003): the ``generations`` table and the catalog's pointer to the
current one, moved by compare-and-swap in the transaction that finishes a build."""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Engine, ForeignKey, Index, Integer, String, Text, delete, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from mgeo_index.store.base import _IN_CHUNK, Base, _as_dict, _utcnow, checkpoint
from mgeo_index.store.builds import Build
from mgeo_index.store.catalogs import Catalog


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
    # None: ``index_file`` is a FAISS file in the index directory; else the vector store's URL (no credentials)
    # and ``index_file`` names the generation's collection there (migration 0007, :mod:`mgeo_index.index.vector_store`)
    vector_store: Mapped[str | None] = mapped_column(Text)
    # how its vectors were computed (mgeo_index.runtime.plan: torch/int8-rows/blocked, …); None before migration 0012
    plan: Mapped[str | None] = mapped_column(String(255))
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
        switched = generation.id
    checkpoint(engine)  # the database file alone now holds the generation: a read-only copy of it serves it
    return switched


def delete_generations(engine: Engine, ids: Iterable[int]) -> None:
    """Forget generations (never the current one of its catalog)."""
    ids = [int(i) for i in ids]
    with engine.begin() as conn:
        current = set(conn.scalars(select(Catalog.current_generation_id).where(Catalog.current_generation_id.is_not(None))))
        if current & set(ids):
            raise ValueError(f"generation {sorted(current & set(ids))[0]} is current; it cannot be deleted")
        for i in range(0, len(ids), _IN_CHUNK):
            conn.execute(delete(Generation).where(Generation.id.in_(ids[i : i + _IN_CHUNK])))
