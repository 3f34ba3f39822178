"""jobs: resumable store-normalization jobs and their checkpoints

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("input_path", sa.Text(), nullable=False),
        sa.Column("input_fingerprint", sa.String(length=128), nullable=False),
        sa.Column("input_format", sa.String(length=16), nullable=False),
        sa.Column("output_path", sa.Text(), nullable=False),
        sa.Column("output_format", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("index_dir", sa.Text(), nullable=True),
        sa.Column("build_id", sa.Integer(), nullable=True),
        sa.Column("index_file", sa.Text(), nullable=True),
        sa.Column("model_fingerprint", sa.String(length=255), nullable=True),
        sa.Column("cross_model_fingerprint", sa.String(length=255), nullable=True),
        sa.Column("engine", sa.String(length=16), nullable=True),
        sa.Column("rows_total", sa.Integer(), nullable=True),
        sa.Column("rows_done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("parts_done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("matched", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("ambiguous", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("unmatched", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("rejected", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("runs", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_jobs_output_path", "jobs", ["output_path"])
    op.create_table(
        "job_checkpoints",
        sa.Column(
            "job_id",
            sa.Integer(),
            sa.ForeignKey("jobs.id", name="fk_job_checkpoints_job_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("rows_end", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("part_file", sa.Text(), nullable=False),
        sa.Column("part_bytes", sa.BigInteger(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_checkpoints")
    op.drop_index("ix_jobs_output_path", table_name="jobs")
    op.drop_table("jobs")
