"""review_items, labels, model_versions: the human review loop

``review_items`` is a review queue persisted in the store (shared by every reviewer, surviving a
restart): one row per query to review with the candidates shown and how uncertain the model was.
``labels`` holds the decisions as labelled pairs (query, catalog entry, label), one row per pair,
never deleted (an undo sets ``undone_at``). ``model_versions`` records the cross-encoders ``adapt``
wrote beside the shipped one and which of them the index uses.

Revision ID: 0005_reviews
Revises: 0004_elements
Create Date: 2026-12-01 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005_reviews"
down_revision: Union[str, Sequence[str], None] = "0004_elements"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "review_items",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("row", sa.Integer(), nullable=False),
        sa.Column("query", sa.Text(), nullable=False),
        sa.Column("query_normalized", sa.Text(), nullable=False),
        sa.Column("candidates", sa.JSON(), nullable=False),
        sa.Column("model_version", sa.String(length=255), nullable=False),
        sa.Column("margin", sa.Float(), nullable=False),
        sa.Column("disagreement", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False, server_default="pending"),
        sa.Column("version", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("decided_by", sa.String(length=255), nullable=True),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("queue", "row", name="uq_review_items_queue_row"),
    )
    op.create_index("ix_review_items_queue_status", "review_items", ["queue", "status", "margin"])
    op.create_table(
        "labels",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "item_id",
            sa.Integer(),
            sa.ForeignKey("review_items.id", name="fk_labels_item_id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("query", sa.Text(), nullable=False),
        sa.Column("query_normalized", sa.Text(), nullable=False),
        sa.Column(
            "entry_id",
            sa.Integer(),
            sa.ForeignKey("entries.id", name="fk_labels_entry_id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("entry_address", sa.Text(), nullable=False),
        sa.Column("label", sa.String(length=16), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("probability", sa.Float(), nullable=True),
        sa.Column("model_version", sa.String(length=255), nullable=True),
        sa.Column("reviewer", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("undone_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_labels_query_normalized", "labels", ["query_normalized"])
    op.create_index("ix_labels_item_id", "labels", ["item_id"])
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=255), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("labels_used", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("model_versions")
    op.drop_index("ix_labels_item_id", table_name="labels")
    op.drop_index("ix_labels_query_normalized", table_name="labels")
    op.drop_table("labels")
    op.drop_index("ix_review_items_queue_status", table_name="review_items")
    op.drop_table("review_items")
