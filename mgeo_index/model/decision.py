"""How a cross-encoder turns scores into labels, in NumPy: the stacked scorer's combination, the cascade's gate and
the decision offsets. Shared by the torch :class:`~mgeo_index.model.cross_encoder.CrossEncoder` and the NumPy one
of :mod:`mgeo_index.model.numpy_backend`. Each supplies its feature head's logits and its softmax (reductions,
whose order is each framework's own); the elementwise steps here give the same bits in either."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The cascade leaves a pair to the network when its feature-only P(exact_match) is at least this, whatever the
# gate's confidence: candidates that might be ranked first keep the network's finer P(exact_match). Chosen on the
# 1,812 CCKS train + calibration queries (research/eval_cascade.py), as the largest cap that changed no reranked
# rank 1 against the network on every pair: 0.05 / 0.04 / 0.035 / 0.03 changed 4 / 2 / 1 / 0 of them, the network
# scoring 50 / 54 / 56 / 58% of the pairs. (Dev, 306 queries: 3 / 2 / 2 / 0.) A gate may carry its own ``max_exact``.
GATE_MAX_EXACT = 0.03


def decide(probs: np.ndarray, offsets: Sequence[float]) -> np.ndarray:
    """The label maximizing log P + its decision offset."""
    return np.argmax(np.log(np.clip(probs, 1e-12, 1.0)) + np.asarray(offsets), axis=1)


def shown(probs: np.ndarray, offsets: Sequence[float] | None, exact: int, kept: np.ndarray | None = None) -> np.ndarray:
    """The probabilities an answer shows: the calibrated ``probs`` with the decision ``offsets`` folded in,
    softmax(log P + offsets), so that the label (:func:`decide`: the argmax of the same sum) is always the most
    probable class shown, and no other class's probability exceeds the label's. The offsets weigh the classes as
    the decision does (``exact_match`` up: it is the rare class macro-F1 asks to find), so the shown probabilities
    are calibrated under that weighting, not under the data's own mix; the calibration error of what is shown is
    measured in docs/models.md. ``kept`` rows (the number policy's conflicts) keep their P(exact_match) — the
    fitted share of exact_match among conflicting pairs, never the label — and share the rest by the same
    weighting. Float64 (n, 3), rows summing to 1."""
    probs = np.asarray(probs, dtype=np.float64)
    if offsets is None or not len(probs):
        return probs
    weighted = np.clip(probs, 1e-12, 1.0) * np.exp(np.asarray(offsets, dtype=np.float64))
    out = weighted / weighted.sum(axis=1, keepdims=True)
    if kept is not None and np.any(kept):
        rows = np.flatnonzero(kept)
        rest = weighted[rows].copy()
        rest[:, exact] = 0.0
        share = np.minimum(probs[rows, exact], 0.25)  # below any label's share of the rest
        out[rows] = rest / rest.sum(axis=1, keepdims=True) * (1.0 - share)[:, None]
        out[rows, exact] = share
    return out


class Scoring:
    """The label logic of a cross-encoder with ``labels``, ``stack``, ``gate``, ``decision_offsets`` and a feature
    head; float32 arrays in and out. Subclasses define ``head_logits(features) -> (B, 3)`` and
    ``_softmax(logits, temperature)``."""

    labels: tuple[str, ...]
    stack: dict | None
    gate: dict | None
    decision_offsets: list[float] | None
    _group_head = None
    _group_head_loader = None  # set by mgeo_index.model.group_head.attach: reads the head on first use

    @property
    def group_head(self):
        """The group head (:mod:`mgeo_index.model.group_head`), read from its file on first use: its 6 boosters'
        5,400 trees take 0.1 s (a 2-core EPYC), which resolving, serving and pair-by-pair scoring never need."""
        if self._group_head_loader is not None:
            self._group_head, self._group_head_loader = self._group_head_loader(), None
        return self._group_head

    @group_head.setter
    def group_head(self, head) -> None:
        self._group_head, self._group_head_loader = head, None

    def decide(self, probs: np.ndarray) -> np.ndarray:
        """Label index (in ``self.labels`` order) for each row of probabilities."""
        probs = np.asarray(probs, dtype=np.float64).reshape(-1, len(self.labels))
        return decide(probs, self.decision_offsets or [0.0] * len(self.labels))

    @property
    def uses_network(self) -> bool:
        """False for a stacked scorer whose calibration gave the network no weight (``alpha`` 0): the
        transformer is then never run and the feature head scores alone."""
        return self.stack is None or self.stack["alpha"] != 0.0

    def probabilities(self, logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
        """Row softmax of ``logits / temperature`` (float32)."""
        return self._softmax(np.asarray(logits, dtype=np.float32), temperature)

    def feature_logits(self, features: np.ndarray) -> np.ndarray:
        """``beta · feature_head + bias``: the stacked scorer without its network term (cheap: the
        resolver prescreens its candidate pool with it before running the network)."""
        return _affine(self.stack["beta"], self.head_logits(features), self.stack["bias"])

    def gate_probabilities(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(calibrated feature-only probabilities (B, 3), whether each pair is decided without the network).

        Per pair, from its features alone: the same answer whatever it is batched with."""
        probs = self._softmax(_affine(self.gate["beta"], self.head_logits(features), self.gate["bias"]), 1.0)
        decided = self.decide(probs)
        sure = probs[np.arange(len(probs)), decided] >= self.gate["min_probability"]
        allowed = [self.labels.index(label) for label in self.gate.get("labels", self.labels)]
        # a pair that could still be the answer (feature-only P(exact_match) above GATE_MAX_EXACT) goes to the
        # network: candidates competing for rank 1 are ordered by its finer P(exact_match)
        unlikely = probs[:, self.labels.index("exact_match")] < self.gate.get("max_exact", GATE_MAX_EXACT)
        return probs, sure & np.isin(decided, allowed) & unlikely

    def stacked_logits(self, logits: np.ndarray, first: list[str], second: list[str],
                       features: np.ndarray | None = None) -> np.ndarray:
        """Combine network logits (B, 3) with the feature head's logits for the same pairs
        (``features``: their :func:`~mgeo_index.compare.features.pair_features_batch`, when already computed)."""
        from mgeo_index.compare.features import pair_features_batch

        if features is None:
            features = pair_features_batch(first, second)
        return np.float32(self.stack["alpha"]) * np.asarray(logits, dtype=np.float32) + self.feature_logits(features)


def _affine(scale: float, x: np.ndarray, bias: Sequence[float]) -> np.ndarray:
    """``scale · x + bias`` in float32, rounded after each step (as torch's scalar product and sum)."""
    return np.float32(scale) * np.asarray(x, dtype=np.float32) + np.asarray(bias, dtype=np.float32)
