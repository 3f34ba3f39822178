"""Side by side: this checkout against an earlier release, on the same machine in one run.

    git worktree add /tmp/release 15d7988
    OMP_NUM_THREADS=1 python scripts/bench_throughput.py --release /tmp/release --data ../shared/data

Each code version builds its own index of the same catalog (the first ``--catalog-rows`` CCKS catalog
strings) and runs, through its own CLI in a child process:

- a ``normalize`` job of ``--rows`` CCKS queries, all distinct, and of the same number of rows where each
  of ``rows / 5`` addresses appears 5 times (order files repeat a store's address): rows/s of the job,
  with the resolver opened before the clock starts;
- single-query ``resolve`` latency (p50 / p99 over ``--queries`` calls in one process, warm).

Rounds alternate between the versions; the best of ``--rounds`` is kept per measure. The code under
test is chosen with PYTHONPATH, so both run with this virtual environment's packages.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

NORMALIZE = r"""
import json, sys, time
try:
    from mgeo_index.normalize import normalize_file
except ImportError:  # releases before the normalize package
    from mgeo_index.jobs import normalize_file
from mgeo_index.resolver import open_resolver
index_dir, rows, out = sys.argv[1:4]
resolver = open_resolver(index_dir, device="cpu")  # loaded before the clock starts, as a server would have it
resolver.resolve(["北京朝阳建国路88号"])
started = time.perf_counter()
result = normalize_file(rows, out, index_dir, device="cpu", resolver=resolver, restart=True)
print(json.dumps({"rows": result.rows, "seconds": time.perf_counter() - started}))
"""

LATENCY = r"""
import json, sys, time
import numpy as np
from mgeo_index.resolver import open_resolver
queries = json.loads(sys.argv[2])
resolver = open_resolver(sys.argv[1], device="cpu")
for q in queries[:10]:
    resolver.resolve([q])
times = []
for q in queries:
    t = time.perf_counter(); resolver.resolve([q]); times.append(time.perf_counter() - t)
print(json.dumps({"p50_ms": 1000 * float(np.percentile(times, 50)), "p99_ms": 1000 * float(np.percentile(times, 99))}))
"""


def cli(code: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from mgeo_index.cli import app; sys.argv[0] = 'mgeo-index'; app()", *args]
    full_env = {**os.environ, "PYTHONPATH": str(code), **(env or {})}
    return subprocess.run(command, env=full_env, capture_output=True, text=True, check=True)


def write_rows(path: Path, addresses: list[str]) -> None:
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "address"])
        writer.writerows((i, a) for i, a in enumerate(addresses))


def normalize_rate(code: Path, index_dir: Path, rows: Path, out: Path) -> float:
    """Rows/s of one normalize job with the resolver already open (model loading left out)."""
    run = subprocess.run([sys.executable, "-c", NORMALIZE, str(index_dir), str(rows), str(out)],
                         env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True, check=True)
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    return measured["rows"] / measured["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True, help="a checkout of the release to compare with")
    parser.add_argument("--data", type=Path, default=HERE.parent / "shared" / "data")
    parser.add_argument("--catalog-rows", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(0)
    with gzip.open(args.data / "catalog" / "ccks2021_poi_candidates.tsv.gz", "rt", encoding="utf-8") as fh:
        catalog = [row["text"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)][: args.catalog_rows]
    with gzip.open(args.data / "pairs" / "ccks2021_train.tsv.gz", "rt", encoding="utf-8") as fh:
        queries = list(dict.fromkeys(row["query"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)))
    rng.shuffle(queries)
    distinct = queries[: args.rows]
    repeated = [a for a in queries[args.rows : args.rows + args.rows // 5] for _ in range(5)]
    rng.shuffle(repeated)
    versions = {"release": args.release.resolve(), "this": HERE}
    report: dict[str, dict] = {name: {} for name in versions}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        catalog_file = tmp / "catalog.csv"
        write_rows(catalog_file, catalog)
        write_rows(tmp / "distinct.csv", distinct)
        write_rows(tmp / "repeated.csv", repeated)
        for name, code in versions.items():
            started = time.perf_counter()
            cli(code, "build", str(catalog_file), "--index-dir", str(tmp / name), "--id-column", "id")
            report[name]["build_s"] = time.perf_counter() - started
        for _ in range(args.rounds):
            for name, code in versions.items():
                for kind in ("distinct", "repeated"):
                    rate = normalize_rate(code, tmp / name, tmp / f"{kind}.csv", tmp / f"{name}-{kind}-out.csv")
                    report[name][f"normalize_{kind}_rows_per_s"] = max(rate, report[name].get(f"normalize_{kind}_rows_per_s", 0))
                run = subprocess.run([sys.executable, "-c", LATENCY, str(tmp / name), json.dumps(queries[-args.queries:], ensure_ascii=False)],
                                     env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True, check=True)
                latency = json.loads(run.stdout.strip().splitlines()[-1])
                for key, value in latency.items():
                    report[name][key] = min(value, report[name].get(key, float("inf")))
    ratios = {
        "normalize_distinct": report["this"]["normalize_distinct_rows_per_s"] / report["release"]["normalize_distinct_rows_per_s"],
        "normalize_repeated": report["this"]["normalize_repeated_rows_per_s"] / report["release"]["normalize_repeated_rows_per_s"],
        "resolve_p50": report["this"]["p50_ms"] / report["release"]["p50_ms"],
    }
    print(json.dumps({"versions": {k: str(v) for k, v in versions.items()}, "report": report, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
