"""Group context: the labels of a query's candidates decided together, where a file lists them.

Where a file lists a query's candidates one after another (CCKS-style pair files: ``mgeo-index match``,
``mgeo-index eval pairs``), how a candidate compares with the query's other candidates says more about its
label than the pair alone does: the best of the lot is likelier the exact match, and near-duplicate
candidates tend to share a label. The group head:

1. describes each pair within its run (:func:`group_features`): its pair features
   (:data:`mgeo_index.compare.features.FEATURE_NAMES`), their difference to the best and to the mean of the run's
   candidates, whether it is the run's best on each, log(run length), and how alike its candidate is to the
   run's other candidates (character 2-gram Jaccard: the largest, the mean, how many above 0.6);
2. scores that with gradient-boosted trees (LightGBM trains them: :func:`train_booster`, on the train split of every
   labelled pair file, weighted by source; NumPy evaluates them: :class:`~mgeo_index.model.forest.Forest`, the raw
   scores of :data:`SEEDS` boosters averaged);
3. stacks the trees' logits with the network's and the feature head's (one weight per column, a bias per
   label: :func:`mgeo_index.training.calibrate.fit_column_stack`) on held-out splits;
4. decides the label with per-label offsets fitted there for macro-F1 on CCKS round-2 pairs.

It is fitted by ``scripts/recalibrate.py`` (:func:`mgeo_index.training.group.fit_group_head`); the trees are
``group_head.safetensors`` beside the model, the rest its manifest's ``group_head``. Ranking is untouched:
``resolve`` orders and labels its candidates with the pairwise scorer (a retrieval pool is another context than
a file's hand-listed candidates). The shipped head's stack and offsets are fitted on the calibration and dev
splits (:data:`mgeo_index.training.group.SHIPPED_HELD_OUT`), so its figures are out-of-fold ones
(``research/eval_group_head.py``).

Where the head carries a gate (:class:`GroupGate`: a second stack, of the trees and the feature head alone,
fitted on the same held-out pairs), a pair that stack calls clearly not ``exact_match`` keeps its network-free
probabilities, and the network runs on the other pairs only (docs/benchmarks.md: how many, at what quality). A
run's answers depend on its own pairs only: the trees and the gate judge row by row, the network is
batch-independent, so the same run gets the same answers whatever file, chunk or batch it is in.
"""
from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from mgeo_index import settings
from mgeo_index.model.decision import GATE_MAX_EXACT, decide
from mgeo_index.model.boosters import balanced_weights, lightgbm, predict_threads
from mgeo_index.model.forest import Forest, ForestError

GROUP_HEAD = "group_head.safetensors"  # the boosters' trees as arrays (mgeo_index.model.forest.STORED)
# what model folders held before: the boosters' LightGBM model texts, one after another, gzipped; still read
LIGHTGBM_TEXTS = "group_head.lgb.txt.gz"
ROUNDS = 300
# boosters averaged: three boosters' trees moved 5-fold round-2 macro-F1 by about ±0.005–0.01 between seed sets
# (0.717 / 0.723 for seeds 0-2 / 3-5, 0.736 / 0.717 with the leaves below): six cut it by about √2
SEEDS = 6
_NEXT_BOOSTER = "\n# mgeo-index: next booster\n"
PARAMS = {
    "objective": "multiclass", "num_class": 3, "learning_rate": 0.05, "num_leaves": 63, "min_data_in_leaf": 10,
    "feature_fraction": 0.5, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0, "verbose": -1,
    "deterministic": True,
}
SIMILAR = 0.6  # 2-gram Jaccard above which two candidates count as near-duplicates


def runs(keys: Sequence) -> list[np.ndarray]:
    """Row indices of each run of consecutive equal ``keys`` (a query's candidates), in order."""
    out, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            out.append(np.arange(start, i))
            start = i
    return out


def _bigrams(text: str) -> set[str]:
    return {text[i : i + 2] for i in range(len(text) - 1)}


def group_features(features: np.ndarray, candidates: Sequence[str], keys: Sequence) -> np.ndarray:
    """(n, 4·F + 4) float32: each pair's features (F = ``features.shape[1]``), their difference to the run's
    best and to its mean, whether the pair is the run's best on each, log(run length), and its candidate's
    largest and mean 2-gram Jaccard to the run's other candidates and how many of those exceed
    :data:`SIMILAR`. A pair alone is a run of one (no context: zeros, ones for "best")."""
    f = np.asarray(features, dtype=np.float64)
    width = f.shape[1] if f.ndim == 2 else 0
    out = np.zeros((len(f), 4 * width + 4), dtype=np.float64)
    for rows in runs(keys):
        x = f[rows]
        best = x.max(0)
        grams = [_bigrams(candidates[i]) for i in rows]
        similar = np.zeros((len(rows), 3))
        for j in range(len(rows)):
            sims = [len(grams[j] & grams[k]) / max(len(grams[j] | grams[k]), 1) for k in range(len(rows)) if k != j]
            if sims:
                similar[j] = (max(sims), sum(sims) / len(sims), sum(s > SIMILAR for s in sims))
        out[rows] = np.hstack([x, x - best, x - x.mean(0), x >= best, np.full((len(rows), 1), np.log(len(rows))),
                               similar])
    return out.astype(np.float32)


