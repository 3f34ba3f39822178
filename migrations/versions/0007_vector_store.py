"""generations.vector_store: where a generation's vectors live when not in a FAISS file

NULL (every generation written before, and every one written with the default store): ``index_file`` is
a FAISS file in the index directory. Otherwise the vector store's URL without credentials (``milvus://HOST:PORT``,
``milvus-lite:///PATH.db``), and ``index_file`` names the generation's collection there
(see :mod:`mgeo_index.index.vector_store`). One nullable column: nothing existing changes.

Revision ID: 0007_vector_store
Revises: 0006_bigint_ids
Create Date: 2026-12-01 00:00:00
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007_vector_store"
down_revision: Union[str, Sequence[str], None] = "0006_bigint_ids"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.add_column(sa.Column("vector_store", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("vector_store")
