"""Calibration of a trained cross-encoder: temperature, the feature head and its stacking with the
network (or the feature head alone), and the label decision offsets.

`mgeo-index train` ends with :func:`calibrate`; :func:`mgeo_index.training.recalibrate.recalibrate` runs it again
on an existing cross-encoder, the group head and the number policy with it (``scripts/recalibrate.py``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mgeo_index.query import labelling
from mgeo_index.compare.features import FEATURE_NAMES, pair_features_batch
from mgeo_index.model.cross_encoder import GATE_MAX_EXACT, CrossEncoder, FeatureHead, average_heads, load_cross_encoder
from mgeo_index.settings import LABELS
from mgeo_index.text import normalize
from mgeo_index.training import data
from mgeo_index.training.loops import class_weights


def fit_temperature(logits: np.ndarray, gold: np.ndarray) -> float:
    """Temperature minimizing the negative log-likelihood (golden-section search on log T)."""
    logits_t = torch.tensor(logits, dtype=torch.float64)
    gold_t = torch.tensor(gold)

    def nll(log_t: float) -> float:
        return float(F.cross_entropy(logits_t / math.exp(log_t), gold_t))

    lo, hi = math.log(0.05), math.log(20.0)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if nll(a) < nll(b):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


def pair_logits(cross: CrossEncoder, examples) -> np.ndarray:
    """The network's logits (temperature 1, no feature head) for (a, b, gold) examples."""
    saved, cross.temperature = cross.temperature, 1.0
    probs = labelling.score_pairs(cross, [normalize(a) for a, _, _ in examples], [normalize(b) for _, b, _ in examples])
    cross.temperature = saved
    return np.log(np.clip(probs, 1e-12, None))  # log-softmax = logits up to a per-row constant


def train_feature_head(x: torch.Tensor, y: torch.Tensor, *, epochs: int = 6, seed: int = 0,
                       head: FeatureHead | None = None, lr: float = 3e-3) -> FeatureHead:
    """The feature-only scorer on (pair features, LABELS index) of the train split (features are
    deterministic: no leakage). Few epochs: on CCKS calib the NLL is lowest at 4–12 and rises after.
    ``head``: train this one further (in place) instead of a new one."""
    torch.manual_seed(seed)
    weights = class_weights(y.tolist())
    head = (head or FeatureHead(x.shape[1])).train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=generator).split(256):
            loss = F.cross_entropy(head(x[idx]), y[idx], weight=weights)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return head.eval()


def _features_of(examples) -> torch.Tensor:
    return torch.from_numpy(pair_features_batch([normalize(a) for a, _, _ in examples], [normalize(b) for _, b, _ in examples]))


def column_stack(params: torch.Tensor, columns) -> torch.Tensor:
    """The logits columns (each (n, 3)) combined with :func:`fit_column_stack`'s parameters: one weight per column,
    then a bias per label."""
    return sum(w * c for w, c in zip(params, columns)) + params[len(columns):]


