"""The one labelling chain: how a batch of address pairs gets its probabilities and labels, for ``match``, the API,
``resolve``, the service and normalize jobs alike.

features (both sides parsed once) → the network and the stacked feature head (:func:`score_pairs`: the cascade's
gate settles the pairs its feature-only scorer is sure of, the network — :mod:`mgeo_index.runtime.inference`, the
batcher — judges the others), or a query's candidates judged together by the group head → the decision (the
head's offsets) → the number and name policy (a pair whose numbers or names conflict is never ``exact_match``;
:mod:`mgeo_index.model.numbers`) → within one query's candidates, the entries labelled ``exact_match`` that
conflict with each other share that mass. The label shown is always the most probable class of the probabilities
shown (:func:`mgeo_index.model.numbers.answer`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mgeo_index.model import group_head as group_heads
from mgeo_index.model import numbers as number_policy
from mgeo_index.compare.features import pair_features_batch
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
    pair features when the caller has them (:func:`mgeo_index.compare.features.pair_features_batch`); ``numbers``: the
    number policy (strict by default). ``runs``: the sizes of consecutive runs of pairs that are one query's
    candidates (None: every pair on its own): under the strict policy the exact matches that conflict with each
    other within a run share that mass, and with ``group_head`` the model's group head (where it has one) judges
    each run's candidates together. ``settled``: pairs left to the feature-only scorer
    (:func:`score_pairs`; not with ``group_head``). ``found``: the pairs'
    :func:`~mgeo_index.compare.conflicts.number_conflicts` when the caller has them (computed for its features)."""
    strict = number_policy.check_mode(numbers) == "strict"
    offsets = None  # the deciding head's decision offsets: the cross-encoder's, or the group head's
    if group_head and cross.group_head is not None:
        probs, decided = group_heads.score_groups(cross, firsts, seconds, features=features, device=device)
        offsets = cross.group_head.decision_offsets
    else:
        probs = score_pairs(cross, firsts, seconds, device=device, features=features, settled=settled)
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


def score_pairs(
    cross,
    queries: Sequence[str],
    candidates: Sequence[str],
    *,
    device: str | None = None,
    precision: str | None = None,
    max_tokens: int | None = None,
    max_batch: int = 512,
    on_batch: Callable[[int], None] | None = None,
    features: np.ndarray | None = None,
    settled: np.ndarray | None = None,
) -> np.ndarray:
    """Label probabilities (n, 3) for (query, candidate) pairs, columns in ``cross.labels`` order.

    ``features``: the pairs' :func:`~mgeo_index.compare.features.pair_features_batch` rows, if the caller has them
    (a stacked cross-encoder needs them; computed here otherwise). ``settled``: a mask of pairs the caller has no
    use for the network's finer opinion on (``resolve``'s candidates far behind a query's best): with a cascade
    they keep the feature-only probabilities as the pairs its gate decides do; without one it is ignored."""
    if len(queries) != len(candidates):
        raise ValueError(f"{len(queries)} queries but {len(candidates)} candidates")
    if not queries:
        return np.empty((0, len(cross.labels)), dtype=np.float32)
    stacked = getattr(cross, "feature_head", None) is not None
    if stacked and not cross.uses_network:  # the feature head alone: the transformer has no weight
        zeros = np.zeros((len(queries), len(cross.labels)), dtype=np.float32)
        logits = cross.stacked_logits(zeros, list(queries), list(candidates), features)
        if on_batch is not None:
            on_batch(len(queries))
        return cross.probabilities(logits)
    run = dict(device=device, precision=precision, max_tokens=max_tokens, max_batch=max_batch, on_batch=on_batch)
    if stacked and getattr(cross, "gate", None) is not None:
        # the cascade: pairs the feature-only scorer decides clearly keep its probabilities; the network
        # scores the others
        if features is None:
            features = pair_features_batch(list(queries), list(candidates))
        out, decided = cross.gate_probabilities(features)
        if settled is not None:
            decided = decided | np.asarray(settled, dtype=bool)
        rest = np.flatnonzero(~decided)
        if on_batch is not None and len(rest) < len(queries):
            on_batch(len(queries) - len(rest))
        if len(rest):
            out[rest] = _network_probabilities(cross, [queries[i] for i in rest], [candidates[i] for i in rest],
                                               features[rest], **run)
        return out
    return _network_probabilities(cross, list(queries), list(candidates), features, **run)


def _network_probabilities(cross, queries: list[str], candidates: list[str], features: np.ndarray | None,
                           **run) -> np.ndarray:
    """The network's probabilities, stacked with the feature head when the model has one."""
    stacked = getattr(cross, "feature_head", None) is not None
    # plain model: softmax on the device; stacked: raw logits, combined with the features below
    out = inference.pair_outputs(cross, queries, candidates, output="logits" if stacked else "probabilities", **run)
    if stacked:
        out = cross.probabilities(cross.stacked_logits(out, list(queries), list(candidates), features))
    return out


def component_logits(cross, queries: Sequence[str], candidates: Sequence[str], *, device: str | None = None,
                     features: np.ndarray | None = None) -> list[np.ndarray]:
    """The raw logits a stacked cross-encoder combines, each (n, 3): the network's (:func:`network_logits`), then
    its feature head's when it has one (``features``: the pairs' pair_features_batch rows, computed if None)."""
    network = inference.network_logits(cross, queries, candidates, device=device)
    if getattr(cross, "feature_head", None) is None:
        return [network]
    if features is None:
        features = pair_features_batch(list(queries), list(candidates))
    return [network, cross.head_logits(features)]


def component_probabilities(cross, queries: Sequence[str], candidates: Sequence[str], *, device: str | None = None,
                            features: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The two opinions a stacked cross-encoder combines, each calibrated on its own: the network alone
    (softmax of its logits at the fitted temperature) and the feature head alone (the cascade's
    feature-only fit, else ``beta · head + bias``); (n, 3) each, the second None without a feature head.
    The review queue orders items by how much these disagree."""
    network = cross.probabilities(inference.network_logits(cross, queries, candidates, device=device), cross.temperature)
    if getattr(cross, "feature_head", None) is None:
        return network, None
    if features is None:
        features = pair_features_batch(list(queries), list(candidates))
    if getattr(cross, "gate", None) is not None:
        return network, cross.gate_probabilities(features)[0]
    return network, cross.probabilities(cross.feature_logits(features))
