"""initial schema: catalogs, entries, builds

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "catalogs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("address_column", sa.String(length=255), nullable=True),
        sa.Column("id_column", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("name", name="uq_catalogs_name"),
    )
    op.create_table(
        "entries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "catalog_id",
            sa.Integer(),
            sa.ForeignKey("catalogs.id", name="fk_entries_catalog_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("source_id", sa.Text(), nullable=True),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("normalized", sa.Text(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.Column("line", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("catalog_id", "key", name="uq_entries_catalog_key"),
        # Entry ids double as FAISS vector ids: SQLite's AUTOINCREMENT guarantees
        # they are never reused after deletes.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_entries_catalog_id", "entries", ["catalog_id"])
    op.create_table(
        "builds",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "catalog_id",
            sa.Integer(),
            sa.ForeignKey("catalogs.id", name="fk_builds_catalog_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("model_fingerprint", sa.String(length=255), nullable=True),
        sa.Column("index_factory", sa.String(length=255), nullable=True),
        sa.Column("index_path", sa.Text(), nullable=True),
        sa.Column("rows_read", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("rows_inserted", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("rows_skipped", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("rows_rejected", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("entries_total", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("vectors_total", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("stats", sa.JSON(), nullable=True),
    )
    op.create_index("ix_builds_catalog_id", "builds", ["catalog_id"])


def downgrade() -> None:
    op.drop_index("ix_builds_catalog_id", table_name="builds")
    op.drop_table("builds")
    op.drop_index("ix_entries_catalog_id", table_name="entries")
    op.drop_table("entries")
    op.drop_table("catalogs")
