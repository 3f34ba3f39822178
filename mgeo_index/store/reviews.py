"""The human review loop (migration 0005): ``review_items`` (a persisted queue of queries to review),
``labels`` (decisions as labelled pairs: query, catalog entry, label — never deleted, an undo sets
``undone_at``) and ``model_versions`` (cross-encoders written by ``adapt`` and which one is active).

Decisions use optimistic concurrency: an item is decided by the one ``UPDATE … WHERE status =
'pending'`` that changes its row, so two reviewers deciding the same item at once leave exactly one
decision and the second gets :class:`ReviewConflict`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Engine, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, func, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from mgeo_index.settings import LABELS
from mgeo_index.store.base import _IN_CHUNK, Base, EntryId, _utcnow
from mgeo_index.store.catalogs import Entry

# A reviewer's decision on an item and the label each candidate gets from it: ``exact`` / ``partial``
# label the chosen candidate; ``none`` labels every candidate shown ``not_match``; ``skip`` labels nothing.
DECISIONS = ("exact", "partial", "none", "skip")
DECISION_LABELS = {"exact": "exact_match", "partial": "partial_match", "none": "not_match"}
ITEM_STATUSES = ("pending", "decided", "skipped")


class ReviewItem(Base):
    """One query of a review queue with the candidates shown (the resolver's matches, explained) and
    how uncertain the model was: ``margin`` (P(exact) of the best minus the second's: small = unsure)
    and ``disagreement`` (|network − feature head| on the best), the queue's order."""

    __tablename__ = "review_items"
    __table_args__ = (
        UniqueConstraint("queue", "row", name="uq_review_items_queue_row"),
        Index("ix_review_items_queue_status", "queue", "status", "margin"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    queue: Mapped[str] = mapped_column(String(64), nullable=False)
    row: Mapped[int] = mapped_column(Integer, nullable=False)
    query: Mapped[str] = mapped_column(Text, nullable=False)
    # the row's place name, for jobs kept as name + address (migration 0013); query_normalized then writes it too
    name: Mapped[str | None] = mapped_column(Text)
    query_normalized: Mapped[str] = mapped_column(Text, nullable=False)
    candidates: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    model_version: Mapped[str] = mapped_column(String(255), nullable=False)
    margin: Mapped[float] = mapped_column(Float, nullable=False)
    disagreement: Mapped[float] = mapped_column(Float, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="pending", server_default="pending")
    version: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    decided_by: Mapped[str | None] = mapped_column(String(255))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)


class Label(Base):
    """A labelled pair: ``query`` against catalog entry ``entry_id`` (its address kept in ``entry_address``
    so the pair survives the entry's purge), ``label`` one of :data:`~mgeo_index.settings.LABELS`."""

    __tablename__ = "labels"
    __table_args__ = (Index("ix_labels_query_normalized", "query_normalized"), Index("ix_labels_item_id", "item_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("review_items.id", name="fk_labels_item_id", ondelete="SET NULL"))
    query: Mapped[str] = mapped_column(Text, nullable=False)
    query_normalized: Mapped[str] = mapped_column(Text, nullable=False)
    entry_id: Mapped[int | None] = mapped_column(EntryId, ForeignKey("entries.id", name="fk_labels_entry_id", ondelete="SET NULL"))
    entry_address: Mapped[str] = mapped_column(Text, nullable=False)
    label: Mapped[str] = mapped_column(String(16), nullable=False)
    decision: Mapped[str] = mapped_column(String(16), nullable=False)
    probability: Mapped[float | None] = mapped_column(Float)
    model_version: Mapped[str | None] = mapped_column(String(255))
    reviewer: Mapped[str] = mapped_column(String(255), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)
    undone_at: Mapped[datetime | None] = mapped_column(DateTime)


class ModelVersion(Base):
    """A cross-encoder the index can use: ``path`` (relative to the index directory, or absolute),
    its fingerprint, the version it was adapted from, and whether it is the active one (at most one)."""

    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    path: Mapped[str] = mapped_column(Text, nullable=False)
    fingerprint: Mapped[str] = mapped_column(String(255), nullable=False)
    parent_id: Mapped[int | None] = mapped_column(Integer)
    active: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default="0")
    labels_used: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False, default=_utcnow)


class ReviewError(ValueError):
    """A decision the queue cannot take (unknown item, stale model version, bad decision)."""


class ReviewConflict(ReviewError):
    """The item was decided by someone else in the meantime."""


# --------------------------------------------------------------------------- queue


def add_review_items(engine: Engine, queue: str, items: Sequence[dict[str, Any]]) -> int:
    """Add items (``row``, ``query``, ``name`` (optional), ``query_normalized``, ``candidates``, ``model_version``,
    ``margin``, ``disagreement``) to ``queue``; rows already in the queue are left as they are. Returns how many
    were new."""
    if not items:
        return 0
    with engine.begin() as conn:
        known = set()
        rows = [int(item["row"]) for item in items]
        for i in range(0, len(rows), _IN_CHUNK):
            known.update(conn.execute(select(ReviewItem.row).where(
                ReviewItem.queue == queue, ReviewItem.row.in_(rows[i : i + _IN_CHUNK]))).scalars())
        fresh = [{**{k: item[k] for k in ("row", "query", "query_normalized", "candidates", "model_version",
                                          "margin", "disagreement")}, "name": item.get("name"), "queue": queue,
                  "created_at": _utcnow()}
                 for item in items if int(item["row"]) not in known]
        if fresh:
            conn.execute(insert(ReviewItem), fresh)
    return len(fresh)


def queue_rows(engine: Engine, queue: str) -> set[int]:
    """The rows ``queue`` holds already (to skip recomputing their candidates)."""
    with engine.connect() as conn:
        return set(conn.execute(select(ReviewItem.row).where(ReviewItem.queue == queue)).scalars())


QUEUE_ORDERS = ("uncertainty", "random")


def next_review_items(engine: Engine, queue: str, limit: int = 2, *, exclude: Iterable[int] = (),
                      order: str = "uncertainty") -> list[dict[str, Any]]:
    """The pending items of ``queue`` in review order. ``uncertainty``: what a label would settle most first —
    smallest margin, then the largest disagreement, then queue order. ``random``: a fixed pseudo-random
    order of the items (a representative sample at any point: what teaches ``adapt`` a labelling policy
    best, README *Adapt*). Either way an undone item comes back first (its margin is set to -1)."""
    if order not in QUEUE_ORDERS:
        raise ReviewError(f"order must be one of {', '.join(QUEUE_ORDERS)}, not {order!r}")
    table = ReviewItem.__table__
    query = select(table).where(table.c.queue == queue, table.c.status == "pending").limit(limit)
    if order == "uncertainty":
        query = query.order_by(table.c.margin, table.c.disagreement.desc(), table.c.row)
    else:  # Knuth's multiplicative hash of the id: the same order on SQLite and PostgreSQL, no state
        query = query.order_by(table.c.margin >= 0, (table.c.id * 2654435761) % 4294967296, table.c.id)
    excluded = [int(i) for i in exclude]
    if excluded:
        query = query.where(table.c.id.notin_(excluded))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def get_review_item(engine: Engine, item_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(select(ReviewItem.__table__).where(ReviewItem.id == item_id)).first()
    return dict(row._mapping) if row is not None else None


def review_counts(engine: Engine, queue: str) -> dict[str, int]:
    """Items of ``queue`` by status (``pending``, ``decided``, ``skipped``, ``total``) and its active
    labels by label."""
    with engine.connect() as conn:
        by_status = dict(conn.execute(select(ReviewItem.status, func.count()).where(ReviewItem.queue == queue)
                                      .group_by(ReviewItem.status)).all())
        by_label = dict(conn.execute(
            select(Label.label, func.count()).join(ReviewItem, Label.item_id == ReviewItem.id)
            .where(ReviewItem.queue == queue, Label.undone_at.is_(None)).group_by(Label.label)).all())
    out = {status: int(by_status.get(status, 0)) for status in ITEM_STATUSES}
    out["total"] = sum(out.values())
    out.update({label: int(by_label.get(label, 0)) for label in LABELS})
    return out


def decide(engine: Engine, item_id: int, decision: str, *, reviewer: str, model_version: str | None = None,
           candidate: int | None = None, expected_version: int | None = None) -> dict[str, Any]:
    """Record ``reviewer``'s decision on a pending item: ``exact`` / ``partial`` with ``candidate`` (0-based
    index into the candidates shown), ``none`` (none of them: every candidate shown gets ``not_match``)
    or ``skip``. ``model_version``: the version the reviewer was shown; it must be the item's.
    Raises :class:`ReviewError` (unknown item, bad decision or candidate, stale version) or
    :class:`ReviewConflict` (already decided). Returns the item after the decision."""
    if decision not in DECISIONS:
        raise ReviewError(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
    item = get_review_item(engine, item_id)
    if item is None:
        raise ReviewError(f"item {item_id} is not in any review queue")
    if model_version is not None and model_version != item["model_version"]:
        raise ReviewError(f"item {item_id} was scored by model {item['model_version']}, the page showed {model_version}: "
                          "reload the page")
    candidates = item["candidates"]
    if decision in ("exact", "partial"):
        if candidate is None or not 0 <= candidate < len(candidates):
            raise ReviewError(f"item {item_id} has {len(candidates)} candidates: candidate must be 1–{len(candidates)}")
        chosen = [candidates[candidate]]
    else:
        chosen = list(candidates) if decision == "none" else []
    now = _utcnow()
    with engine.begin() as conn:
        where = [ReviewItem.id == item_id, ReviewItem.status == "pending"]
        if expected_version is not None:
            where.append(ReviewItem.version == expected_version)
        changed = conn.execute(update(ReviewItem).where(*where).values(
            status="skipped" if decision == "skip" else "decided", version=ReviewItem.version + 1,
            decided_by=reviewer, decided_at=now)).rowcount
        if changed != 1:
            current = conn.execute(select(ReviewItem.status, ReviewItem.decided_by).where(ReviewItem.id == item_id)).first()
            raise ReviewConflict(f"item {item_id} was {current.status} by {current.decided_by} meanwhile: your decision "
                                 "was not recorded" if current.status != "pending" else
                                 f"item {item_id} changed meanwhile (undone): reload it")
        if chosen:
            conn.execute(insert(Label), [
                {"item_id": item_id, "query": item["query"], "query_normalized": item["query_normalized"],
                 "entry_id": c["id"], "entry_address": c["address"], "label": DECISION_LABELS[decision],
                 "decision": decision, "probability": c.get("probabilities", {}).get(DECISION_LABELS[decision]),
                 "model_version": item["model_version"], "reviewer": reviewer, "created_at": now} for c in chosen])
    return get_review_item(engine, item_id)


def undo_last(engine: Engine, queue: str, reviewer: str) -> dict[str, Any] | None:
    """Undo ``reviewer``'s latest decision in ``queue``: its labels get ``undone_at`` (kept, not deleted)
    and the item is pending again. Returns that item, or None when there is nothing to undo."""
    now = _utcnow()
    with engine.begin() as conn:
        row = conn.execute(select(ReviewItem.id).where(
            ReviewItem.queue == queue, ReviewItem.decided_by == reviewer, ReviewItem.status != "pending")
            .order_by(ReviewItem.decided_at.desc(), ReviewItem.id.desc()).limit(1)).first()
        if row is None:
            return None
        conn.execute(update(Label).where(Label.item_id == row.id, Label.undone_at.is_(None)).values(undone_at=now))
        conn.execute(update(ReviewItem).where(ReviewItem.id == row.id).values(
            status="pending", version=ReviewItem.version + 1, decided_by=None, decided_at=None, margin=-1.0))
    return get_review_item(engine, row.id)


# --------------------------------------------------------------------------- labels


def add_labels(engine: Engine, rows: Sequence[dict[str, Any]], *, reviewer: str, decision: str = "import") -> int:
    """Insert labelled pairs not from a queue (``labels import``): each row has ``query``,
    ``query_normalized``, ``entry_address``, ``label`` and optionally ``entry_id``, ``probability``,
    ``model_version``."""
    for n, row in enumerate(rows, 1):
        if row["label"] not in LABELS:
            raise ReviewError(f"row {n}: label must be one of {', '.join(LABELS)}, not {row['label']!r}")
    now = _utcnow()
    if rows:
        with engine.begin() as conn:
            conn.execute(insert(Label), [
                {"query": r["query"], "query_normalized": r["query_normalized"], "entry_id": r.get("entry_id"),
                 "entry_address": r["entry_address"], "label": r["label"], "decision": decision,
                 "probability": r.get("probability"), "model_version": r.get("model_version"), "reviewer": reviewer,
                 "created_at": now} for r in rows])
    return len(rows)


def list_labels(engine: Engine, *, include_undone: bool = False) -> list[dict[str, Any]]:
    """Every label, oldest first (``include_undone`` adds the undone ones)."""
    query = select(Label.__table__).order_by(Label.id)
    if not include_undone:
        query = query.where(Label.undone_at.is_(None))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def confirmations(engine: Engine, normalized: Sequence[str]) -> dict[str, dict[str, Any]]:
    """For each of these normalized query texts that has labels: ``confirmed``, the live entry ids a person
    labelled ``exact_match`` (latest first), and ``rejected``, the entry ids labelled ``not_match``. The
    latest active label of a (query, entry) pair wins; a retired entry's confirmation no longer counts."""
    wanted = list(dict.fromkeys(normalized))
    latest: dict[tuple[str, int], tuple[int, str, bool]] = {}
    with engine.connect() as conn:
        for i in range(0, len(wanted), _IN_CHUNK):
            query = (select(Label.id, Label.query_normalized, Label.entry_id, Label.label, Entry.retired_at)
                     .join(Entry, Entry.id == Label.entry_id)
                     .where(Label.query_normalized.in_(wanted[i : i + _IN_CHUNK]), Label.undone_at.is_(None)))
            for r in conn.execute(query):
                key = (r.query_normalized, r.entry_id)
                if key not in latest or latest[key][0] < r.id:
                    latest[key] = (r.id, r.label, r.retired_at is None)
    out: dict[str, dict[str, Any]] = {}
    for (text, entry_id), (label_id, label, live) in sorted(latest.items(), key=lambda kv: -kv[1][0]):
        answer = out.setdefault(text, {"confirmed": [], "rejected": set()})
        if label == "exact_match" and live:
            answer["confirmed"].append(entry_id)
        elif label == "not_match":
            answer["rejected"].add(entry_id)
    return out


# --------------------------------------------------------------------------- model versions


def add_model_version(engine: Engine, *, kind: str, path: str, fingerprint: str, parent_id: int | None = None,
                      labels_used: int = 0, metrics: dict[str, Any] | None = None, activate: bool = True) -> int:
    """Record a model version (and make it the active one of its kind unless ``activate`` is False)."""
    with engine.begin() as conn:
        if activate:
            conn.execute(update(ModelVersion).where(ModelVersion.kind == kind).values(active=False))
        return int(conn.execute(insert(ModelVersion).values(
            kind=kind, path=path, fingerprint=fingerprint, parent_id=parent_id, active=activate,
            labels_used=labels_used, metrics=metrics, created_at=_utcnow())).inserted_primary_key[0])


def active_model_version(engine: Engine, kind: str = "cross") -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(select(ModelVersion.__table__).where(ModelVersion.kind == kind, ModelVersion.active.is_(True))
                           .order_by(ModelVersion.id.desc()).limit(1)).first()
    return dict(row._mapping) if row is not None else None


def list_model_versions(engine: Engine, kind: str = "cross") -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            select(ModelVersion.__table__).where(ModelVersion.kind == kind).order_by(ModelVersion.id))]


def activate_model_version(engine: Engine, version_id: int | None, kind: str = "cross") -> None:
    """Make ``version_id`` the active version of ``kind`` (None: none active, i.e. the shipped model)."""
    with engine.begin() as conn:
        conn.execute(update(ModelVersion).where(ModelVersion.kind == kind).values(active=False))
        if version_id is not None:
            if conn.execute(update(ModelVersion).where(ModelVersion.id == version_id, ModelVersion.kind == kind)
                            .values(active=True)).rowcount != 1:
                raise ReviewError(f"no {kind} model version {version_id}")
