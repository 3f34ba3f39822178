"""Side by side: this checkout against an earlier release, on the same machine in one run.

    git worktree add /tmp/release 15d7988
    python scripts/bench_throughput.py --release /tmp/release --data ../shared/data

Each code version builds its own index of the same catalog (the first ``--catalog-rows`` CCKS catalog
strings; 0: all 39,627) and measures two views, printed with the CPU kind:

- **as a user runs it** (whole process: start-up, imports and model loading included, the machine's threads):
  ``mgeo-index normalize`` of ``--rows`` CCKS queries, all distinct, and of the same number of rows where each
  of ``rows / 5`` addresses appears 5 times (order files repeat a store's address); ``mgeo-index match`` of
  ``--pairs`` CCKS pairs; a one-shot ``mgeo-index resolve`` of one address;
- **the engine alone**: the same normalize jobs with the resolver opened before the clock starts (rows/s, split
  into the two networks' forward passes and the rest), and single-query ``resolve`` latency (p50 / p99 over
  ``--queries`` calls in one warm process).

Each job's time per row is split into the two networks' batched forward passes (the engine's ``_run``, timed
from outside) and the rest; ``bounds`` gives the normalize ratios this checkout would reach if its networks took
no time at all (the release's time per row over this checkout's time outside the networks): what arithmetic
savings alone can and cannot buy.

Rounds alternate between the versions; the best of ``--rounds`` is kept per measure. Both versions run
with this virtual environment's packages; each child runs only its own code (see ``CHECK``).
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
sys.path.insert(0, str(HERE))
from mgeo_index.settings import cpu_kind  # noqa: E402

NORMALIZE = r"""
import json, sys, time
try:
    from mgeo_index.normalize import normalize_file
except ImportError:  # releases before the normalize package
    from mgeo_index.jobs import normalize_file
from mgeo_index.query.resolver import open_resolver
try:
    from mgeo_index.runtime import inference as engine
except ImportError:
    try:  # releases before the runtime package
        from mgeo_index import inference as engine
    except ImportError:  # releases before inference.py
        from mgeo_index import engine
index_dir, rows, out = sys.argv[1:4]
resolver = open_resolver(index_dir, device="cpu")  # loaded before the clock starts, as a server would have it
resolver.resolve(["北京朝阳建国路88号"])
network = {"bi": 0.0, "cross": 0.0}  # seconds in the networks' batched forward passes (tokenizing included)
forward = engine._run


def timed(module, tokenizer, first, second, **options):
    started = time.perf_counter()
    try:
        return forward(module, tokenizer, first, second, **options)
    finally:
        network["bi" if second is None else "cross"] += time.perf_counter() - started


engine._run = timed
started = time.perf_counter()
result = normalize_file(rows, out, index_dir, device="cpu", resolver=resolver, restart=True)
print(json.dumps({"rows": result.rows, "seconds": time.perf_counter() - started, "network": network}))
"""

LATENCY = r"""
import json, sys, time
import numpy as np
from mgeo_index.query.resolver import open_resolver
queries = json.loads(sys.argv[2])
profile = {"profile": sys.argv[3]} if len(sys.argv) > 3 else {}  # releases before profiles take none
resolver = open_resolver(sys.argv[1], device="cpu", **profile)
for q in queries[:10]:
    resolver.resolve([q])
times = []
for q in queries:
    t = time.perf_counter(); resolver.resolve([q]); times.append(time.perf_counter() - t)
print(json.dumps({"p50_ms": 1000 * float(np.percentile(times, 50)), "p99_ms": 1000 * float(np.percentile(times, 99))}))
"""


# Every child runs the code it is given, and only that code. ``python -c`` puts its working directory first on
# sys.path (so a child started from this checkout imported this checkout's mgeo_index whatever PYTHONPATH said),
# and this checkout's editable install answers for any module the other code lacks (a release's
# ``import mgeo_index.normalize`` found this checkout's): the child runs in the code's directory, without the
# editable install's finder, and checks where mgeo_index came from (without that, a "release" figure is this
# checkout measured twice).
CHECK = """
import os, sys
sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", type(f).__name__) != "_EditableFinder"]
import mgeo_index
if not os.path.realpath(mgeo_index.__file__).startswith(os.path.realpath(os.environ["PYTHONPATH"]) + os.sep):
    sys.exit(f"imported {mgeo_index.__file__}, not the code under {os.environ['PYTHONPATH']}")
"""


def child(code: Path, snippet: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c snippet args`` on the mgeo_index of ``code``: PYTHONPATH and the working directory both ``code``."""
    run = subprocess.run([sys.executable, "-c", CHECK + snippet, *args], cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
                         capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"a child on {code} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return run


def cli(code: Path, *args: str) -> subprocess.CompletedProcess:
    return child(code, "from mgeo_index.cli import app; sys.argv[0] = 'mgeo-index'; app()", *args)


def whole_process(code: Path, *args: str) -> float:
    """Wall seconds of one ``mgeo-index`` command in a child process, as a user runs it."""
    started = time.perf_counter()
    cli(code, *args)
    return time.perf_counter() - started


def write_rows(path: Path, addresses: list[str]) -> None:
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "address"])
        writer.writerows((i, a) for i, a in enumerate(addresses))


