"""Alembic migrations: upgrade/downgrade/idempotence on SQLite and (when reachable) PostgreSQL."""
from __future__ import annotations


import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from mgeo_index import store

TABLES = {"catalogs", "entries", "builds", "jobs", "job_checkpoints", "generations", "entry_elements"}
# The newest revision; every revision chains onto it (one head).
HEAD = ScriptDirectory.from_config(store.alembic_config("sqlite://")).get_current_head()


@pytest.fixture()
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mgeo.db'}"


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _schema_drift(url: str) -> list:
    """Differences between the migrated database and the ORM models (should be none)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), store.Base.metadata)
    finally:
        engine.dispose()


def test_single_linear_head() -> None:
    script = ScriptDirectory.from_config(store.alembic_config("sqlite://"))
    assert script.get_heads() == [HEAD]
    assert [r.revision for r in script.walk_revisions()][-4:] == ["0004_elements", "0003_generations", "0002", "0001"]
    assert (store.migrations_dir() / "env.py").is_file()
    assert store.schema_head() == HEAD  # what connect() compares with, read without Alembic


def test_opening_a_store_at_the_newest_schema_loads_no_alembic(tmp_path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'mgeo.db'}"
    store.connect(url).dispose()
    code = f"import sys; from mgeo_index import store; store.connect({url!r}).dispose(); print('alembic' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_alembic_config_escapes_percent() -> None:
    url = "postgresql://u:p%40ss@host/db"
    assert store.alembic_config(url).get_main_option("sqlalchemy.url") == url


def _lifecycle(url: str) -> None:
    assert store.current_revision(url) is None
    assert not TABLES & _tables(url)

    store.upgrade(url)
    assert TABLES <= _tables(url)
    assert store.current_revision(url) == HEAD
    assert _schema_drift(url) == []

    store.upgrade(url)  # idempotent: nothing pending, nothing changes
    assert store.current_revision(url) == HEAD
    assert TABLES <= _tables(url)

    store.downgrade(url, "base")
    assert not TABLES & _tables(url)
    assert store.current_revision(url) is None

    store.upgrade(url, "head")  # and back again
    assert TABLES <= _tables(url)


def test_sqlite_upgrade_downgrade(sqlite_url: str) -> None:
    _lifecycle(sqlite_url)


def test_sqlite_unique_and_index(sqlite_url: str) -> None:
    store.upgrade(sqlite_url)
    engine = create_engine(sqlite_url)
    try:
        insp = inspect(engine)
        # a key is unique among live entries (migration 0003: retired entries keep their rows)
        live_key = [i for i in insp.get_indexes("entries") if i["name"] == "uq_entries_catalog_live_key"]
        assert live_key and live_key[0]["unique"] and live_key[0]["column_names"] == ["catalog_id", "key"]
        assert ["catalog_id"] in [i["column_names"] for i in insp.get_indexes("entries")]
        fks = insp.get_foreign_keys("entries")
        assert fks[0]["referred_table"] == "catalogs"
        with engine.connect() as conn:
            ddl = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'entries'").scalar_one()
        assert "AUTOINCREMENT" in ddl  # FAISS ids must never be reused
    finally:
        engine.dispose()


def test_connect_migrates_new_sqlite_file(tmp_path) -> None:
    db = tmp_path / "nested" / "dir" / "mgeo.db"
    url = f"sqlite:///{db}"
    engine = store.connect(url)
    try:
        assert db.exists()
        assert store.current_revision(url) == HEAD
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one().lower() == "wal"
    finally:
        engine.dispose()
    # Connecting again to an up-to-date database is a no-op.
    store.connect(url).dispose()
    assert store.current_revision(url) == HEAD


def test_offline_sql_generation(capsys) -> None:
    from alembic import command

    command.upgrade(store.alembic_config("postgresql://nobody@nowhere/none"), "head", sql=True)
    sql = capsys.readouterr().out
    assert "CREATE TABLE catalogs" in sql and "CREATE TABLE entries" in sql and "CREATE TABLE builds" in sql
    assert "ALTER TABLE entries ALTER COLUMN id TYPE BIGINT" in sql and "ALTER SEQUENCE entries_id_seq AS bigint" in sql


def test_postgresql_upgrade_downgrade(pg_url: str) -> None:
    _lifecycle(pg_url)


def test_postgresql_connect(pg_url: str) -> None:
    engine = store.connect(pg_url)
    try:
        assert store.current_revision(pg_url) == HEAD
        assert TABLES <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _upgrade_keeps_entries(url: str) -> None:
    store.upgrade(url, "0002")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO catalogs (id, name, created_at) VALUES (1, 'c', CURRENT_TIMESTAMP)")
            for i, key in ((5, "a"), (9, "b")):
                conn.exec_driver_sql(
                    "INSERT INTO entries (id, catalog_id, key, address, normalized, created_at) "
                    f"VALUES ({i}, 1, '{key}', '北京{key}', '北京{key}', CURRENT_TIMESTAMP)"
                )
    finally:
        engine.dispose()
    store.upgrade(url)  # 0003_generations rebuilds the entries table on SQLite
    assert _schema_drift(url) == []
    engine = store.connect(url)
    try:
        assert store.entry_ids(engine, 1).tolist() == [5, 9]
        assert store.current_generation(engine, 1) is None
        assert store.upsert_entries(engine, 1, [{"key": "a", "address": "上海", "normalized": "上海"}]) == (0, 1, 0)
        live = store.entry_ids(engine, 1).tolist()
        assert len(live) == 2 and 9 in live and 5 not in live  # "a" has a new entry; its old row is retired
    finally:
        engine.dispose()
    store.downgrade(url, "0002")  # retired rows are dropped, the old unique constraint comes back
    assert store.current_revision(url) == "0002"


def test_sqlite_0003_keeps_entries_and_autoincrement(sqlite_url: str) -> None:
    _upgrade_keeps_entries(sqlite_url)
    engine = create_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            assert "AUTOINCREMENT" in conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'entries'").scalar_one()
    finally:
        engine.dispose()


def test_postgresql_0003_keeps_entries(pg_url: str) -> None:
    _upgrade_keeps_entries(pg_url)


def test_postgresql_entry_ids_are_64_bit(pg_url: str) -> None:
    """Migration 0006: an entry id past 2^31 (a national catalog's) is stored and referenced."""
    from sqlalchemy import text

    engine = store.connect(pg_url)
    try:
        cid = store.get_or_create_catalog(engine, "national", source="x.csv", address_column="address", id_column=None)
        big = 2**31 + 5
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO entries (id, catalog_id, key, address, normalized, line, created_at) "
                              "VALUES (:id, :cid, 'k', '北京市朝阳区建国路88号', '北京市朝阳区建国路88号', 2, now())"),
                         {"id": big, "cid": cid})
            types = dict(conn.execute(text(
                "SELECT table_name || '.' || column_name, data_type FROM information_schema.columns "
                "WHERE (table_name, column_name) IN (('entries', 'id'), ('entry_elements', 'entry_id'), ('labels', 'entry_id'))")).all())
            sequence = conn.execute(text("SELECT data_type FROM information_schema.sequences "
                                         "WHERE sequence_name = 'entries_id_seq'")).scalar()
        assert types == {"entries.id": "bigint", "entry_elements.entry_id": "bigint", "labels.entry_id": "bigint"}
        assert sequence == "bigint"
        assert store.get_entries(engine, [big])[big]["address"] == "北京市朝阳区建国路88号"
        store.add_labels(engine, [{"query": "q", "query_normalized": "q", "entry_id": big, "entry_address": "a",
                                   "label": "exact_match"}], reviewer="ana")
        assert store.confirmations(engine, ["q"])["q"]["confirmed"] == [big]
    finally:
        engine.dispose()


def _job_row(url: str, column: str) -> tuple:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return tuple(conn.exec_driver_sql(f"SELECT output_path, {column} FROM jobs").one())
    finally:
        engine.dispose()


@pytest.mark.parametrize("which", ["sqlite", "postgresql"])
def test_0014_renames_the_jobs_engine_column_to_runner_keeping_values(which: str, request) -> None:
    url = request.getfixturevalue("sqlite_url" if which == "sqlite" else "pg_url")
    store.upgrade(url, "0013_review_item_name")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO jobs (kind, status, input_path, input_fingerprint, input_format, output_path, "
                "output_format, engine, started_at, updated_at) VALUES ('normalize', 'complete', 'a.csv', 'sha256:x', 'csv', "
                "'/o.csv', 'csv', 'ray', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
    finally:
        engine.dispose()
    store.upgrade(url)
    assert _job_row(url, "runner") == ("/o.csv", "ray")
    assert _schema_drift(url) == []
    store.downgrade(url, "0013_review_item_name")
    assert _job_row(url, "engine") == ("/o.csv", "ray")
    store.upgrade(url)
