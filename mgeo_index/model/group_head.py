"""Group context: the label of a pair decided among the other candidates of its query.

Where a file lists a query's candidates together (CCKS-style pair files: ``mgeo-index match``, ``mgeo-index
eval pairs``), which candidate is the best of the lot is clearer than whether one is good on its own. The
group head is a multinomial logistic regression on top of the pairwise scorer's probabilities: each pair's
log-probabilities, their difference to the group's best and to its mean, the pair's rank in the group by
P(exact_match) and by P(not_match), how many other candidates have P(exact_match) > 0.5, and log(group size)
(:func:`group_inputs`, standardized). It is fitted on the calibration split (L2-regularized NLL), with its
own decision offsets fitted for macro-F1 on out-of-fold predictions (5 folds by group), and stored in the
cross-encoder's manifest (``group_head``). Ranking is untouched: ``resolve`` orders candidates as before.

A group is a run of consecutive pairs with the same first address (how CCKS files list a query's
candidates); a pair alone is a group of one. A pair's probabilities depend on its group-mates — that is
the point — and on nothing else: the same group gets the same answers whatever file or batch it is in.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

N_INPUTS = 13
L2 = 0.01
FOLDS = 5


def runs(keys: Sequence) -> list[np.ndarray]:
    """Row indices of each run of consecutive equal ``keys`` (a query's candidates), in order."""
    out, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            out.append(np.arange(start, i))
            start = i
    return out


def group_inputs(probs: np.ndarray, keys: Sequence, labels: Sequence[str]) -> np.ndarray:
    """(n, N_INPUTS) float64: each pair's standing among the pairs of its run (see the module docstring)."""
    probs = np.asarray(probs, dtype=np.float64)
    exact, not_match = labels.index("exact_match"), labels.index("not_match")
    logp = np.log(np.clip(probs, 1e-6, 1.0))
    out = np.zeros((len(probs), N_INPUTS))
    for rows in runs(keys):
        lp = logp[rows]
        out[rows, 0:3] = lp
        out[rows, 3:6] = lp - lp.max(0)
        out[rows, 6:9] = lp - lp.mean(0)
        # ranks, ties broken by position (stable sort): 0 is the best candidate
        out[rows, 9] = np.argsort(np.argsort(-probs[rows, exact], kind="stable"), kind="stable") / 5.0
        out[rows, 10] = np.argsort(np.argsort(probs[rows, not_match], kind="stable"), kind="stable") / 5.0
        likely = probs[rows, exact] > 0.5
        out[rows, 11] = likely.sum() - likely
        out[rows, 12] = np.log(len(rows))
    return out


def _logits(head: dict, x: np.ndarray) -> np.ndarray:
    z = (x - np.asarray(head["mean"])) / np.asarray(head["scale"])
    return z @ np.asarray(head["weights"]) + np.asarray(head["bias"])


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _fit(z: np.ndarray, gold: np.ndarray, n_labels: int, l2: float) -> tuple[np.ndarray, np.ndarray]:
    import torch
    import torch.nn.functional as F

    x, y = torch.tensor(z), torch.tensor(gold)
    weights = torch.zeros(z.shape[1], n_labels, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(n_labels, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights, bias], lr=0.5, max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(x @ weights + bias, y) + l2 * (weights ** 2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach().numpy(), bias.detach().numpy()


def fit_inputs(x: np.ndarray, gold: Sequence[int], keys: Sequence, labels: Sequence[str], *, l2: float = L2,
               folds: int = FOLDS) -> dict:
    """The regression of a group head on any inputs ``x`` (n, k) of pairs listed run by run: standardization,
    weights and bias fitted on everything, decision offsets for macro-F1 on out-of-fold predictions (folds of
    whole runs, by a hash of their key). ``scripts/eval_group_head.py`` fits other inputs with it."""
    from mgeo_index.training.calibrate import fit_decision_offsets

    gold = np.asarray(gold)
    mean, scale = x.mean(0), x.std(0) + 1e-6
    z = (x - mean) / scale
    fold = np.array([zlib.crc32(str(keys[rows[0]]).encode()) % folds for rows in runs(keys) for _ in rows])
    weights, bias = _fit(z, gold, len(labels), l2)
    held_out = _softmax(z @ weights + bias)  # a fold holding every group (tiny data) keeps the in-sample fit
    for k in range(folds):
        if (fold == k).any() and (fold != k).any():
            w, b = _fit(z[fold != k], gold[fold != k], len(labels), l2)
            held_out[fold == k] = _softmax(z[fold == k] @ w + b)
    offsets = fit_decision_offsets(held_out, gold, list(labels))
    nll = float(-np.log(np.clip(_softmax(z @ weights + bias)[np.arange(len(gold)), gold], 1e-12, 1)).mean())
    return {"mean": mean.tolist(), "scale": scale.tolist(), "weights": weights.tolist(), "bias": bias.tolist(),
            "decision_offsets": [float(o) for o in offsets], "calib_nll": round(nll, 4)}


def fit_group_head(probs: np.ndarray, gold: Sequence[int], keys: Sequence, labels: Sequence[str], *,
                   l2: float = L2, folds: int = FOLDS) -> dict:
    """A group head (a JSON-able dict) for the pairwise probabilities ``probs`` (columns in ``labels`` order),
    the gold label indices and the pairs' group keys, listed run by run."""
    fitted = fit_inputs(group_inputs(probs, keys, labels), gold, keys, labels, l2=l2, folds=folds)
    return {"labels": list(labels), **{k: fitted[k] for k in ("mean", "scale", "weights", "bias", "decision_offsets")},
            "l2": l2, "pairs": int(len(gold)), "groups": len(runs(keys)), "calib_nll": fitted["calib_nll"]}


def predict(head: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, decided label indices) of a fitted head (:func:`fit_inputs`) on its inputs ``x``."""
    out = _softmax(_logits(head, x))
    return out, np.argmax(np.log(np.clip(out, 1e-12, 1.0)) + np.asarray(head["decision_offsets"]), axis=1)


def group_decide(head: dict, probs: np.ndarray, keys: Sequence, labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, decided label indices) of the pairs judged within their groups; columns in ``labels``
    order (the head's own order is checked against it)."""
    if list(labels) != head["labels"]:
        raise ValueError(f"group head fitted for labels {head['labels']}, not {list(labels)}")
    if not len(probs):
        return np.asarray(probs, dtype=np.float32), np.empty(0, dtype=int)
    out, decided = predict(head, group_inputs(probs, keys, labels))
    return out.astype(np.float32), decided


def decide(cross, probs: np.ndarray, keys: Sequence | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, label indices) of scored pairs: within their groups (``keys``: each pair's first address,
    in file order) by ``cross``'s group head when it has one, else each pair alone (``cross.decide``)."""
    if keys is not None and getattr(cross, "group_head", None) is not None:
        return group_decide(cross.group_head, probs, keys, cross.labels)
    return probs, cross.decide(probs)
