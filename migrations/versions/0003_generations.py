"""generations: immutable index generations, a current-generation pointer per catalog, retired entries

Every change to a catalog (build, add, update, remove, repair) writes a new set of index files
beside the current ones and records them as a row of ``generations``; ``catalogs.current_generation_id``
is the pointer readers follow, moved in one transaction.  Entries are never deleted while a kept
generation may still return them: a removed or replaced entry gets ``retired_at`` and keeps its row
(and id) until ``mgeo-index gc`` collects the generations that reference it.  A catalog key must be
unique among live entries only, so the unique constraint becomes a partial unique index.

Revision ID: 0003_generations
Revises: 0002
Create Date: 2026-11-29 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003_generations"
down_revision: Union[str, Sequence[str], None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

LIVE = sa.text("retired_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "generations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "catalog_id",
            sa.Integer(),
            sa.ForeignKey("catalogs.id", name="fk_generations_catalog_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("build_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("index_file", sa.Text(), nullable=False),
        sa.Column("sparse_file", sa.Text(), nullable=True),
        sa.Column("index_factory", sa.String(length=255), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("ntotal", sa.Integer(), nullable=False),
        sa.Column("ids_sha256", sa.String(length=64), nullable=False),
        sa.Column("checksums", sa.JSON(), nullable=False),
        sa.Column("model_fingerprint", sa.String(length=255), nullable=False),
        sa.Column("model_path", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_generations_catalog_id", "generations", ["catalog_id"])
    with op.batch_alter_table("catalogs") as batch:
        batch.add_column(sa.Column("current_generation_id", sa.Integer(), nullable=True))
    # SQLite rebuilds the table here: keep AUTOINCREMENT (entry ids are FAISS ids, never reused).
    with op.batch_alter_table("entries", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("retired_at", sa.DateTime(), nullable=True))
        batch.drop_constraint("uq_entries_catalog_key", type_="unique")
    op.create_index(
        "uq_entries_catalog_live_key", "entries", ["catalog_id", "key"], unique=True,
        sqlite_where=LIVE, postgresql_where=LIVE,
    )


def downgrade() -> None:
    op.execute("DELETE FROM entries WHERE retired_at IS NOT NULL")
    op.drop_index("uq_entries_catalog_live_key", table_name="entries")
    with op.batch_alter_table("entries", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.create_unique_constraint("uq_entries_catalog_key", ["catalog_id", "key"])
        batch.drop_column("retired_at")
    with op.batch_alter_table("catalogs") as batch:
        batch.drop_column("current_generation_id")
    op.drop_index("ix_generations_catalog_id", table_name="generations")
    op.drop_table("generations")
