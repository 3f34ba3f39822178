"""The group head's inputs compared by 5-fold cross-validation over the calibration + dev splits of both CCKS
files (grouped by query, several fold seeds), CCKS macro-F1 per source (#14).

Each variant is fitted as the shipped group head is (``mgeo_index.model.group_head``: L2-regularized
multinomial logistic regression; decision offsets on inner out-of-fold predictions) on four folds and scored
on the fifth:

- ``shipped``: the group inputs of ``--model``'s pairwise probabilities (the shipped head's inputs);
- ``+ second``: the same inputs of a second pairwise scorer's probabilities beside them (``--second DIR``,
  e.g. a copy of the shipped cross-encoder recalibrated with ``scripts/recalibrate.py --head trees``);
- ``+ listwise``: ten pair features (string similarities, road number, POI, sub-POI and building agreement)
  with their difference to the group's best and mean.

    cp -r mgeo_index/model/default/cross /tmp/trees-cross
    python scripts/recalibrate.py --model /tmp/trees-cross --data ../shared/data --head trees
    OMP_NUM_THREADS=1 python scripts/eval_group_head.py --data ../shared/data --second /tmp/trees-cross
"""
from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import numpy as np

from mgeo_index import inference
from mgeo_index.features import FEATURE_NAMES, pair_features_batch
from mgeo_index.metrics import classification_report
from mgeo_index.model import group_head
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.settings import DEFAULT_CROSS_MODEL
from mgeo_index.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data

LISTWISE = ("jaccard2", "ratio", "partial_ratio", "lcs_a", "numbers_jaccard", "roadno_parsed_agree",
            "roadno_parsed_differ", "poi_parsed_ratio", "subpoi_parsed_agree", "building_parsed_agree")
SOURCES = {"round2": ("round2_train",), "round1": ("round1_train_fold0",), "round1_tail": ("round1_train_tail",),
           "ccks2021_train": ("round2_train", "round1_train_fold0")}


def listwise_inputs(features: np.ndarray, keys: list[str]) -> np.ndarray:
    f = features[:, [FEATURE_NAMES.index(n) for n in LISTWISE]].astype(np.float64)
    out = np.zeros((len(f), 3 * f.shape[1]))
    for rows in group_head.runs(keys):
        out[rows] = np.hstack([f[rows], f[rows] - f[rows].max(0), f[rows] - f[rows].mean(0)])
    return out


def cross_validate(x: np.ndarray, gold: np.ndarray, keys: list[str], labels, seed: int, l2: float) -> np.ndarray:
    """Out-of-fold label decisions of a group head on inputs ``x`` (5 folds of whole queries), each fold's head
    fitted as the shipped one is (:func:`group_head.fit_inputs`)."""
    fold = np.zeros(len(gold), dtype=int)
    for rows in group_head.runs(keys):
        fold[rows] = zlib.crc32(f"{seed}:{keys[rows[0]]}".encode()) % group_head.FOLDS
    decided = np.zeros(len(gold), dtype=int)
    for k in range(group_head.FOLDS):
        train, test = np.flatnonzero(fold != k), fold == k
        head = group_head.fit_inputs(x[train], gold[train], [keys[i] for i in train], labels, l2=l2)
        decided[test] = group_head.predict(head, x[test])[1]
    return decided


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--model", type=Path, default=DEFAULT_CROSS_MODEL)
    parser.add_argument("--second", type=Path, help="a second pairwise scorer (cross-encoder folder)")
    parser.add_argument("--seeds", type=int, default=3, help="fold seeds")
    parser.add_argument("--l2", type=float, default=group_head.L2)
    args = parser.parse_args()
    pairs = [p for p in data.ccks_pairs(args.data) + data.ccks_extra_pairs(args.data) if split_of(p.group) in ("calib", "dev")]
    a, b = [normalize(p.a) for p in pairs], [normalize(p.b) for p in pairs]
    model = load_cross_encoder(args.model)
    labels = model.labels
    gold = np.array([labels.index(p.label) for p in pairs])
    source = np.array([p.source for p in pairs])
    features = pair_features_batch(a, b)
    base = group_head.group_inputs(inference.score_pairs(model, a, b, features=features), a, labels)
    variants = {"shipped": base, "+ listwise": np.hstack([base, listwise_inputs(features, a)])}
    if args.second:
        second = load_cross_encoder(args.second)
        variants["+ second"] = np.hstack([base, group_head.group_inputs(inference.score_pairs(second, a, b, features=features), a, labels)])
    report = {}
    for name, x in variants.items():
        runs = []
        for seed in range(args.seeds):
            decided = cross_validate(x, gold, a, labels, seed, args.l2)
            runs.append({src: classification_report(gold[np.isin(source, names)], decided[np.isin(source, names)], labels)["macro_f1"]
                         for src, names in SOURCES.items()})
        report[name] = {src: round(float(np.mean([r[src] for r in runs])), 4) for src in SOURCES} | {
            "per_seed_round2": [round(r["round2"], 4) for r in runs]}
        print(name, json.dumps(report[name]), flush=True)


if __name__ == "__main__":
    main()
