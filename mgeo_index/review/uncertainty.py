"""How much a person's label on an item would teach the model: the review queue's order.

An item is a query with its ranked candidates (or, in a simulation, a single pair). It is uncertain
when the decision could easily go the other way: the best two candidates' P(exact_match) are close,
or the best candidate's two most probable labels are. Ties are broken by how much the network and the
feature head disagree on the best candidate (total variation distance of their label probabilities).
"""
from __future__ import annotations

import numpy as np

from mgeo_index.settings import LABELS

EXACT = LABELS.index("exact_match")


def margin(probabilities: np.ndarray) -> float:
    """Smallest of: P(exact) of the best candidate minus the second's (rows in ranked order), and the best
    candidate's top label probability minus its second. ``probabilities``: (candidates, 3); 0 ≤ margin ≤ 1,
    small means unsure; an item without candidates gets 1 (nothing to decide)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.size == 0:
        return 1.0
    top = np.sort(p[0])[::-1]
    out = float(top[0] - top[1])
    if len(p) > 1:
        exact = np.sort(p[:, EXACT])[::-1]
        out = min(out, float(exact[0] - exact[1]))
    return out


def disagreement(network: np.ndarray | None, features: np.ndarray | None) -> float:
    """Total variation distance between the network's and the feature head's label probabilities of one
    pair (0: they agree; 1: they put all their mass on different labels); 0 when either is missing."""
    if network is None or features is None:
        return 0.0
    return float(0.5 * np.abs(np.asarray(network, dtype=np.float64) - np.asarray(features, dtype=np.float64)).sum())
