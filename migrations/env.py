"""Alembic environment for mgeo_index.

There is no ``alembic.ini``: :func:`mgeo_index.store.alembic_config` builds the
:class:`alembic.config.Config` in code, setting ``script_location`` and
``sqlalchemy.url``.  A caller that already holds a connection (an in-memory
SQLite database, for instance) may pass it as ``config.attributes["connection"]``;
it is then used as is instead of opening a new one from the URL.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from mgeo_index.store import Base  # the package imports every table module: Base.metadata has them all

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds tables.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade --sql``) without a database."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=bool(url and url.startswith("sqlite")),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live database: the given connection, else one made from the URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return

    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("alembic config has no sqlalchemy.url and no connection attribute")
    # A private engine without the application's connect hooks: in particular SQLite
    # foreign keys stay off here, so batch table rebuilds cannot cascade-delete rows.
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