def normalize_run(code: Path, index_dir: Path, rows: Path, out: Path) -> dict:
    """One normalize job with the resolver already open (model loading left out): its rows, seconds, and seconds
    in each network's forward passes."""
    run = child(code, NORMALIZE, str(index_dir), str(rows), str(out))
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True, help="a checkout of the release to compare with")
    parser.add_argument("--data", type=Path, default=HERE.parent / "shared" / "data")
    parser.add_argument("--catalog-rows", type=int, default=3000, help="0: the whole CCKS catalog")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=5000, help="CCKS pairs for the match figure")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(0)
    with gzip.open(args.data / "catalog" / "ccks2021_poi_candidates.tsv.gz", "rt", encoding="utf-8") as fh:
        catalog = [row["text"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
    catalog = catalog[: args.catalog_rows] if args.catalog_rows else catalog
    with gzip.open(args.data / "pairs" / "ccks2021_train.tsv.gz", "rt", encoding="utf-8") as fh:
        pair_rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    queries = list(dict.fromkeys(row["query"] for row in pair_rows))
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
        with (tmp / "pairs.tsv").open("w", encoding="utf-8", newline="") as fh:
            csv.writer(fh, delimiter="\t").writerows([("a", "b")] + [(r["query"], r["candidate"]) for r in pair_rows[: args.pairs]])
        for name, code in versions.items():
            started = time.perf_counter()
            cli(code, "build", str(catalog_file), "--index-dir", str(tmp / name), "--id-column", "id")
            report[name]["build_s"] = time.perf_counter() - started
        user: dict[str, dict[str, float]] = {name: {} for name in versions}
        for round_ in range(args.rounds):
            for name, code in versions.items():
                runs = {f"normalize {kind} {args.rows} rows": ("normalize", str(tmp / f"{kind}.csv"), "--index-dir",
                                                               str(tmp / name), "--out", str(tmp / f"{name}-{kind}-{round_}.csv"))
                        for kind in ("distinct", "repeated")}
                runs[f"match {args.pairs} pairs"] = ("match", "--file", str(tmp / "pairs.tsv"), "--out",
                                                     str(tmp / f"{name}-match-{round_}.tsv"))
                runs["resolve one address"] = ("resolve", queries[-1], "--index-dir", str(tmp / name))
                for what, command in runs.items():
                    user[name][what] = min(whole_process(code, *command), user[name].get(what, float("inf")))
                for kind in ("distinct", "repeated"):
                    job = normalize_run(code, tmp / name, tmp / f"{kind}.csv", tmp / f"{name}-{kind}-out.csv")
                    rate = job["rows"] / job["seconds"]
                    if rate > report[name].get(f"normalize_{kind}_rows_per_s", 0):  # the best run, with its split
                        report[name][f"normalize_{kind}_rows_per_s"] = rate
                        report[name][f"normalize_{kind}_ms_per_row"] = {
                            "all": 1000 * job["seconds"] / job["rows"],
                            **{f"{net} network": 1000 * s / job["rows"] for net, s in job["network"].items()},
                            "the rest": 1000 * (job["seconds"] - sum(job["network"].values())) / job["rows"],
                        }
                run = child(code, LATENCY, str(tmp / name), json.dumps(queries[-args.queries:], ensure_ascii=False))
                latency = json.loads(run.stdout.strip().splitlines()[-1])
                for key, value in latency.items():
                    report[name][key] = min(value, report[name].get(key, float("inf")))
    ratios = {
        "normalize_distinct": report["this"]["normalize_distinct_rows_per_s"] / report["release"]["normalize_distinct_rows_per_s"],
        "normalize_repeated": report["this"]["normalize_repeated_rows_per_s"] / report["release"]["normalize_repeated_rows_per_s"],
        "resolve_p50": report["this"]["p50_ms"] / report["release"]["p50_ms"],
    }
    # What the normalize ratios could be if this version's networks took no time at all: the release's time per
    # row over this version's time outside the networks (parsing, features, sparse search, store, the job's I/O).
    bounds = {
        f"normalize_{kind}_if_networks_were_free": report["release"][f"normalize_{kind}_ms_per_row"]["all"]
        / report["this"][f"normalize_{kind}_ms_per_row"]["the rest"]
        for kind in ("distinct", "repeated")
    }
    as_user = {what: {"release_s": round(user["release"][what], 2), "this_s": round(user["this"][what], 2),
                      "speed-up": round(user["release"][what] / user["this"][what], 2)} for what in user["this"]}
    print(json.dumps({"cpu": cpu_kind(), "cores": os.cpu_count(), "catalog_rows": len(catalog),
                      "versions": {k: str(v) for k, v in versions.items()}, "as_a_user_runs_it": as_user,
                      "engine": {"report": report, "ratios": ratios, "bounds": bounds}}, indent=2, ensure_ascii=False))
    print(f"\nas a user runs it, CPU {cpu_kind()}, {os.cpu_count()} cores, catalog {len(catalog):,} entries, "
          f"best of {args.rounds}:")
    for what, row in as_user.items():
        print(f"  {what:32} release {row['release_s']:7.2f} s   this {row['this_s']:7.2f} s   {row['speed-up']:5.2f}x")


if __name__ == "__main__":
    main()
