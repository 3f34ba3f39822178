"""catalogs.lon_column, catalogs.lat_column: the columns holding each entry's coordinates

NULL (every catalog built before, and every one built without ``--lon-column`` / ``--lat-column``): coordinate
columns are recognized by name (lon, lng, longitude, 经度; lat, latitude, 纬度). Otherwise the catalog columns named
at build: checked there (a value not a number in range rejects its row) and read by ``normalize --coordinates``.
Two nullable columns: nothing existing changes.

Revision ID: 0011_catalog_coordinates
Revises: 0010_catalog_name_column
Create Date: 2026-12-07 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0011_catalog_coordinates"
down_revision: Union[str, Sequence[str], None] = "0010_catalog_name_column"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.add_column(sa.Column("lon_column", sa.String(255), nullable=True))
        batch.add_column(sa.Column("lat_column", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.drop_column("lat_column")
        batch.drop_column("lon_column")
