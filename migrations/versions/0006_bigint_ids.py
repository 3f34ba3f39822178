"""64-bit entry ids: entries.id and the columns that refer to it become BIGINT

An entry's id is its FAISS vector id (int64 there); national catalogs pass 2^31 rows. SQLite's INTEGER
PRIMARY KEY is 64-bit already (and must stay INTEGER to remain the AUTOINCREMENT rowid), so this
revision changes PostgreSQL (and other servers) only, the id sequence included.

Revision ID: 0006_bigint_ids
Revises: 0005_reviews
Create Date: 2026-12-01 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0006_bigint_ids"
down_revision: Union[str, Sequence[str], None] = "0005_reviews"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = (("entries", "id"), ("entry_elements", "entry_id"), ("labels", "entry_id"))


def _retype(new: sa.types.TypeEngine, old: sa.types.TypeEngine, sequence_type: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=new, existing_type=old)
    if bind.dialect.name == "postgresql":
        if op.get_context().as_sql:  # offline SQL: the serial's default name
            sequence = "entries_id_seq"
        else:
            sequence = bind.execute(sa.text("SELECT pg_get_serial_sequence('entries', 'id')")).scalar()
        if sequence:
            op.execute(f"ALTER SEQUENCE {sequence} AS {sequence_type}")


def upgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer(), "bigint")


def downgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger(), "integer")
