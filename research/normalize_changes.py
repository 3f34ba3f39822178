"""Count the pair texts whose normalized form changes from the first normalization (text.normalize.basic,
which the shipped match model was trained on) to today's ``normalize``, by step, with examples.

Example: .venv/bin/python research/normalize_changes.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import csv
import gzip
from collections import Counter
from pathlib import Path

from mgeo_index.text.normalize import _NOTE, _NUMBERED, _PHONE, basic, normalize, to_simplified

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--examples", type=int, default=3)
args = parser.parse_args()

FILES = {"ccks2021_train.tsv.gz": ("query", "candidate"), "shenzhen_val.tsv.gz": ("addr1", "addr2")}
for name, columns in FILES.items():
    with gzip.open(args.data / "pairs" / name, "rt", encoding="utf-8", newline="") as fh:
        texts = {row[c] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE) for c in columns}
    changed, steps, examples = 0, Counter(), {}
    for text in texts:
        old, new = basic(text), normalize(text)
        if old == new:
            continue
        changed += 1
        for step, hit in (("traditional", to_simplified(old) != old), ("phone", bool(_PHONE.search(old))),
                          ("note", bool(_NOTE.search(old))), ("numeral", bool(_NUMBERED.search(old)))):
            if hit:
                steps[step] += 1
                examples.setdefault(step, []).append(f"{old} → {new}")
    print(f"{name}: {changed} of {len(texts)} distinct texts change ({changed / len(texts):.2%}); by step: {dict(steps)}")
    for step, items in examples.items():
        for item in items[: args.examples]:
            print(f"  {step}: {item}")
