"""The group head against each pair alone, by 5-fold cross-validation over the calibration + dev splits of both
CCKS files (grouped by query, several fold seeds), CCKS macro-F1 per source (#14).

The model's group-head trees (trained on the train split) are kept; what is refitted per fold, on four folds, is
what ``scripts/recalibrate.py`` fits on the calibration and dev splits: the stack of the trees', the network's and
the feature head's logits and the decision offsets (``group``); beside it each pair alone, the stacked scorer's
probabilities with their temperature, bias and offsets refitted the same way (``pairwise``). The shipped group
head's stack and offsets saw these pairs, so only out-of-fold figures measure it
(:func:`mgeo_index.training.group.cross_validate`).

    OMP_NUM_THREADS=1 python scripts/eval_group_head.py --data ../shared/data [--model DIR]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.settings import DEFAULT_CROSS_MODEL
from mgeo_index.training.group import cross_validate, group_head_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--model", type=Path, default=DEFAULT_CROSS_MODEL)
    parser.add_argument("--seeds", type=int, default=3, help="fold seeds")
    args = parser.parse_args()
    model = load_cross_encoder(args.model)
    if model.group_head is None:
        raise SystemExit(f"{args.model} has no group head: fit one with scripts/recalibrate.py --decision-only")
    _, stack_pairs = group_head_pairs(args.data)
    for name, report in cross_validate(model, stack_pairs, seeds=args.seeds).items():
        print(name, json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
