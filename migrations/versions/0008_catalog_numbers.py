"""catalogs.numbers: the number policy a catalog was built with

NULL (every catalog built before, and every one built without ``--numbers``): the default, strict. Otherwise
``strict`` or ``loose`` (:mod:`mgeo_index.model.numbers`), which ``resolve``, ``normalize`` and ``serve`` of the
catalog's index use unless told otherwise. One nullable column: nothing existing changes.

Revision ID: 0008_catalog_numbers
Revises: 0007_vector_store
Create Date: 2026-12-05 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0008_catalog_numbers"
down_revision: Union[str, Sequence[str], None] = "0007_vector_store"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.add_column(sa.Column("numbers", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.drop_column("numbers")
