"""jobs.runner: the column naming where a job's rows were resolved (local or ray), called engine before

"engine" named the database engine everywhere else in the code; the column is renamed, its values kept.

Revision ID: 0014_jobs_runner
Revises: 0013_review_item_name
Create Date: 2026-12-07 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

from alembic import op

revision: str = "0014_jobs_runner"
down_revision: Union[str, Sequence[str], None] = "0013_review_item_name"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("engine", new_column_name="runner")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("runner", new_column_name="engine")
