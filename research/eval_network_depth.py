"""How few of a query's candidates the cross-encoder's network must judge: ``resolve`` with the network limited to
the NETWORK_DEPTH most promising candidates of each pool (by the feature head's P(exact_match) plus the retrieval
share, the prescreen's key) within NETWORK_GAP of the best one, the others keeping their feature-only
probabilities, against the network on all RERANK_DEPTH of them.

For each split of the CCKS pairs file and each setting of ``--depths`` × ``--gaps`` (× ``--caps``, the cascade's
cap on feature-only P(exact_match), :data:`mgeo_index.model.decision.GATE_MAX_EXACT`), printed as JSON lines: the
network's pairs per query, reranked recall@1 / @10 of the queries whose gold entry is in the catalog, and, over
every distinct query of the split, how many rank-1 answers, rank-1 labels and normalize statuses (matched /
ambiguous / unmatched, :func:`mgeo_index.jobs.policy.decide`) differ from the network on every candidate. Choose on
train and calib; read dev to confirm, holdout once at the end.

    mgeo-index build ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --index-dir /tmp/ccks-index
    OMP_NUM_THREADS=1 python research/eval_network_depth.py --index-dir /tmp/ccks-index --splits train calib dev
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import numpy as np

from mgeo_index.jobs.policy import Policy, decide
from mgeo_index.measure.evaluate import gold_entry_ids, read_gold_queries
from mgeo_index.measure.splits import split_of
from mgeo_index.query import resolver as resolver_module
from mgeo_index.query.resolver import open_resolver
from mgeo_index.query import labelling
from mgeo_index.training import data

CHUNK = 256


def answers(resolver, queries: list[str]) -> list[list[dict]]:
    """Each query's reranked top 10 (``resolve``'s answers, reviewers' confirmations left out), in chunks of CHUNK."""
    out = []
    for start in range(0, len(queries), CHUNK):
        out += resolver.resolve(queries[start:start + CHUNK], top_k=10, rerank=True, confirmed=False)
    return out


def compare(reference: list[list[dict]], got: list[list[dict]], gold: dict[int, set[int]], resamples: int = 2000) -> dict:
    first = lambda ms: ms[0]["id"] if ms else None  # noqa: E731
    label = lambda ms: ms[0]["label"] if ms else None  # noqa: E731
    status = lambda ms: decide(ms, Policy())["status"]  # noqa: E731
    found = [next((r for r, m in enumerate(got[i]) if m["id"] in g), None) for i, g in gold.items()]
    was = [next((r for r, m in enumerate(reference[i]) if m["id"] in g), None) for i, g in gold.items()]
    # the change in recall@1 against the network on every candidate, paired over queries: a 95% bootstrap interval
    delta = np.array([(f == 0) - (w == 0) for f, w in zip(found, was)], dtype=float)
    draws = np.random.default_rng(0).integers(0, len(delta), (resamples, len(delta))) if len(delta) else None
    interval = np.percentile(delta[draws].mean(axis=1), [2.5, 97.5]).round(4).tolist() if draws is not None else None
    return {
        "recall@1": round(float(np.mean([f == 0 for f in found])), 4) if found else None,
        "recall@10": round(float(np.mean([f is not None for f in found])), 4) if found else None,
        "recall@1_change_95": interval,
        "rank1_moved": sum(first(a) != first(b) for a, b in zip(reference, got)),
        "rank1_label_moved": sum(label(a) != label(b) for a, b in zip(reference, got)),
        "status_moved": sum(status(a) != status(b) for a, b in zip(reference, got)),
        "top10_set_moved": sum({m["id"] for m in a} != {m["id"] for m in b} for a, b in zip(reference, got)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index-dir", required=True)
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--splits", nargs="+", default=["train", "calib", "dev"])
    parser.add_argument("--depths", nargs="+", type=int, default=[10, 5, 3, 2, 1])
    parser.add_argument("--gaps", nargs="+", type=float, default=[math.inf, 0.6, 0.4, 0.3, 0.2])
    parser.add_argument("--caps", nargs="+", type=float, default=[0.0],
                        help="the cascade's cap on feature-only P(exact_match) (its gate's max_exact; 0: as shipped)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many distinct queries a split (0: all)")
    parser.add_argument("--pairs", help="another labelled file (Shenzhen's): its queries with a gold entry, split by "
                                        "the same hash, over an index of its catalog")
    args = parser.parse_args()

    resolver = open_resolver(args.index_dir)
    gate = dict(resolver.cross.gate or {})
    counted = {"pairs": 0}
    network = labelling._network_probabilities

    def counting(cross, queries, candidates, features, **run):
        counted["pairs"] += len(queries)
        return network(cross, queries, candidates, features, **run)

    labelling._network_probabilities = counting
    pairs = data.ccks_pairs(Path(args.data)) if not args.pairs else []
    for split in args.splits:
        gold_queries, golds = read_gold_queries(args.pairs or f"{args.data}/pairs/ccks2021_train.tsv.gz", split)
        queries = list(dict.fromkeys(p.a for p in pairs if split_of(p.group) == split)) or gold_queries
        if args.limit:
            queries = queries[: args.limit]
        at = {q: i for i, q in enumerate(queries)}
        gold = {at[q]: g for q, g in zip(gold_queries, gold_entry_ids(resolver, golds)) if g and q in at}
        reference = None
        for depth, gap, cap in itertools.product(args.depths, args.gaps, args.caps):
            if depth != args.depths[0] and gap != args.gaps[0] and depth == 1:
                continue  # one candidate: the gap changes nothing more
            resolver_module.NETWORK_DEPTH, resolver_module.NETWORK_GAP = depth, gap
            if gate:
                resolver.cross.gate = {**gate, "max_exact": cap} if cap else gate
            counted["pairs"] = 0
            got = answers(resolver, queries)
            reference = reference if reference is not None else got
            print(json.dumps({"split": split, "queries": len(queries), "gold_queries": len(gold), "depth": depth,
                              "gap": gap, "cap": cap or None, "network_pairs_per_query": round(counted["pairs"] / len(queries), 3),
                              **compare(reference, got, gold)}), flush=True)


if __name__ == "__main__":
    main()
