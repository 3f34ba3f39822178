"""What a distinct ``normalize`` row costs in CPU, and how much of it a second core can take: the resolver open, the same
distinct CCKS queries resolved as a job resolves them (one call, their parses given), best of ``--rounds``, in four
ways side by side:

- ``two threads``: one process, torch's default threads (both cores: the network's products split over them);
- ``one thread``: one process, one torch thread (a row's CPU time: the Python around the network plus the network);
- ``two processes``: two such one-thread processes at once, each on half the queries (``normalize --workers 2``): the
  rows a second per process and together;
- ``two threads of one process``: two Python threads, each resolving half the queries at once with one torch thread
  (whether the network of one overlaps the Python of the other under the interpreter's lock).

Every way must give the answers of the first (checked). The rows-per-second of each way, as JSON.

    python research/bench_row_cpu.py --index-dir ccks-index --data ../shared/data --queries 1024
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
import threading
import time
from pathlib import Path


def queries(data: Path, count: int, seed: int) -> list[str]:
    with gzip.open(data / "pairs" / "ccks2021_train.tsv.gz", "rt", encoding="utf-8") as fh:
        texts = list(dict.fromkeys(row["query"] for row in csv.DictReader(fh, delimiter="\t")))
    random.Random(seed).shuffle(texts)
    return texts[:count]


def timed(resolver, texts: list[str], rounds: int) -> tuple[float, list]:
    """(best seconds, answers) of resolving ``texts`` in one call, their parses made first."""
    from mgeo_index.text.parser import parse

    best, answers = float("inf"), None
    for _ in range(rounds):
        parses = parse(texts)
        start = time.perf_counter()
        answers = resolver.resolve(texts, parses=parses)
        best = min(best, time.perf_counter() - start)
    return best, answers


def child(args) -> None:
    """One process's share: print its best seconds and its answers' ranked ids."""
    import torch

    from mgeo_index.query.resolver import open_resolver

    torch.set_num_threads(args.threads)
    texts = queries(args.data, args.queries, args.seed)[args.start:args.stop]
    resolver = open_resolver(args.index_dir)
    resolver.resolve(texts[:8])
    seconds, answers = timed(resolver, texts, args.rounds)
    print(json.dumps({"seconds": seconds, "ids": [[m["id"] for m in ms] for ms in answers]}))


def run_children(args, threads: int, halves: list[tuple[int, int]]) -> list[dict]:
    """Processes of ``threads`` torch threads at once, one per (start, stop) of the queries; their reports."""
    command = [sys.executable, __file__, "--child", "--index-dir", str(args.index_dir), "--data", str(args.data),
               "--queries", str(args.queries), "--seed", str(args.seed), "--rounds", str(args.rounds),
               "--threads", str(threads)]
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    running = [subprocess.Popen([*command, "--start", str(a), "--stop", str(b)], stdout=subprocess.PIPE, env=env,
                                text=True) for a, b in halves]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in running]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index-dir", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stop", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    n, half = args.queries, args.queries // 2
    both = run_children(args, 2, [(0, n)])[0]
    one = run_children(args, 1, [(0, n)])[0]
    two = run_children(args, 1, [(0, half), (half, n)])
    assert one["ids"] == both["ids"] and two[0]["ids"] + two[1]["ids"] == both["ids"], "answers differ"
    report = {"queries": n, "two threads": round(n / both["seconds"], 1), "one thread": round(n / one["seconds"], 1),
              "two processes, each": [round(half / r["seconds"], 1) for r in two],
              "two processes, together": round(n / max(r["seconds"] for r in two), 1)}

    import torch

    from mgeo_index.query.resolver import open_resolver

    torch.set_num_threads(1)
    texts = queries(args.data, n, args.seed)
    resolver = open_resolver(args.index_dir)
    resolver.resolve(texts[:8])
    from mgeo_index.text.parser import parse

    parts = [(texts[:half], parse(texts[:half])), (texts[half:], parse(texts[half:]))]
    best, got = float("inf"), [None, None]
    for _ in range(args.rounds):
        def go(i: int) -> None:
            got[i] = resolver.resolve(parts[i][0], parses=parts[i][1])

        workers = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    assert [[m["id"] for m in ms] for ms in got[0] + got[1]] == both["ids"], "answers differ"
    report["two threads of one process"] = round(n / best, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
