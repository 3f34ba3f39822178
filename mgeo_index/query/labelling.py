"""The one labelling chain: how a batch of address pairs gets its probabilities and labels, for ``match``, the API,
``resolve``, the service and normalize jobs alike.

features (both sides parsed once) → the network and the stacked feature head, or a query's candidates judged
together by the group head → the decision (the head's offsets) → the number and name policy (a pair whose numbers
or names conflict is never ``exact_match``; :mod:`mgeo_index.model.numbers`) → within one query's candidates, the
entries labelled ``exact_match`` that conflict with each other share that mass. The label shown is always the most
probable class of the probabilities shown (:func:`mgeo_index.model.numbers.answer`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mgeo_index.model import group_head as group_heads
from mgeo_index.model import numbers as number_policy
from mgeo_index.runtime import inference


@dataclass(frozen=True)
class Labelled:
    """A batch's labelling, row by row in the pairs' order."""

    calibrated: np.ndarray  # (n, 3) calibrated probabilities, the policy applied: what ranking and fitting read
    shown: np.ndarray  # (n, 3) the probabilities an answer shows
    decided: np.ndarray  # (n,) label indices into cross.labels: the most probable class shown


def runs_of(firsts: Sequence[str]) -> list[int]:
    """The lengths of the runs of consecutive pairs with the same first side (a query's candidates, as ``match``
    reads a file of pairs)."""
    sizes: list[int] = []
    for i, first in enumerate(firsts):
        if i and first == firsts[i - 1]:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def label_pairs(cross, firsts: Sequence[str], seconds: Sequence[str], parsed_firsts: Sequence[dict] | None,
                parsed_seconds: Sequence[dict] | None, *, numbers: str | None = None, device: str | None = None,
                features: np.ndarray | None = None, runs: Sequence[int] | None = None,
                group_head: bool = False, settled: np.ndarray | None = None,
                found: Sequence[dict] | None = None) -> Labelled:
    """Label the pairs (``firsts[i]``, ``seconds[i]``) of :func:`mgeo_index.text.model_text` texts with ``cross``.

    ``parsed_*``: both sides' parses (needed under the strict number policy); ``features``: the stacked scorer's
    pair features when the caller has them (:func:`mgeo_index.query.features.pair_features_batch`); ``numbers``: the
    number policy (strict by default). ``runs``: the sizes of consecutive runs of pairs that are one query's
    candidates (None: every pair on its own): under the strict policy the exact matches that conflict with each
    other within a run share that mass, and with ``group_head`` the model's group head (where it has one) judges
    each run's candidates together. ``settled``: pairs left to the feature-only scorer
    (:func:`mgeo_index.runtime.inference.score_pairs`; not with ``group_head``). ``found``: the pairs'
    :func:`~mgeo_index.query.features.number_conflicts` when the caller has them (computed for its features)."""
    strict = number_policy.check_mode(numbers) == "strict"
    offsets = None  # the deciding head's decision offsets: the cross-encoder's, or the group head's
    if group_head and cross.group_head is not None:
        probs, decided = group_heads.score_groups(cross, firsts, seconds, features=features, device=device)
        offsets = cross.group_head.decision_offsets
    else:
        probs = inference.score_pairs(cross, firsts, seconds, device=device, features=features, settled=settled)
        decided = cross.decide(probs)
    conflicts = number_policy.conflicting(parsed_firsts, parsed_seconds, found) if strict and len(firsts) else None
    probs, shown, decided = number_policy.answer(cross, probs, decided, conflicts, numbers, offsets)
    if strict and runs is not None:
        start = 0
        for size in runs:
            stop = start + size
            shown[start:stop], decided[start:stop] = number_policy.share_exact(
                shown[start:stop], decided[start:stop], parsed_seconds[start:stop], cross.labels)
            start = stop
    return Labelled(probs, shown, decided)
