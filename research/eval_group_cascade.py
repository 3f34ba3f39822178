"""Could ``match`` skip the network for pairs the group head decides clearly without it? Measured, not built.

The shipped group head stacks three logit columns — its trees, the network, the feature head — with weights fitted
on the calibration and dev splits (:data:`mgeo_index.training.group.SHIPPED_HELD_OUT`). This fits a second stack
without the network column (trees + feature head) on the same splits and the same pairs, and a gate on it: a pair
whose network-free label is not ``exact_match``, with P(exact_match) under ``--cap`` and its label's probability at
least the threshold, keeps the network-free probabilities; the others get the shipped stack's. The thresholds are
chosen on calib + dev as the lowest that keep the shipped label on ``--agreement`` of those pairs; printed per split
(dev, where the stack was fitted; holdout, read by no fit): the share of pairs that would skip the network and the
CCKS macro-F1 of the labels decided with the shipped offsets (the group head's labels before the number policy,
each CCKS query's candidates together as the file lists them), both ways, with a paired bootstrap of the change.

    OMP_NUM_THREADS=1 python research/eval_group_cascade.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mgeo_index import settings
from mgeo_index.measure.metrics import classification_report
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.model.group_head import stacked_probabilities
from mgeo_index.runtime import inference
from mgeo_index.training.calibrate import fit_column_stack
from mgeo_index.training.group import SHIPPED_HELD_OUT, _described, group_head_pairs


def macro_f1(gold: np.ndarray, decided: np.ndarray, labels) -> float:
    return classification_report(gold, decided, list(labels))["macro_f1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--agreement", nargs="+", type=float, default=[0.995, 0.99, 0.98])
    parser.add_argument("--cap", type=float, default=0.03)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()

    cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    head = cross.group_head
    exact = cross.labels.index("exact_match")
    _, stack_pairs = group_head_pairs(args.data)

    def columns(splits):
        rows, a, b, features, x, gold = _described(cross, stack_pairs, splits)
        network, feature_head = inference.component_logits(cross, a, b, features=features)
        return rows, gold, head.tree_logits(x), network, feature_head

    _, fit_gold, fit_trees, fit_network, fit_feature_head = columns(SHIPPED_HELD_OUT)
    params = fit_column_stack([fit_trees, fit_feature_head], fit_gold).tolist()
    free_weights, free_bias = params[:2], params[2:]

    def judged(trees, network, feature_head):
        full = stacked_probabilities(head.weights, head.bias, [trees, network, feature_head])
        free = stacked_probabilities(free_weights, free_bias, [trees, feature_head])
        return full, free

    full, free = judged(fit_trees, fit_network, fit_feature_head)
    shipped = head.decide(full)
    free_label = head.decide(free)
    confidence = free[np.arange(len(free)), free_label]
    candidates = (free_label != exact) & (free[:, exact] < args.cap)
    thresholds = {}
    for agreement in args.agreement:  # the lowest threshold that keeps the shipped label on that share
        for t in np.arange(0.5, 1.0001, 0.005):
            settled = candidates & (confidence >= t)
            kept = np.where(settled, free_label, shipped)
            if np.mean(kept == shipped) >= agreement:
                thresholds[agreement] = round(float(t), 3)
                break
    rng = np.random.default_rng(0)
    for split in ("dev", "holdout"):
        rows, gold, trees, network, feature_head = columns((split,))
        full, free = judged(trees, network, feature_head)
        shipped, free_label = head.decide(full), head.decide(free)
        confidence = free[np.arange(len(free)), free_label]
        ccks = np.array([p.source != "shenzhen" for p in rows])
        for agreement, t in thresholds.items():
            settled = (free_label != exact) & (free[:, exact] < args.cap) & (confidence >= t)
            mixed = head.decide(np.where(settled[:, None], free, full))
            before, after = (macro_f1(gold[ccks], d[ccks], cross.labels) for d in (shipped, mixed))
            idx = np.flatnonzero(ccks)
            draws = [macro_f1(gold[s], mixed[s], cross.labels) - macro_f1(gold[s], shipped[s], cross.labels)
                     for s in (rng.choice(idx, len(idx)) for _ in range(args.resamples))]
            print(json.dumps({"split": split, "agreement_on_fit": agreement, "threshold": t,
                              "skip_network_share": round(float(settled.mean()), 3),
                              "ccks_pairs": int(ccks.sum()), "ccks_macro_f1": [round(before, 4), round(after, 4)],
                              "change_95": np.percentile(draws, [2.5, 97.5]).round(4).tolist(),
                              "labels_moved": int((mixed != shipped).sum())}), flush=True)


if __name__ == "__main__":
    main()
