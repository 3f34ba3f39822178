"""review_items.name: the place name of a queue item's row, for jobs kept as name + address

NULL (every item added before, and every item of a job or file without a name column): the item is its address
alone. Otherwise the row's name (``normalize --name-column``): the item is resolved with it, as the job resolved
it, the page shows it, and the item's ``query_normalized`` (what a decision labels and what confirmations are
keyed by) is the address with the name after it. One nullable column: nothing existing changes.

Revision ID: 0013_review_item_name
Revises: 0012_generation_plan
Create Date: 2026-12-07 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0013_review_item_name"
down_revision: Union[str, Sequence[str], None] = "0012_generation_plan"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("review_items") as batch:
        batch.add_column(sa.Column("name", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("review_items") as batch:
        batch.drop_column("name")
