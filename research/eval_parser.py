"""Measure the address parser on the held-out split of the shared tagged addresses.

Reports entity-level micro-F1 of the element tagger (all files together and each file alone: the held-out
parsing data is nationwide and Zhejiang addresses), province / city / district resolution accuracy
(written in the address, and inferred after removing them) and batched parsing speed: addresses/s over
``--speed-rows`` addresses of the train split that this process has not parsed before (``fresh``: a new slice
each of 3 runs, as held-out addresses would be), and over the last slice again (``repeated``: the gazetteer's
answers are cached by admin mentions). ``--collector-ab`` adds the shipped loaders' ``gc.freeze``
(:mod:`mgeo_index.heap`) against none, alternating over 6 fresh slices in this process; ``--against DIR`` times another tagger the same way against
this one (``--tagger`` or the shipped).

Example: OMP_NUM_THREADS=1 .venv/bin/python research/eval_parser.py --data ../shared/data --collector-ab
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from statistics import median
from pathlib import Path

from mgeo_index.text.gazetteer import default_gazetteer
from mgeo_index.text.parser import parse, tag_batched
from mgeo_index.text.tagger import default_tagger, load_tagger
from mgeo_index.training.tagger import admin_accuracy, entity_scores, f1_by_file, load_examples

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--split", default="test", choices=["test", "dev"])
parser.add_argument("--speed-rows", type=int, default=5000)
parser.add_argument("--collector-ab", action="store_true", help="also time parsing with and without gc.freeze")
parser.add_argument("--tagger", type=Path, default=None, help="a tagger directory (default: the shipped one)")
parser.add_argument("--against", type=Path, default=None,
                    help="another tagger directory: parsing speed of both, alternating over fresh slices in this process")
args = parser.parse_args()
if args.collector_ab and args.against:
    parser.error("--collector-ab and --against each need the fresh addresses left: give one of them")

splits = load_examples(args.data)
examples = splits[args.split]
tagger = default_tagger() if args.tagger is None else load_tagger(args.tagger)
gazetteer = default_gazetteer()
texts = [t for t, _ in examples]
pred = tag_batched(tagger, texts)
gold = [s for _, s in examples]
report = {
    "split": args.split, "examples": len(examples), "tagger": str(args.tagger or "shipped"),
    "tagging_f1_without_redundant": entity_scores(gold, pred),
    "tagging_f1_all_labels": round(entity_scores(gold, pred, ignore=())["f1"], 4),
    "admin": admin_accuracy(examples, lambda xs: parse(xs, tagger=tagger, gazetteer=gazetteer), gazetteer),
}
report["tagging_f1_by_file"] = f1_by_file(lambda xs: tag_batched(tagger, xs), args.data, args.split)
pool = [t for t, _ in splits["train"] + splits["dev"]]  # addresses this process has not parsed yet
slices = iter(pool[i : i + args.speed_rows] for i in range(512, len(pool) - args.speed_rows + 1, args.speed_rows))
parse(pool[:512], tagger=tagger, gazetteer=gazetteer)  # warm-up


def rate(rows: list[str], with_tagger=tagger) -> int:
    start = time.process_time()
    parse(rows, tagger=with_tagger, gazetteer=gazetteer)
    return round(len(rows) / (time.process_time() - start))


fresh = [rate(rows := next(slices)) for _ in range(3)]
report["parse_addresses_per_cpu_s"] = {
    "fresh": {"median": sorted(fresh)[1], "runs": fresh}, "repeated": rate(rows), "rows": args.speed_rows,
}


def alternate(setups: dict) -> dict:
    """Parsing speed under two settings, alternating over 6 fresh slices in this process (``setups``: name →
    a callable that puts its setting in place and returns the tagger to time)."""
    names = list(setups)
    runs: dict[str, list[int]] = {name: [] for name in names}
    for k in range(6):
        runs[names[k % 2]].append(rate(next(slices), setups[names[k % 2]]()))
    return {**runs, "ratio_of_medians": round(median(runs[names[0]]) / median(runs[names[1]]), 3)}


if args.collector_ab:  # gc.freeze (what the loaders did) against none
    report["collector_ab"] = alternate({"frozen": lambda: (gc.freeze(), tagger)[1],
                                        "unfrozen": lambda: (gc.unfreeze(), tagger)[1]})
    gc.freeze()
if args.against:  # the two taggers, the same gazetteer
    other = load_tagger(args.against)
    parse(pool[:512], tagger=other, gazetteer=gazetteer)
    report["against"] = {**alternate({"this": lambda: tagger, "against": lambda: other}), "tagger": str(args.against)}
report["load_average"] = os.getloadavg()  # other work on the machine slows the speed figure
print(json.dumps(report, ensure_ascii=False, indent=1))
