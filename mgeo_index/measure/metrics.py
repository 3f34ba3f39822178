"""Classification and retrieval metrics as plain functions over arrays (no sklearn needed)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confusion(gold: Sequence[int], pred: Sequence[int], n_classes: int) -> np.ndarray:
    """Rows: gold class, columns: predicted class."""
    matrix = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(matrix, (np.asarray(gold, dtype=np.int64), np.asarray(pred, dtype=np.int64)), 1)
    return matrix


def classification_report(gold: Sequence[int], pred: Sequence[int], labels: Sequence[str]) -> dict:
    matrix = confusion(gold, pred, len(labels))
    tp = np.diag(matrix).astype(float)
    precision = np.divide(tp, matrix.sum(0), out=np.zeros_like(tp), where=matrix.sum(0) > 0)
    recall = np.divide(tp, matrix.sum(1), out=np.zeros_like(tp), where=matrix.sum(1) > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    return {
        "n": int(matrix.sum()),
        "accuracy": float(tp.sum() / max(matrix.sum(), 1)),
        # over the classes present in gold or predictions (as sklearn does): a binary data set
        # scored by a 3-way model is not penalized for the class it never contains
        "macro_f1": float(f1[(matrix.sum(0) + matrix.sum(1)) > 0].mean()) if matrix.sum() else 0.0,
        "per_class": {
            label: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for label, p, r, f, s in zip(labels, precision, recall, f1, matrix.sum(1))
        },
        "confusion": matrix.tolist(),
        "labels": list(labels),
    }


def expected_calibration_error(probs: np.ndarray, gold: Sequence[int], bins: int = 15) -> float:
    """ECE of the top-label confidence, equal-width bins."""
    probs = np.asarray(probs)
    confidence = probs.max(1)
    correct = probs.argmax(1) == np.asarray(gold)
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (confidence > lo) & (confidence <= hi)
        if in_bin.any():
            ece += in_bin.mean() * abs(confidence[in_bin].mean() - correct[in_bin].mean())
    return float(ece)


def retrieval_report(ranked_ids: np.ndarray, gold_ids: Sequence, ks: Sequence[int] = (1, 5, 10)) -> dict:
    """recall@k and MRR@max(k) for rows of ranked ids (best first) against the gold of each row.

    A row's gold is one id or a collection of ids (any of them counts as found).
    """
    ranked = np.asarray(ranked_ids)
    golds = [set(g) if isinstance(g, (set, frozenset, list, tuple)) else {g} for g in gold_ids]
    hits = np.array([[int(i) in gold for i in row] for row, gold in zip(ranked.tolist(), golds)], dtype=bool).reshape(ranked.shape)
    first = np.where(hits.any(1), hits.argmax(1), -1)
    report = {f"recall@{k}": float(((first >= 0) & (first < k)).mean()) for k in ks}
    k_max = max(ks)
    found = (first >= 0) & (first < k_max)
    rr = np.zeros(len(first))
    rr[found] = 1.0 / (first[found] + 1)
    report[f"mrr@{k_max}"] = float(rr.mean())
    report["n"] = len(golds)
    return report
