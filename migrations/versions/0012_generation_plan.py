"""generations.plan: how the generation's vectors were computed

NULL (every generation written before): not recorded. Otherwise the plan's name (:mod:`mgeo_index.runtime.plan`:
executor, numerics, attention, e.g. ``torch/int8-rows/blocked``), as FAISS records a factory string: ``index.json``
mirrors it and ``mgeo-index check`` shows it. One nullable column: nothing existing changes.

Revision ID: 0012_generation_plan
Revises: 0011_catalog_coordinates
Create Date: 2026-12-07 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0012_generation_plan"
down_revision: Union[str, Sequence[str], None] = "0011_catalog_coordinates"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.add_column(sa.Column("plan", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("plan")
