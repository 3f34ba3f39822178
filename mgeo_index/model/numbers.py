"""The number policy: two addresses that write different numbers for the same element are not the same place.

A learned scorer reads near-identical strings as the same place (嘉州美都194栋 and 嘉州美都914栋 differ by one
swapped digit) and CCKS2021, its training data, is POI matching where numbers are often noisy. For a courier the
number is the door. So the decision does not leave it to the scorer:

- **strict** (default): when both sides write a road number, building, floor, unit or room and no number of one
  side agrees with the other's (:func:`mgeo_index.compare.conflicts.number_conflicts`: equal values, 88号院 ~ 88号, a range
  4-6号 holding 5号; Chinese and full-width numerals are digits after normalization), the pair's label is never
  ``exact_match``. Its probabilities are those of pairs with such a conflict: P(exact_match) is the share of
  ``exact_match`` among the conflicting pairs of the calibration split, or the scorer's where lower (label noise and
  POIs written with another number: 7 of 243 in CCKS), whatever the scorer says — the scorer reads a copy with one digit changed as the
  same place at p ≈ 0.99, which no calibration of its own output can undo. The rest is split between
  ``partial_match`` and ``not_match`` by the scorer's odds times a factor fitted by likelihood on the same pairs
  (:func:`mgeo_index.training.calibrate.fit_number_policy`): the label left, partial or not, is the scorer's
  call. Unit and room conflicts are handled the same way (the same building, another door), and so are two
  names that are two places (:func:`mgeo_index.compare.names.name_conflict`: 文明路564号顺丰窗帘 /
  文明路564号21世纪不动产 — at one door, the name decides).
- **loose**: the scorer alone, for catalogs whose numbers are unreliable (POI lists); the explanation still shows
  the conflict.

A number or a name written on one side only is not a conflict (建国路88号 ~ 建国路88号3号楼 is for the scorer to
judge). Ranking follows the adjusted probabilities: a candidate that conflicts falls below one that agrees.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mgeo_index.settings import NUMBER_MODES, check_numbers as check_mode  # noqa: F401  (check_mode: this module's name for it)

MODES = NUMBER_MODES
DEFAULT = NUMBER_MODES[0]  # strict
# A model calibrated before the policy existed: exact_match among the CCKS pairs that write a different number with
# the same unit on both sides (3.7% of 4,066), the scorer's partial / not odds as they are.
UNFITTED = {"exact_match": 0.037, "partial_vs_not": 0.0}


def conflicting(parsed_a: Sequence[dict], parsed_b: Sequence[dict], found: Sequence[dict] | None = None) -> np.ndarray:
    """Per pair of parses: whether they are two places by their numbers or their names
    (:func:`mgeo_index.compare.conflicts.conflicts`). ``found``: the pairs'
    :func:`~mgeo_index.compare.conflicts.number_conflicts`, when the caller has them."""
    from mgeo_index.compare.conflicts import conflicts_batch

    return np.array([bool(c) for c in conflicts_batch(parsed_a, parsed_b, found)], dtype=bool)


def conflict_probabilities(probs: np.ndarray, labels: Sequence[str], fitted: dict | None) -> np.ndarray:
    """The probabilities of conflicting pairs (rows of ``probs``, columns in ``labels`` order): P(exact_match) the
    fitted share, or the scorer's own where it is lower (a conflict is evidence against the same place, never for
    it: two unrelated places whose names differ keep the scorer's near-zero), the rest split by the scorer's
    partial / not odds times ``exp(partial_vs_not)``."""
    fitted = fitted or UNFITTED
    exact, partial, other = (labels.index(label) for label in ("exact_match", "partial_match", "not_match"))
    probs = np.asarray(probs, dtype=np.float64)
    odds = np.clip(probs[:, partial], 1e-12, None) * np.exp(fitted["partial_vs_not"])
    share = odds / (odds + np.clip(probs[:, other], 1e-12, None))
    same = np.minimum(probs[:, exact], fitted["exact_match"])
    out = np.empty_like(probs)
    out[:, exact] = same
    out[:, partial] = (1 - same) * share
    out[:, other] = (1 - same) * (1 - share)
    return out


def apply(cross, probs: np.ndarray, decided: np.ndarray, conflicts: np.ndarray, mode: str | None,
          offsets=None) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, label indices) with the policy applied to the ``conflicts`` rows (``mode`` strict); the
    other rows, and every row under loose, unchanged. ``offsets``: the decision offsets of the head that decided
    (default the cross-encoder's). The inputs are not modified."""
    conflicts = np.asarray(conflicts, dtype=bool)
    if check_mode(mode) == "loose" or not conflicts.any():
        return probs, decided
    probs, decided = np.array(probs), np.array(decided)  # copies, dtypes kept
    rows = np.flatnonzero(conflicts)
    adjusted = conflict_probabilities(probs[rows], cross.labels, getattr(cross, "number_policy", None))
    probs[rows] = adjusted
    offsets = offsets if offsets is not None else cross.decision_offsets or [0.0] * len(cross.labels)
    logp = np.log(np.clip(adjusted, 1e-12, 1.0)) + np.asarray(offsets)
    logp[:, cross.labels.index("exact_match")] = -np.inf  # never the same place
    decided[rows] = np.argmax(logp, axis=1)
    return probs, decided


