"""The two profiles' cost side by side, in one run on one machine: match, normalize and resolve, peak memory.

    python scripts/bench_profiles.py --index-dir ccks-index --data ../shared/data --pairs 3000 --rows 1000

Every figure is a whole ``mgeo-index`` process as a user runs it (start-up and model loading included), the
profiles alternating round by round, best of ``--rounds``:

- ``match`` of the first ``--pairs`` CCKS pairs: seconds, pairs/s, peak resident memory;
- ``normalize`` of ``--rows`` distinct CCKS queries over the index: seconds, rows/s, peak memory;
- ``resolve`` of ``--queries`` queries one at a time in one warm process: p50 / p99 ms (a child process that
  opens the index once, then resolves query by query, as a server would).

The CPU kind is printed with the figures.
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
from mgeo_index.settings import PROFILES, cpu_kind  # noqa: E402
from bench_throughput import LATENCY  # noqa: E402  (the warm one-query-a-call resolve, one snippet for both)


def timed(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak resident MB, stdout) of one child process."""
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    out, err = child.stdout.read(), child.stderr.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index-dir", type=Path, required=True, help="an index of the CCKS catalog")
    parser.add_argument("--data", type=Path, default=HERE.parent / "shared" / "data")
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with gzip.open(args.data / "pairs" / "ccks2021_train.tsv.gz", "rt", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    queries = list(dict.fromkeys(row["query"] for row in rows))
    random.Random(0).shuffle(queries)
    cli = [str(Path(sys.executable).parent / "mgeo-index")]
    report: dict[str, dict] = {profile: {} for profile in PROFILES}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with (tmp / "pairs.tsv").open("w", encoding="utf-8", newline="") as fh:
            csv.writer(fh, delimiter="\t").writerows([("a", "b")] + [(r["query"], r["candidate"]) for r in rows[: args.pairs]])
        with (tmp / "rows.csv").open("w", encoding="utf-8", newline="") as fh:
            csv.writer(fh).writerows([("id", "address")] + list(enumerate(queries[: args.rows])))
        for round_ in range(args.rounds):
            for profile in PROFILES:
                figures = report[profile]
                seconds, peak, _ = timed(cli + ["match", "--file", str(tmp / "pairs.tsv"), "--out",
                                                str(tmp / f"{profile}-{round_}.tsv"), "--profile", profile])
                if seconds < figures.get("match_s", float("inf")):
                    figures.update(match_s=seconds, match_pairs_per_s=args.pairs / seconds, match_peak_mb=peak)
                seconds, peak, _ = timed(cli + ["normalize", str(tmp / "rows.csv"), "--index-dir", str(args.index_dir),
                                                "--out", str(tmp / f"{profile}-{round_}.csv"), "--profile", profile])
                if seconds < figures.get("normalize_s", float("inf")):
                    figures.update(normalize_s=seconds, normalize_rows_per_s=args.rows / seconds, normalize_peak_mb=peak)
                _, _, out = timed([sys.executable, "-c", LATENCY, str(args.index_dir),
                                   json.dumps(queries[-args.queries:], ensure_ascii=False), profile])
                for key, value in json.loads(out.strip().splitlines()[-1]).items():
                    figures[key] = min(value, figures.get(key, float("inf")))
    rounded = {p: {k: round(v, 1) for k, v in f.items()} for p, f in report.items()}
    print(json.dumps({"cpu": cpu_kind(), "cores": os.cpu_count(), "pairs": args.pairs, "rows": args.rows,
                      "queries": args.queries, "rounds": args.rounds, "profiles": rounded}, indent=2))


if __name__ == "__main__":
    main()
