"""The feature head as gradient-boosted trees (LightGBM): (B, F) pair features → (B, 3) logits.

An alternative to the averaged MLPs (:class:`~mgeo_index.model.cross_encoder.FeatureHead`), measured and not
shipped: trained on the train split of every labelled pair file, the trees decide CCKS round-2 labels better
stacked with the network but rank a query's retrieved candidates worse (the README's ablation has the figures).
``python scripts/recalibrate.py --model DIR --head trees`` fits one. Called
like the MLP head: a float32 tensor (or array) of features in, a float32 tensor of logits (LightGBM's raw multiclass scores,
whose softmax is its probability) out, row by row, so a pair's logits never depend on its batch-mates.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from mgeo_index.model.boosters import balanced_weights, lightgbm, predict_threads
from mgeo_index.settings import LABELS

TREE_HEAD = "feature_head.lgb.txt"
ROUNDS = 100
PARAMS = {
    "objective": "multiclass", "num_class": len(LABELS), "learning_rate": 0.1, "num_leaves": 63,
    "min_data_in_leaf": 40, "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
    "verbose": -1, "num_threads": 1, "deterministic": True,
}


class TreeHead(nn.Module):
    """A module without parameters (so it takes the MLP head's place in a cross-encoder) around a Booster."""

    def __init__(self, booster):
        super().__init__()
        self.booster = booster

    def forward(self, features) -> torch.Tensor:
        x = features.numpy() if isinstance(features, torch.Tensor) else np.asarray(features)
        if not len(x):
            return torch.empty((0, len(LABELS)), dtype=torch.float32)
        scores = self.booster.predict(np.ascontiguousarray(x, dtype=np.float32), raw_score=True,
                                      num_threads=predict_threads())
        return torch.from_numpy(np.asarray(scores, dtype=np.float32).reshape(len(x), len(LABELS)))

    @property
    def trees(self) -> int:
        return self.booster.num_trees()

    def save(self, path: str | Path) -> None:
        self.booster.save_model(str(path))

    def __deepcopy__(self, memo) -> TreeHead:
        return TreeHead(lightgbm().Booster(model_str=self.booster.model_to_string()))


def load_tree_head(path: str | Path) -> TreeHead:
    return TreeHead(lightgbm().Booster(model_file=str(path)))


def train_tree_head(x: np.ndarray, y: np.ndarray, *, seed: int = 0, rounds: int = ROUNDS, init: TreeHead | None = None,
                    learning_rate: float | None = None) -> TreeHead:
    """Trees on (features, LABELS index), each class weighted by its inverse frequency (exact_match is rare and
    what users need most). ``init``: boost ``rounds`` more trees on top of that head (a refit on new labels)."""
    lgb = lightgbm()
    x, y = np.ascontiguousarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)
    weight = balanced_weights(y)
    params = PARAMS | {"seed": seed} | ({"learning_rate": learning_rate} if learning_rate is not None else {})
    booster = lgb.train(params, lgb.Dataset(x, y, weight=weight, free_raw_data=True), num_boost_round=rounds,
                        init_model=None if init is None else init.booster, keep_training_booster=False)
    return TreeHead(booster)
