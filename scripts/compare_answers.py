"""Do two code versions give the same answers? Labels and rankings of a fixed sample of queries, side by side.

    git worktree add /tmp/before HEAD~5
    python scripts/compare_answers.py --before /tmp/before --index-dir ccks-index --queries 2000

Each version resolves the same ``--queries`` CCKS queries (a fixed shuffle of the distinct queries of
``pairs/ccks2021_train.tsv.gz``) against the same index, in a child process running its own code, and writes
every match's id, label and probabilities. Reported: queries whose ranked ids differ, matches whose label
differs, and the largest probability difference. A speed change that keeps results must report 0 / 0.
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
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

RESOLVE = r"""
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", type(f).__name__) != "_EditableFinder"]
import os, mgeo_index
assert os.path.realpath(mgeo_index.__file__).startswith(os.path.realpath(os.environ["PYTHONPATH"]) + os.sep), mgeo_index.__file__
from mgeo_index.query.resolver import open_resolver
index_dir, queries_file, out, top_k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
queries = json.loads(open(queries_file, encoding="utf-8").read())
resolver = open_resolver(index_dir, device="cpu")
answers = []
for start in range(0, len(queries), 256):
    for matches in resolver.resolve(queries[start : start + 256], top_k=top_k):
        answers.append([[m["id"], m.get("label"), m.get("probabilities")] for m in matches])
open(out, "w", encoding="utf-8").write(json.dumps(answers))
"""


def answers(code: Path, index_dir: Path, queries_file: Path, out: Path, top_k: int) -> list:
    run = subprocess.run([sys.executable, "-c", RESOLVE, str(index_dir), str(queries_file), str(out), str(top_k)],
                         cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"resolving with the code under {code} failed:\n{run.stderr[-3000:]}")
    return json.loads(out.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the version to compare with")
    parser.add_argument("--index-dir", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=HERE.parent / "shared" / "data")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--top-k", type=int, default=10)
    args = parser.parse_args()
    with gzip.open(args.data / "pairs" / "ccks2021_train.tsv.gz", "rt", encoding="utf-8") as fh:
        queries = list(dict.fromkeys(row["query"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)))
    random.Random(0).shuffle(queries)
    queries = queries[: args.queries]
    with tempfile.TemporaryDirectory() as tmp:
        queries_file = Path(tmp) / "queries.json"
        queries_file.write_text(json.dumps(queries, ensure_ascii=False), encoding="utf-8")
        before = answers(args.before.resolve(), args.index_dir.resolve(), queries_file, Path(tmp) / "before.json", args.top_k)
        after = answers(HERE, args.index_dir.resolve(), queries_file, Path(tmp) / "after.json", args.top_k)
    rankings = sum([m[0] for m in a] != [m[0] for m in b] for a, b in zip(before, after))
    labels = matches = 0
    largest = 0.0
    for a, b in zip(before, after):
        by_id = {m[0]: m for m in b}
        for id_, label, probs in a:
            other = by_id.get(id_)
            if other is None:
                continue
            matches += 1
            labels += label != other[1]
            if probs and other[2]:
                largest = max(largest, *(abs(probs[k] - other[2][k]) for k in probs))
    print(json.dumps({"queries": len(queries), "top_k": args.top_k, "rankings_differ": rankings,
                      "matches_compared": matches, "labels_differ": labels, "largest_probability_difference": largest,
                      "before": str(args.before), "after": str(HERE)}, indent=2))


if __name__ == "__main__":
    main()