def fit_column_stack(columns, gold, *, max_iter: int = 300) -> torch.Tensor:
    """One weight per logits column (each (n, 3)) and a bias per label, starting from weights 1 and biases 0,
    minimizing the NLL of ``gold`` (L-BFGS): the stacked scorer's combination, for any number of columns.
    Returns the fitted parameters: the weights, then the biases."""
    columns = [torch.as_tensor(c, dtype=torch.float64) for c in columns]
    target = torch.as_tensor(gold)
    params = torch.zeros(len(columns) + columns[0].shape[1], dtype=torch.float64)
    params[: len(columns)] = 1.0
    params.requires_grad_(True)
    optimizer = torch.optim.LBFGS([params], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(column_stack(params, columns), target)
        loss.backward()
        return loss

    optimizer.step(closure)
    return params.detach()


def fit_stack(network_logits: np.ndarray, feature_logits: np.ndarray, gold: np.ndarray) -> dict:
    """alpha, beta, per-class bias minimizing NLL of alpha·network + beta·features + bias (L-BFGS)."""
    alpha, beta, *bias = fit_column_stack([network_logits, feature_logits], gold, max_iter=200).tolist()
    return {"alpha": alpha, "beta": beta, "bias": bias, "features": list(FEATURE_NAMES)}


def calibrate(cross: CrossEncoder, pairs: list[data.Pair], decision_pairs: list[data.Pair], *, seed: int = 0,
              heads: int = 5, head: str = "mlp", head_pairs: list[data.Pair] | None = None) -> dict:
    """Temperature of the network alone, the stacked scorer, and the feature head alone, on the calibration
    split of ``pairs``; keep whichever fits calib best (:func:`choose_scorer`: the network must earn its
    running time).

    The feature head, trained on the train split of ``head_pairs`` (default ``pairs``): the average of
    ``heads`` MLP seeds (``head="mlp"``, shipped; one seed's dev macro-F1 varies by ±0.01, their mean less)
    or gradient-boosted trees (``"trees"``, :mod:`~mgeo_index.model.tree_head`: measured, not shipped).
    Then the label decision offsets, fitted for macro-F1 on the calibration split of ``decision_pairs`` (the
    three-way CCKS pairs: the binary Shenzhen pairs have no partial class). The group head, which stacks on what
    this fits, is :func:`mgeo_index.training.group.fit_group_head`'s (called after this by :func:`mgeo_index.training.recalibrate.recalibrate` and
    ``mgeo-index train``).
    """
    from mgeo_index.model.tree_head import train_tree_head
    from mgeo_index.text.parser import parser_version

    if head not in ("trees", "mlp"):
        raise ValueError(f"head must be 'trees' or 'mlp', not {head!r}")
    train = data.split_examples(head_pairs if head_pairs is not None else pairs, "train")
    calib = data.split_examples(pairs, "calib")
    gold = np.array([g for *_, g in calib])
    cross.feature_head = cross.stack = cross.gate = None
    cross.temperature = 1.0
    network_logits = pair_logits(cross, calib)
    temperature = fit_temperature(network_logits, gold)
    x_train, x_calib = _features_of(train), _features_of(calib)
    y_train = torch.tensor([g for *_, g in train])
    if head == "trees":
        feature_head = train_tree_head(x_train.numpy(), y_train.numpy(), seed=seed)
    else:
        feature_head = average_heads([train_feature_head(x_train, y_train, seed=s) for s in range(seed, seed + heads)])
    with torch.inference_mode():
        feature_logits = feature_head(x_calib).double().numpy()
    head_nll = float(F.cross_entropy(torch.tensor(feature_logits), torch.tensor(gold)))
    stack = fit_stack(network_logits, feature_logits, gold) | {"parser": parser_version()}
    # the feature head alone: the same fit with the network's logits left out (alpha 0)
    features_only = fit_stack(np.zeros_like(network_logits), feature_logits, gold) | {"alpha": 0.0, "parser": parser_version()}
    nll = {
        "network": float(F.cross_entropy(torch.tensor(network_logits / temperature), torch.tensor(gold))),
        "stacked": _stack_nll(stack, network_logits, feature_logits, gold),
        "features": _stack_nll(features_only, network_logits, feature_logits, gold),
    }
    scorer = choose_scorer(nll)
    cross.temperature = temperature
    if scorer != "network":
        cross.feature_head, cross.stack = feature_head, stack if scorer == "stacked" else features_only
    fit_decision(cross, data.split_examples(decision_pairs, "calib"))
    gate = fit_gate(cross, stack, features_only, network_logits, feature_logits, gold) if scorer == "stacked" else None
    return {"gate": gate, "temperature": temperature, "calibration_pairs": len(calib), "head_training_pairs": len(train),
            "calib_nll_network": nll["network"], "calib_nll_feature_head": head_nll, "feature_head": head,
            "feature_heads": heads if head == "mlp" else feature_head.trees, "calib_nll_stacked": nll["stacked"],
            "calib_nll_features_only": nll["features"], "scorer": scorer,
            "stack": {k: v for k, v in (cross.stack or stack).items() if k != "features"},
            "decision_offsets": dict(zip(cross.labels, cross.decision_offsets))}


# The cascade keeps the stacked scorer's label on at least this share of the calibration pairs (0.995 cost 2 of 306
# CCKS dev queries their reranked rank 1).
GATE_AGREEMENT = 0.998
# Labels the feature-only scorer may decide alone. Only clear not-matches: a pair that may be the answer
# keeps the network's finer P(exact_match), which orders the candidates (letting every label through kept
# 99.5% of labels but cost 0.026 of CCKS dev reranked recall@1).
GATE_LABELS = ("not_match",)


def fit_gate(cross: CrossEncoder, stack: dict, features_only: dict, network_logits: np.ndarray,
             feature_logits: np.ndarray, gold: np.ndarray, *, agreement: float = GATE_AGREEMENT,
             labels: tuple[str, ...] = GATE_LABELS) -> dict:
    """The cascade's threshold: the lowest feature-only confidence at which a pair's label may be taken
    from the feature-only scorer (calibrated alone: ``features_only``) without running the network, such
    that the labels of at least ``agreement`` of the calibration pairs stay what the stacked scorer
    (network + features) says. Sets ``cross.gate``; returns the figures it was chosen on."""
    from mgeo_index.measure.metrics import classification_report

    def probs_of(params: dict, net: np.ndarray) -> np.ndarray:
        logits = params["alpha"] * net + params["beta"] * feature_logits + np.array(params["bias"])
        return torch.softmax(torch.tensor(logits), dim=1).numpy()

    full = probs_of(stack, network_logits)
    alone = probs_of(features_only, np.zeros_like(network_logits))
    full_labels, alone_labels = cross.decide(full), cross.decide(alone)
    allowed = np.isin(alone_labels, [cross.labels.index(label) for label in labels])
    allowed &= alone[:, cross.labels.index("exact_match")] < GATE_MAX_EXACT  # as CrossEncoder.gate_probabilities
    confidence = np.where(allowed, alone[np.arange(len(alone)), alone_labels], 0.0)
    threshold = 1.0
    for candidate in np.arange(0.5, 1.0, 0.0025):
        gated = np.where(confidence >= candidate, alone_labels, full_labels)
        if np.mean(gated == full_labels) >= agreement:
            threshold = float(round(candidate, 4))
            break
    skipped = confidence >= threshold
    gated = np.where(skipped, alone_labels, full_labels)
    gold_labels = np.array([cross.labels.index(LABELS[g]) for g in gold])
    cross.gate = {"beta": features_only["beta"], "bias": features_only["bias"], "min_probability": threshold,
                  "labels": list(labels), "max_exact": GATE_MAX_EXACT}
    return {"min_probability": threshold, "skipped_share": float(skipped.mean()),
            "label_agreement": float(np.mean(gated == full_labels)),
            "calib_macro_f1_stacked": classification_report(gold_labels, full_labels, cross.labels)["macro_f1"],
            "calib_macro_f1_gated": classification_report(gold_labels, gated, cross.labels)["macro_f1"]}


# Calib NLL (nats) the transformer must save over the feature head alone to be run at all: it is
# nearly all of a pair's scoring time.
NETWORK_MIN_GAIN = 0.005


def choose_scorer(nll: dict[str, float]) -> str:
    """"network" (alone, temperature-scaled), "stacked" (network + feature head) or "features" (the
    feature head alone, alpha 0: the network is never run), by calibration NLL."""
    if nll["network"] < min(nll["stacked"], nll["features"]):
        return "network"
    return "stacked" if nll["stacked"] <= nll["features"] - NETWORK_MIN_GAIN else "features"


def _stack_nll(stack: dict, network_logits: np.ndarray, feature_logits: np.ndarray, gold: np.ndarray) -> float:
    combined = stack["alpha"] * network_logits + stack["beta"] * feature_logits + np.array(stack["bias"])
    return float(F.cross_entropy(torch.tensor(combined), torch.tensor(gold)))


def fit_decision_offsets(probs: np.ndarray, gold: np.ndarray, labels, grid=np.arange(-1.0, 2.001, 0.1)) -> list[float]:
    """Per-label offsets (``not_match`` fixed at 0) maximizing macro-F1 of argmax(log p + offsets).

    Grid search on held-out pairs; ties go to the smallest change. ``gold`` in ``labels`` order.
    """
    from mgeo_index.measure.metrics import classification_report

    logp = np.log(np.clip(probs, 1e-12, 1.0))
    exact, partial = labels.index("exact_match"), labels.index("partial_match")
    best = (-1.0, 0.0, [0.0] * len(labels))
    for a in grid:
        for b in grid:
            offsets = [0.0] * len(labels)
            offsets[exact], offsets[partial] = round(float(a), 3) + 0.0, round(float(b), 3) + 0.0  # no -0.0
            f1 = classification_report(gold, np.argmax(logp + offsets, 1), labels)["macro_f1"]
            if (f1, -abs(a) - abs(b)) > best[:2]:
                best = (f1, -abs(a) - abs(b), offsets)
    return best[2]


def fit_decision(cross: CrossEncoder, examples: list[tuple[str, str, int]]) -> None:
    """Set ``cross.decision_offsets`` (each pair alone) from held-out (a, b, LABELS index) examples."""
    probs = labelling.score_pairs(cross, [normalize(a) for a, _, _ in examples], [normalize(b) for _, b, _ in examples])
    gold = np.array([cross.labels.index(LABELS[g]) for *_, g in examples])
    cross.decision_offsets = fit_decision_offsets(probs, gold, cross.labels)


def fit_number_policy(cross: CrossEncoder, examples: list[tuple[str, str, int]]) -> dict:
    """Set ``cross.number_policy`` (:mod:`mgeo_index.model.numbers`) from the pairs of held-out (a, b, LABELS
    index) ``examples`` whose numbers conflict: P(exact_match) their share of ``exact_match`` (add-one smoothed),
    and the factor on the scorer's partial / not odds (as :func:`mgeo_index.query.match.score_sides` gives them pair by
    pair under ``loose``) by likelihood on those labelled partial or not. With fewer than 50 conflicting pairs
    the policy keeps its defaults (``cross.number_policy`` None). Returns what was fitted, on how many pairs."""
    from mgeo_index.compare.features import parse_distinct
    from mgeo_index.query.match import score_sides
    from mgeo_index.model import numbers

    a, b = [normalize(x) for x, _, _ in examples], [normalize(y) for _, y, _ in examples]
    parsed = parse_distinct(a + b)
    rows = np.flatnonzero(numbers.conflicting(parsed[: len(a)], parsed[len(a):]))
    if len(rows) < 50:
        cross.number_policy = None
        return {"conflicting_pairs": int(len(rows)), "policy": None}
    gold = np.array([cross.labels.index(LABELS[examples[i][2]]) for i in rows])
    probs, _, _ = score_sides(cross, [a[i] for i in rows], [b[i] for i in rows], numbers="loose", calibrated=True)
    partial, other = cross.labels.index("partial_match"), cross.labels.index("not_match")
    two = np.isin(gold, (partial, other))
    log_odds = torch.tensor(np.log(np.clip(probs[two, partial], 1e-12, None)) - np.log(np.clip(probs[two, other], 1e-12, None)))
    is_partial = torch.tensor((gold[two] == partial).astype(np.float64))
    shift = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([shift], max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(log_odds + shift, is_partial)
        loss.backward()
        return loss

    optimizer.step(closure)
    exact = (int((gold == cross.labels.index("exact_match")).sum()) + 1) / (len(rows) + 2)
    cross.number_policy = {"exact_match": round(exact, 4), "partial_vs_not": round(float(shift.detach()), 4), "pairs": int(len(rows))}
    before = numbers.conflict_probabilities(probs, cross.labels, None)
    after = numbers.conflict_probabilities(probs, cross.labels, cross.number_policy)

    def nll(p: np.ndarray) -> float:
        return float(-np.mean(np.log(np.clip(p[np.arange(len(gold)), gold], 1e-12, None))))

    return {"conflicting_pairs": int(len(rows)), "policy": cross.number_policy,
            "gold": {label: int((gold == i).sum()) for i, label in enumerate(cross.labels)},
            "nll_scorer": nll(probs), "nll_unfitted_policy": nll(before), "nll_fitted_policy": nll(after)}


def refit_number_policy(cross_dir: Path, data_dir: Path) -> dict:
    """:func:`fit_number_policy` on the CCKS calibration split for the cross-encoder in ``cross_dir``, written into
    its manifest alone (weights, heads and the rest of the calibration untouched)."""
    from mgeo_index.model.cross_encoder import KIND
    from mgeo_index.model.manifest import read_manifest, write_manifest

    cross = load_cross_encoder(cross_dir)
    stats = fit_number_policy(cross, data.split_examples(data.ccks_pairs(data_dir), "calib"))
    manifest = {k: v for k, v in read_manifest(cross_dir, KIND).items() if k not in ("versions", "number_policy")}
    write_manifest(cross_dir, manifest | ({"number_policy": cross.number_policy} if cross.number_policy else {}))
    return stats
