"""entry_elements: parsed address elements and admin codes per catalog entry

One row per entry, written by ``build`` after the entries are stored. A table of its own (nothing
else refers to it), so it chains onto 0003_generations without touching what that revision made.

Revision ID: 0004_elements
Revises: 0003_generations
Create Date: 2026-11-29 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004_elements"
down_revision: Union[str, Sequence[str], None] = "0003_generations"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "entry_elements",
        sa.Column(
            "entry_id",
            sa.Integer(),
            sa.ForeignKey("entries.id", name="fk_entry_elements_entry_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("elements", sa.JSON(), nullable=False),
        sa.Column("admin", sa.JSON(), nullable=False),
        sa.Column("province_code", sa.String(length=12), nullable=True),
        sa.Column("city_code", sa.String(length=12), nullable=True),
        sa.Column("district_code", sa.String(length=12), nullable=True),
        sa.Column("town_code", sa.String(length=12), nullable=True),
        sa.Column("parser", sa.String(length=64), nullable=False),
    )
    op.create_index("ix_entry_elements_city_code", "entry_elements", ["city_code"])
    op.create_index("ix_entry_elements_district_code", "entry_elements", ["district_code"])


def downgrade() -> None:
    op.drop_index("ix_entry_elements_district_code", table_name="entry_elements")
    op.drop_index("ix_entry_elements_city_code", table_name="entry_elements")
    op.drop_table("entry_elements")
