"""catalogs.name_column: the column that names each entry's place

NULL (every catalog built before, and every one built without ``--name-column``): the name is read off the address
text (the spans the tagger labels ``poi`` / ``subpoi``). Otherwise the catalog column whose value is each entry's
name: matched with the address, and compared field by field with a query's name (:mod:`mgeo_index.compare.names`).
One nullable column: nothing existing changes.

Revision ID: 0010_catalog_name_column
Revises: 0009_catalog_profile
Create Date: 2026-12-07 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0010_catalog_name_column"
down_revision: Union[str, Sequence[str], None] = "0009_catalog_profile"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.add_column(sa.Column("name_column", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.drop_column("name_column")