def train_booster(x: np.ndarray, gold: np.ndarray, weight: np.ndarray, *, seed: int = 0, rounds: int = ROUNDS,
                  threads: int = 0, params: dict | None = None):
    """LightGBM trees on group features → 3 raw scores; each row weighted by ``weight`` times its class's
    inverse frequency (``exact_match`` is rare). ``params``: LightGBM parameters over :data:`PARAMS` (research)."""
    lgb = lightgbm()
    gold = np.asarray(gold, dtype=np.int64)
    data = lgb.Dataset(np.ascontiguousarray(x, dtype=np.float32), gold, weight=np.asarray(weight) * balanced_weights(gold))
    return lgb.train(PARAMS | (params or {}) | {"seed": seed, "num_threads": threads}, data, num_boost_round=rounds)


def stacked_probabilities(weights: Sequence[float], bias: Sequence[float], columns: Sequence[np.ndarray]) -> np.ndarray:
    """softmax(Σ weight · logits column + bias): the stack of the trees', the network's and the feature head's logits."""
    logits = sum(w * np.asarray(c, dtype=np.float64) for w, c in zip(weights, columns)) + np.asarray(bias)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def settles(probs: np.ndarray, offsets: Sequence[float], exact: int, max_exact: float,
            min_probability: float) -> np.ndarray:
    """The gate's rule on network-free probabilities: the label (``offsets``) is not ``exact``, P(exact) is under
    ``max_exact`` and the label's probability is at least ``min_probability``."""
    label = decide(probs, offsets)
    sure = probs[np.arange(len(probs)), label] >= min_probability
    return sure & (label != exact) & (probs[:, exact] < max_exact)


@dataclass(frozen=True)
class GroupGate:
    """Which pairs the group head labels without the network: the stack of the trees' and the feature head's
    logits alone (``weights``, ``bias``); a pair is settled where that stack's label (the head's offsets) is not
    ``exact_match``, its P(exact_match) is under ``max_exact`` and its label's probability is at least
    ``min_probability`` (the lowest that keeps the full stack's label on ``stats["agreement"]`` of the fitting
    pairs: :func:`mgeo_index.training.group.fit_group_gate`)."""

    weights: list[float]  # the trees, the feature head
    bias: list[float]  # per label
    min_probability: float
    max_exact: float = GATE_MAX_EXACT
    stats: dict = field(default_factory=dict)  # what it was fitted on (recorded in the manifest)

    def judge(self, trees: np.ndarray, feature_head: np.ndarray, offsets: Sequence[float],
              exact: int) -> tuple[np.ndarray, np.ndarray]:
        """(network-free probabilities (n, 3), whether each pair is settled by them), row by row."""
        probs = stacked_probabilities(self.weights, self.bias, [trees, feature_head])
        return probs, settles(probs, offsets, exact, self.max_exact, self.min_probability)

    def manifest(self) -> dict:
        return {"weights": self.weights, "bias": self.bias, "min_probability": self.min_probability,
                "max_exact": self.max_exact, **self.stats}

    @classmethod
    def from_manifest(cls, entry: dict) -> GroupGate:
        named = ("weights", "bias", "min_probability", "max_exact")
        return cls(list(entry["weights"]), list(entry["bias"]), float(entry["min_probability"]),
                   float(entry["max_exact"]), {k: v for k, v in entry.items() if k not in named})


@dataclass
class GroupHead:
    forest: Forest  # the boosters' trees over group_features, their raw scores averaged
    weights: list[float]  # per logits column: the trees, the network, the feature head (when the model has one)
    bias: list[float]  # per label
    decision_offsets: list[float]  # per label
    labels: list[str]
    stats: dict = field(default_factory=dict)  # what it was fitted on (recorded in the manifest)
    gate: GroupGate | None = None  # the pairs labelled without the network (None: the network judges every pair)

    def tree_logits(self, x: np.ndarray) -> np.ndarray:
        if not len(x):
            return np.empty((0, len(self.labels)))
        return self.forest.raw_scores(x, threads=predict_threads()).reshape(len(x), len(self.labels))

    def probabilities(self, x: np.ndarray, columns: Sequence[np.ndarray]) -> np.ndarray:
        """Label probabilities from group features ``x`` and the other logits ``columns`` (network, feature
        head), each (n, 3) in ``labels`` order."""
        return stacked_probabilities(self.weights, self.bias, [self.tree_logits(x), *columns])

    def decide(self, probs: np.ndarray) -> np.ndarray:
        return decide(probs, self.decision_offsets)

    def manifest(self) -> dict:
        return {"kind": "trees", "file": GROUP_HEAD, "labels": self.labels, "weights": self.weights, "bias": self.bias,
                "decision_offsets": self.decision_offsets, "inputs": self.forest.inputs,
                "boosters": self.forest.boosters, **self.stats,
                **({"gate": self.gate.manifest()} if self.gate is not None else {})}

    def save(self, directory: str | Path) -> None:
        self.forest.save(Path(directory) / GROUP_HEAD)


