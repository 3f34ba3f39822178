"""Fit the label decision offsets of an existing cross-encoder on the calibration split, in place.

`mgeo-index train` does this at the end of its calibration stage; this script applies the same step
to a model trained before the step existed (the shipped default was updated this way).

    python scripts/refit_decision.py --model mgeo_index/model/default/cross --data ../shared/data
"""
import argparse
import json
from pathlib import Path

from mgeo_index.training.train import refit_decision

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", type=Path, required=True, help="cross-encoder directory (rewritten in place)")
parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
args = parser.parse_args()
print(json.dumps(refit_decision(args.model, args.data), ensure_ascii=False))