def answer(cross, probs: np.ndarray, decided: np.ndarray, conflicts: np.ndarray | None, mode: str | None,
           offsets=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The label chain's end, one for ``match``, the API and ``resolve``: (calibrated probabilities with the policy
    applied — what ranking and fitting read —, the probabilities shown, labels). ``decided``: the labels of the
    head that scored (``offsets``: its decision offsets, default the cross-encoder's); ``conflicts``: the pairs
    whose numbers conflict (None: not read, as under loose). The label is the most probable class shown
    (:func:`mgeo_index.model.decision.shown`)."""
    from mgeo_index.model.decision import shown

    offsets = offsets if offsets is not None else cross.decision_offsets
    strict = conflicts is not None and check_mode(mode) == "strict"
    if strict:
        probs, decided = apply(cross, probs, decided, conflicts, mode, offsets)
    exact = cross.labels.index("exact_match")
    return probs, shown(probs, offsets, exact, np.asarray(conflicts, dtype=bool) if strict else None), decided


def share_exact(shown: np.ndarray, decided: np.ndarray, candidates: Sequence[dict], labels: Sequence[str]
                ) -> tuple[np.ndarray, np.ndarray]:
    """One answer's (probabilities, labels) with :func:`exclusive` applied to its entries labelled exact_match whose
    numbers or names conflict with each other (``candidates``: the entries' parses, in the answer's order);
    unchanged when none do."""
    from mgeo_index.compare.conflicts import conflicts

    exact = labels.index("exact_match")
    same = [i for i, d in enumerate(decided) if d == exact]
    if len(same) < 2:
        return shown, decided
    rivals = [[j for j in same if j != i and conflicts(candidates[i], candidates[j])] if i in same else []
              for i in range(len(candidates))]
    return exclusive(shown, rivals, labels) if any(rivals) else (shown, decided)


def exclusive(shown: np.ndarray, rivals: Sequence[Sequence[int]], labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """One answer's entries that conflict with each other cannot each be the place (1层 and B1层 of one tower, for a
    query that names neither): (probabilities, label indices) where each row's P(exact_match) is its share of the
    exact mass it competes for, p_i · p_i / (p_i + Σ p_j over its ``rivals``), what it gives up going to
    partial_match (the entries are related: one building, another floor), and the label the most probable class
    (a tie goes to partial_match). Rows without rivals keep theirs. ``shown``: the answer's shown probabilities,
    rows in ``labels`` order."""
    shown = np.array(shown, dtype=np.float64)
    exact, partial = labels.index("exact_match"), labels.index("partial_match")
    before = shown[:, exact].copy()
    for i, others in enumerate(rivals):
        if len(others):
            kept = before[i] * before[i] / (before[i] + before[list(others)].sum())
            shown[i, partial] += before[i] - kept
            shown[i, exact] = kept
    order = np.zeros(len(labels))
    order[partial] = 1e-12  # ties to partial_match
    return shown, np.argmax(shown + order, axis=1)