def check_group_head(directory: str | Path, entry: dict, labels: Sequence[str], n_features: int) -> None:
    """Refuse (ModelError, naming the refit) a group head of an earlier kind, without its file, or fitted for other
    labels or features than this version's."""
    from mgeo_index.model.manifest import ModelError

    refit = f"refit it: python scripts/recalibrate.py --model {directory} --decision-only"
    if entry.get("kind") != "trees" or entry.get("file") not in (GROUP_HEAD, LIGHTGBM_TEXTS) \
            or not (Path(directory) / entry["file"]).exists():
        raise ModelError(f"{directory}: its group head is of an earlier kind (or its {entry.get('file', GROUP_HEAD)} is "
                         f"missing); {refit}")
    if entry["labels"] != list(labels):
        raise ModelError(f"{directory}: its group head was fitted for labels {entry['labels']}, not {list(labels)}; {refit}")
    if entry["inputs"] != 4 * n_features + 4:
        raise ModelError(f"{directory}: its group head reads {entry['inputs']} inputs, this version computes "
                         f"{4 * n_features + 4}; {refit}")


def load_group_head(directory: str | Path, entry: dict, labels: Sequence[str], n_features: int) -> GroupHead:
    """The group head of a model folder from its manifest ``entry`` (:func:`check_group_head` first)."""
    from mgeo_index.model.manifest import ModelError

    check_group_head(directory, entry, labels, n_features)
    path = Path(directory) / entry["file"]
    try:
        if entry["file"] == LIGHTGBM_TEXTS:
            forest = Forest.from_texts(gzip.decompress(path.read_bytes()).decode("utf-8").split(_NEXT_BOOSTER))
        else:
            forest = Forest.load(path)
    except (ForestError, OSError, ValueError) as exc:
        raise ModelError(f"{path}: its trees cannot be read ({exc}); refit them: python scripts/recalibrate.py "
                         f"--model {directory} --decision-only") from exc
    stats = {k: v for k, v in entry.items()
             if k not in ("kind", "file", "labels", "weights", "bias", "decision_offsets", "inputs", "boosters", "gate")}
    gate = GroupGate.from_manifest(entry["gate"]) if entry.get("gate") else None
    return GroupHead(forest, list(entry["weights"]), list(entry["bias"]), list(entry["decision_offsets"]),
                     list(entry["labels"]), stats, gate)


def attach(cross, directory: str | Path, entry: dict) -> None:
    """Give ``cross`` (a cross-encoder of either backend) the group head of its folder from its manifest ``entry``:
    refused now (:func:`check_group_head`), read when first used (``cross.group_head``)."""
    from mgeo_index.compare.features import FEATURE_NAMES

    check_group_head(directory, entry, cross.labels, len(FEATURE_NAMES))
    cross._group_head_loader = partial(load_group_head, directory, entry, list(cross.labels), len(FEATURE_NAMES))


def score_groups(cross, queries: Sequence[str], candidates: Sequence[str], *, features: np.ndarray | None = None,
                 device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities (n, 3) in ``cross.labels`` order, decided label indices) of pairs listed run by run (a
    run: consecutive pairs with the same query), by ``cross``'s group head; the network runs on the pairs its
    gate does not settle (on every pair with ``MGEO_INDEX_CASCADE=0``)."""
    from mgeo_index.runtime import inference
    from mgeo_index.compare.features import pair_features_batch

    head: GroupHead = cross.group_head
    n = len(queries)
    if not n:
        return np.empty((0, len(cross.labels)), dtype=np.float32), np.empty(0, dtype=int)
    if features is None:
        features = pair_features_batch(list(queries), list(candidates))
    trees = head.tree_logits(group_features(features, candidates, queries))
    feature_head = [cross.head_logits(features)] if getattr(cross, "feature_head", None) is not None else []
    settled = np.zeros(n, dtype=bool)
    if head.gate is not None and feature_head and settings.cascade():
        free, settled = head.gate.judge(trees, feature_head[0], head.decision_offsets, cross.labels.index("exact_match"))
    network = np.zeros((n, len(cross.labels)), dtype=np.float32)
    judged = np.flatnonzero(~settled)
    if len(judged):
        network[judged] = inference.network_logits(cross, [queries[i] for i in judged],
                                                   [candidates[i] for i in judged], device=device)
    probs = stacked_probabilities(head.weights, head.bias, [trees, network, *feature_head])
    if settled.any():
        probs[settled] = free[settled]
    return probs.astype(np.float32), head.decide(probs)
