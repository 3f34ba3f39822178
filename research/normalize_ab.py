"""Score the dev pairs with the shipped match models under the first normalization (text.normalize.basic)
and under today's ``normalize``, side by side: what the normalization change does to the models
trained on the first one.

Example: OMP_NUM_THREADS=1 .venv/bin/python research/normalize_ab.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from mgeo_index import settings
from mgeo_index.measure.evaluate import evaluate_pairs, read_labeled_pairs
from mgeo_index.model.cross_encoder import load_cross_encoder

# the module, not the function of the same name that mgeo_index.text exports
normalization = importlib.import_module("mgeo_index.text.normalize")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
args = parser.parse_args()

current = normalization.normalize


def use(fn) -> None:
    """Point every loaded module's ``normalize`` (imported by name) at fn."""
    for module in list(sys.modules.values()):
        if getattr(module, "normalize", None) in (current, normalization.basic):
            module.normalize = fn


cross = load_cross_encoder(settings.cross_model_path(None)).to("cpu")
for name in ("ccks2021_train.tsv.gz", "shenzhen_val.tsv.gz"):
    a, b, gold = read_labeled_pairs(args.data / "pairs" / name, "dev")
    row = {"file": name, "pairs": len(gold)}
    for label, fn in (("first", normalization.basic), ("current", current)):
        use(fn)
        report = evaluate_pairs(cross, a, b, gold, device="cpu")
        row[label] = {"macro_f1": round(report["macro_f1"], 4), "accuracy": round(report["accuracy"], 4)}
    use(current)
    print(json.dumps(row))
