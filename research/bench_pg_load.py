"""PostgreSQL bulk loading, side by side in one run: the batched INSERT … ON CONFLICT DO NOTHING against
COPY into a temporary table + one INSERT … SELECT (mgeo_index.store.catalogs, used from COPY_MIN_ROWS
rows a chunk). Each method loads the same synthetic entries into its own fresh database, in chunks of
the size `build` stores (5,000).

    python research/bench_pg_load.py --rows 100000 [--admin-url postgresql+psycopg2://postgres@127.0.0.1:5432/postgres]
"""
import argparse
import json
import time
import uuid

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from mgeo_index import store
from mgeo_index.store import catalogs

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rows", type=int, default=100_000)
parser.add_argument("--chunk", type=int, default=5000)
parser.add_argument("--admin-url", default="postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
args = parser.parse_args()

rows = [{"key": f"k{i}", "source_id": f"P{i:08d}", "address": f"广东省深圳市南山区中山路{i % 997}号东方科技园{i % 31}栋",
         "normalized": f"广东省深圳市南山区中山路{i % 997}号东方科技园{i % 31}栋", "extra": {"city": "深圳市"}, "line": i + 2}
        for i in range(args.rows)]
admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
results = {}
for method, threshold in (("insert", 10**12), ("copy", catalogs.COPY_MIN_ROWS)):
    name = f"mgeo_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        engine = store.connect(make_url(args.admin_url).set(database=name).render_as_string(hide_password=False))
        cid = store.get_or_create_catalog(engine, "bench", source="bench", address_column="address", id_column="id")
        catalogs.COPY_MIN_ROWS = threshold
        started = time.perf_counter()
        for i in range(0, len(rows), args.chunk):
            store.insert_entries(engine, cid, rows[i : i + args.chunk])
        seconds = time.perf_counter() - started
        assert store.count_entries(engine, cid) == args.rows
        results[method] = {"seconds": round(seconds, 2), "rows_per_s": round(args.rows / seconds)}
        engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
results["copy_speedup"] = round(results["insert"]["seconds"] / results["copy"]["seconds"], 2)
print(json.dumps({"rows": args.rows, "chunk": args.chunk, **results}))
