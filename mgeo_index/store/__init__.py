"""Relational store: catalogs, their entries, index builds, normalize jobs and index generations
(SQLAlchemy 2 + Alembic), one module per group of tables:

- :mod:`~mgeo_index.store.base`: ``Base``, :func:`connect` and the Alembic helpers (the schema is
  created and evolved only by the migrations in ``migrations/``, installed as ``mgeo_index.migrations``;
  :func:`connect` applies pending ones; the models mirror them and serve queries and autogenerate);
- :mod:`~mgeo_index.store.catalogs`: ``catalogs``, ``entries``, ``entry_elements``;
- :mod:`~mgeo_index.store.builds`: ``builds``;
- :mod:`~mgeo_index.store.jobs`: ``jobs``, ``job_checkpoints``;
- :mod:`~mgeo_index.store.generations`: ``generations``;
- :mod:`~mgeo_index.store.reviews`: ``review_items``, ``labels``, ``model_versions`` (the review loop).

Everything is re-exported here: callers write ``from mgeo_index import store; store.get_entries(...)``.
All functions take an :class:`~sqlalchemy.Engine` and open a short session or connection of their own.
Timestamps are naive UTC.  An entry's ``id`` doubles as its FAISS vector id, so ids are never reused
(``AUTOINCREMENT`` on SQLite).
"""
from __future__ import annotations

from sqlalchemy.orm import Session  # noqa: F401  (store.Session: sessions over the store's models)

from mgeo_index.store.base import (  # noqa: F401  (_utcnow: used by callers and tests)
    Base,
    _utcnow,
    alembic_config,
    alembic_head,
    schema_head,
    connect,
    current_revision,
    downgrade,
    exists,
    migrations_dir,
    read_only,
    upgrade,
)
from mgeo_index.store.builds import (
    BUILD_STATUSES,
    Build,
    fail_build,
    finish_build,
    latest_build,
    list_builds,
    start_build,
)
from mgeo_index.store.catalogs import (  # noqa: F401  (_insert_missing: the portable fallback, tested directly)
    Catalog,
    Entry,
    EntryElements,
    _insert_missing,
    catalog_columns,
    catalog_coordinate_columns,
    catalog_fields,
    catalog_name_column,
    catalog_numbers,
    catalog_profile,
    catalog_id,
    count_entries,
    entries_to_parse,
    entry_ids,
    get_elements,
    get_entries,
    get_or_create_catalog,
    ids_by_normalized,
    insert_entries,
    iter_entries,
    purge_retired,
    retire_entries,
    store_elements,
    upsert_entries,
)
from mgeo_index.store.generations import (
    Generation,
    GenerationConflict,
    current_generation,
    delete_generations,
    list_generations,
    switch_generation,
)
from mgeo_index.store.reviews import (
    DECISION_LABELS,
    DECISIONS,
    QUEUE_ORDERS,
    Label,
    ModelVersion,
    ReviewConflict,
    ReviewError,
    ReviewItem,
    activate_model_version,
    active_model_version,
    add_labels,
    add_model_version,
    add_review_items,
    confirmations,
    decide,
    get_review_item,
    list_labels,
    list_model_versions,
    next_review_items,
    queue_rows,
    review_counts,
    undo_last,
)
from mgeo_index.store.jobs import (
    JOB_COUNTS,
    JOB_STATUSES,
    Job,
    JobCheckpoint,
    add_checkpoint,
    create_job,
    get_job,
    job_checkpoints,
    latest_job,
    list_jobs,
    update_job,
)

__all__ = [
    "BUILD_STATUSES", "DECISIONS", "DECISION_LABELS", "JOB_COUNTS", "JOB_STATUSES", "QUEUE_ORDERS",
    "Base", "Build", "Catalog", "Entry", "EntryElements", "Generation", "GenerationConflict", "Job", "JobCheckpoint",
    "Label", "ModelVersion", "ReviewConflict", "ReviewError", "ReviewItem", "Session",
    "activate_model_version", "active_model_version", "add_labels", "add_model_version", "add_review_items",
    "confirmations", "decide", "get_review_item", "list_labels", "list_model_versions", "next_review_items",
    "queue_rows", "review_counts", "undo_last",
    "add_checkpoint", "alembic_config", "alembic_head", "schema_head", "catalog_columns", "catalog_coordinate_columns", "catalog_fields", "catalog_id", "catalog_name_column", "catalog_numbers", "catalog_profile", "connect", "count_entries", "read_only",
    "create_job", "current_generation", "current_revision", "delete_generations", "downgrade", "entries_to_parse",
    "entry_ids", "exists", "fail_build", "finish_build", "get_elements", "get_entries", "get_job",
    "get_or_create_catalog", "ids_by_normalized", "insert_entries", "iter_entries", "job_checkpoints", "latest_build",
    "latest_job", "list_builds", "list_generations", "list_jobs", "migrations_dir", "purge_retired",
    "retire_entries", "start_build", "store_elements", "switch_generation", "update_job", "upgrade",
    "upsert_entries",
]
