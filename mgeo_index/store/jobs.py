"""Normalize jobs (migration 0002): the ``jobs`` table, one resumable run over one input file, and
``job_checkpoints``, one row per part file a job has finished."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Engine, Float, ForeignKey, Index, Integer, String, Text, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from mgeo_index.store.base import Base, _as_dict, _utcnow

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
    runner: Mapped[str | None] = mapped_column(String(16))  # local or ray (mgeo_index.compute)
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
