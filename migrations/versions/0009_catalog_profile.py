"""catalogs.profile: the profile a catalog was built for

NULL (every catalog built before, and every one built without ``--profile``): chosen at query time (the
``--profile`` option, ``MGEO_INDEX_PROFILE``, accurate on a CUDA device, else default). Otherwise ``default`` or
``accurate`` (:data:`mgeo_index.settings.PROFILES`): which bundled cross-encoder ``resolve``, ``normalize`` and
``serve`` of the catalog's index rerank with unless told otherwise. One nullable column: nothing existing changes.

Revision ID: 0009_catalog_profile
Revises: 0008_catalog_numbers
Create Date: 2026-12-06 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0009_catalog_profile"
down_revision: Union[str, Sequence[str], None] = "0008_catalog_numbers"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.add_column(sa.Column("profile", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("catalogs") as batch:
        batch.drop_column("profile")
