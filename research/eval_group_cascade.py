"""How many pairs ``match`` labels without the network, and at what quality: the group head's gate, refitted here.

The shipped group head stacks three logit columns — its trees, the network, the feature head — with weights fitted
on the calibration and dev splits (:data:`mgeo_index.training.group.SHIPPED_HELD_OUT`). Its gate
(:class:`mgeo_index.model.group_head.GroupGate`) is a second stack without the network column, fitted on the same
pairs, that settles a pair whose network-free label is not ``exact_match``, with P(exact_match) under its cap and
its label's probability at least a threshold: the lowest that keeps the full stack's label on ``--agreement`` of the
fitting pairs (:func:`mgeo_index.training.group.fit_group_gate`; 0.995 ships). For each agreement, printed per split
(dev, where the stacks were fitted; holdout, read by no fit): the share of pairs that skip the network and the CCKS
macro-F1 of the labels decided with the head's offsets (before the number policy, each CCKS query's candidates
together as the file lists them), the network on every pair and gated, with a paired bootstrap of the change.

    OMP_NUM_THREADS=1 python research/eval_group_cascade.py --data ../shared/data [--model DIR]
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
from mgeo_index.training.group import fit_group_gate, group_head_pairs, held_out_columns


def macro_f1(gold: np.ndarray, decided: np.ndarray, labels) -> float:
    return classification_report(gold, decided, list(labels))["macro_f1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--model", type=Path, default=settings.DEFAULT_CROSS_MODEL, help="cross-encoder directory")
    parser.add_argument("--agreement", nargs="+", type=float, default=[0.995, 0.99, 0.98])
    parser.add_argument("--cap", type=float, default=0.03)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()

    cross = load_cross_encoder(args.model)
    head = cross.group_head
    exact = cross.labels.index("exact_match")
    _, stack_pairs = group_head_pairs(args.data)

    def columns(splits):
        return held_out_columns(cross, head, stack_pairs, splits)

    _, fit_gold, fit_columns = columns(tuple(head.stats["held_out"]))
    gates = {agreement: fit_group_gate(head, fit_columns, fit_gold, exact, agreement=agreement, max_exact=args.cap)
             for agreement in args.agreement}
    rng = np.random.default_rng(0)
    for split in ("dev", "holdout"):
        rows, gold, (trees, network, feature_head) = columns((split,))
        full = stacked_probabilities(head.weights, head.bias, [trees, network, feature_head])
        shipped = head.decide(full)
        ccks = np.array([p.source != "shenzhen" for p in rows])
        idx = np.flatnonzero(ccks)
        for agreement, gate in gates.items():
            free, settled = gate.judge(trees, feature_head, head.decision_offsets, exact)
            mixed = head.decide(np.where(settled[:, None], free, full))
            before, after = (macro_f1(gold[ccks], d[ccks], cross.labels) for d in (shipped, mixed))
            draws = [macro_f1(gold[s], mixed[s], cross.labels) - macro_f1(gold[s], shipped[s], cross.labels)
                     for s in (rng.choice(idx, len(idx)) for _ in range(args.resamples))]
            print(json.dumps({"split": split, "agreement_on_fit": agreement, "threshold": gate.min_probability,
                              "skip_network_share": round(float(settled.mean()), 3),
                              "ccks_pairs": int(ccks.sum()), "ccks_macro_f1": [round(before, 4), round(after, 4)],
                              "change_95": np.percentile(draws, [2.5, 97.5]).round(4).tolist(),
                              "labels_moved": int((mixed != shipped).sum())}), flush=True)


if __name__ == "__main__":
    main()
