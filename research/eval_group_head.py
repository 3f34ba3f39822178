"""The group head against each pair alone, by 5-fold cross-validation over the calibration + dev splits of both
CCKS files (grouped by query, several fold seeds), CCKS macro-F1 per source.

The model's group-head trees (trained on the train split) are kept; what is refitted per fold, on four folds, is
what ``scripts/recalibrate.py`` fits on the calibration and dev splits: the stack of the trees', the network's and
the feature head's logits and the decision offsets (``group``); beside it each pair alone, the stacked scorer's
probabilities with their temperature, bias and offsets refitted the same way (``pairwise``). The shipped group
head's stack and offsets saw these pairs, so only out-of-fold figures measure it
(:func:`mgeo_index.training.group.cross_validate`).

``--train-fractions`` draws the learning curve of the trees: for each share of the train split's queries (whole
queries; a smaller share is inside a larger one) the trees are trained again as ``fit_group_head`` trains them,
then cross-validated the same way; the network and the feature head stay the shipped ones (what more
labelled pairs would buy).

    OMP_NUM_THREADS=1 python research/eval_group_head.py --data ../shared/data [--model DIR]
    OMP_NUM_THREADS=1 python research/eval_group_head.py --data ../shared/data --train-fractions 0.125 0.25 0.5 1

``--max-depths`` trains the trees again on the whole train split with each depth limit (LightGBM's ``max_depth``;
the shipped trees have none and reach 28 levels) and cross-validates them the same way, with the time NumPy takes
to walk them (:class:`mgeo_index.model.forest.Forest`) over the held-out pairs' group features: what shallower trees
cost in quality and save in ``match``.

    python research/eval_group_head.py --data ../shared/data --max-depths 6 8 10
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.settings import DEFAULT_CROSS_MODEL
from mgeo_index.training.group import cross_validate, group_head_pairs, train_trees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--model", type=Path, default=DEFAULT_CROSS_MODEL)
    parser.add_argument("--seeds", type=int, default=3, help="fold seeds")
    parser.add_argument("--train-fractions", type=float, nargs="+", default=None,
                        help="shares of the train split's queries to train the trees on again (the learning curve)")
    parser.add_argument("--max-depths", type=int, nargs="+", default=None,
                        help="depth limits to train the trees again with (quality and walking time of each)")
    args = parser.parse_args()
    model = load_cross_encoder(args.model)
    if model.group_head is None:
        raise SystemExit(f"{args.model} has no group head: fit one with scripts/recalibrate.py --decision-only")
    group_pairs, stack_pairs = group_head_pairs(args.data)
    if args.max_depths is not None:
        depths(model, group_pairs, stack_pairs, args.max_depths, args.seeds)
        return
    if args.train_fractions is None:
        for name, report in cross_validate(model, stack_pairs, seeds=args.seeds).items():
            print(name, json.dumps(report), flush=True)
        return
    for fraction in args.train_fractions:
        if not 0 < fraction <= 1:
            raise SystemExit(f"--train-fractions: {fraction} is not a share in (0, 1]")
        started = time.monotonic()
        model.group_head.forest, rows = train_trees(model, group_pairs, fraction=fraction)
        report = cross_validate(model, stack_pairs, seeds=args.seeds)["group"]
        print(json.dumps({"fraction": fraction, "train_pairs": len(rows), "queries": len({p.group for p in rows}),
                          "minutes": round((time.monotonic() - started) / 60, 1), "group": report}), flush=True)


def depths(model, group_pairs, stack_pairs, limits: list[int], seeds: int) -> None:
    """The shipped trees, then trees trained again with each depth limit: 5-fold quality and walking time."""
    from mgeo_index.model.boosters import predict_threads
    from mgeo_index.training.group import SHIPPED_HELD_OUT, _described

    x = _described(model, stack_pairs, SHIPPED_HELD_OUT)[4]
    for limit in [None, *limits]:
        started = time.monotonic()
        if limit is not None:
            if limit < 1:
                raise SystemExit(f"--max-depths: {limit} is not a depth")
            model.group_head.forest, _ = train_trees(model, group_pairs, params={"max_depth": limit})
        trained = time.monotonic() - started
        walked = time.perf_counter()
        model.group_head.forest.raw_scores(x, threads=predict_threads())
        walked = time.perf_counter() - walked
        report = cross_validate(model, stack_pairs, seeds=seeds)["group"]
        print(json.dumps({"max_depth": limit, "deepest": int(model.group_head.forest.depths.max()),
                          "train_minutes": round(trained / 60, 1), "walk_s": round(walked, 2),
                          "pairs": len(x), "group": report}), flush=True)


if __name__ == "__main__":
    main()
