"""How much of the network an *exact* bound-based rerank could skip: measured, not built.

The stacked scorer's logits are ``alpha · network + beta · head + bias``; with the network's logits inside a box
(their range over the pairs below, widened by ``--widen``), each pair's P(exact_match) has a lower and an upper
bound from its features alone. A rerank that must return the same top ``k`` with the same probabilities has to
run the network on every pair whose upper bound reaches the k-th best known value (pairs the cascade's gate
decides alone are known without it). This counts those pairs in ``resolve``'s own pools (the candidates its
prescreen gives the network) for CCKS dev queries over an index of the CCKS catalog.

    mgeo-index build ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --index-dir ccks-index
    OMP_NUM_THREADS=1 python research/eval_rerank_bound.py --index-dir ccks-index --queries 400
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from scipy.special import softmax

from mgeo_index import AddressIndex
from mgeo_index.runtime import inference
from mgeo_index.query import labelling
from mgeo_index.model import group_head
from mgeo_index.measure.splits import split_of
from mgeo_index.training import data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--queries", type=int, default=400)
    args = parser.parse_args()
    queries = list(dict.fromkeys(p.a for p in data.ccks_pairs(args.data) if split_of(p.group) == "dev"))[: args.queries]
    seen = []  # (queries, candidates, features) of each scoring call resolve makes
    score_pairs = labelling.score_pairs

    def spy(cross, firsts, seconds, **kw):
        seen.append((list(firsts), list(seconds), kw.get("features")))
        return score_pairs(cross, firsts, seconds, **kw)

    labelling.score_pairs = spy
    with AddressIndex.open(args.index_dir) as idx:
        idx.resolve(queries, top_k=10)
        cross = idx._resolver.cross
    labelling.score_pairs = score_pairs
    firsts = [q for call in seen for q in call[0]]
    seconds = [c for call in seen for c in call[1]]
    features = np.vstack([call[2] for call in seen])
    pools = group_head.runs(firsts)  # a query's pool: consecutive pairs with the same query text
    network = inference._run(cross, cross.tokenizer, firsts, seconds, max_length=cross.max_length,
                             output="logits", device="cpu", precision=None, max_tokens=None,
                             max_batch=512, on_batch=None).astype(np.float64)
    x = features
    head = cross.feature_logits(x).astype(np.float64)
    alpha = cross.stack["alpha"]
    gate_probs, gated = cross.gate_probabilities(x)
    exact = cross.labels.index("exact_match")
    others = [i for i in range(len(cross.labels)) if i != exact]
    truth = np.where(gated, gate_probs[:, exact], softmax(alpha * network + head, axis=1)[:, exact])
    print(f"{len(pools)} queries, {len(firsts)} pairs given to the scorer, {gated.mean():.1%} decided by the gate, "
          f"network weight {alpha:.3f}")
    for widen in (0.0, 1.0):
        lo, hi = network.min(0) - widen, network.max(0) + widen
        up, down = head.copy(), head.copy()
        up[:, exact] += alpha * hi[exact]
        down[:, exact] += alpha * lo[exact]
        for o in others:
            up[:, o] += alpha * lo[o]
            down[:, o] += alpha * hi[o]
        upper = np.where(gated, gate_probs[:, exact], softmax(up, axis=1)[:, exact])
        lower = np.where(gated, gate_probs[:, exact], softmax(down, axis=1)[:, exact])
        for k in (1, 3):
            needed = 0
            for rows in pools:
                start, stop = rows[0], rows[-1] + 1
                known = gated[start:stop].copy()
                while True:
                    values = np.where(known, truth[start:stop], lower[start:stop])
                    kth = np.sort(values)[-min(k, len(values))]
                    must = ~known & (upper[start:stop] >= kth)
                    if not must.any():
                        break
                    known |= must
                needed += int((known & ~gated[start:stop]).sum())
            print(f"box widened by {widen}: exact top {k} needs the network on {needed} of {int((~gated).sum())} "
                  f"pairs the gate leaves to it ({needed / max(int((~gated).sum()), 1):.0%})")


if __name__ == "__main__":
    main()
