"""Measure the address parser on the held-out split of the shared tagged addresses.

Reports entity-level micro-F1 of the element tagger, province / city / district resolution accuracy
(written in the address, and inferred after removing them) and batched parsing speed.

Example: OMP_NUM_THREADS=1 .venv/bin/python scripts/eval_parser.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from mgeo_index.text.gazetteer import default_gazetteer
from mgeo_index.text.parser import parse, tag_batched
from mgeo_index.text.tagger import default_tagger, load_tagger
from mgeo_index.training.tagger import admin_accuracy, entity_scores, load_examples

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--split", default="test", choices=["test", "dev"])
parser.add_argument("--speed-rows", type=int, default=5000)
parser.add_argument("--tagger", type=Path, default=None, help="a tagger directory (default: the shipped one)")
args = parser.parse_args()

examples = load_examples(args.data)[args.split]
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
rows = (texts * (args.speed_rows // max(len(texts), 1) + 1))[: args.speed_rows]
parse(rows[:512], tagger=tagger, gazetteer=gazetteer)  # warm-up
rates = []
for _ in range(3):
    start = time.perf_counter()
    parse(rows, tagger=tagger, gazetteer=gazetteer)
    rates.append(round(len(rows) / (time.perf_counter() - start)))
report["parse_addresses_per_s"] = {"median": sorted(rates)[1], "runs": rates, "rows": len(rows)}
report["load_average"] = os.getloadavg()  # other work on the machine slows the speed figure
print(json.dumps(report, ensure_ascii=False, indent=1))
