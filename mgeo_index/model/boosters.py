"""What both tree heads (the feature head of trees, :mod:`~mgeo_index.model.tree_head`, and the group head,
:mod:`~mgeo_index.model.group_head`) share: LightGBM, imported where trees are trained (and where the measured feature
head of trees predicts; the group head's trees predict in NumPy, :mod:`~mgeo_index.model.forest`), the threads trees
predict with, and the class balance of their training. Imports no torch, so that the numpy backend's ``match`` runs
the group head without it."""
from __future__ import annotations

import os
import sys

import numpy as np

from mgeo_index.settings import LABELS


def lightgbm():
    """The lightgbm module, imported where trees are trained (the group head, a feature head of trees) or where a
    feature head of trees predicts: training's extra, not the core's."""
    try:
        import lightgbm as lgb
    except ImportError as exc:
        from mgeo_index.model.manifest import ModelError

        raise ModelError("training trees (and a feature head of trees) needs LightGBM: "
                         "pip install 'mgeo-index[train]'") from exc
    return lgb


def predict_threads() -> int:
    """Threads trees predict with: torch's intra-op count where torch computes (every core, unless
    ``OMP_NUM_THREADS`` or batches computed side by side said otherwise), else ``OMP_NUM_THREADS`` or the cores
    this process may use. A row's score is the same bits on any number of threads; two gave 1.8x one on the shipped
    group head in NumPy (6 boosters of 900 trees, 5,000 rows; 2.0x in LightGBM)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return max(1, torch.get_num_threads())
    try:
        chosen = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        chosen = 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, chosen or cores or 1)


def balanced_weights(y: np.ndarray) -> np.ndarray:
    """Per row, its class's inverse frequency (n / (classes · count)): the trees' class balance (exact_match is rare)."""
    y = np.asarray(y, dtype=np.int64)
    counts = np.bincount(y, minlength=len(LABELS))
    return (len(y) / (len(LABELS) * np.maximum(counts, 1)))[y]
