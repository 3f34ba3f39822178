"""What the cascade's cap on feature-only P(exact_match) does to the reranked rank 1: the gate must leave
each query's first answer where the network on every pair puts it.

For each split of the CCKS pairs file, every query is resolved once with the network on every pair
(``cross.gate`` off) and once per cap in ``--caps`` (``cross.gate["max_exact"]``, which
:meth:`CrossEncoder.gate_probabilities` honours over ``GATE_MAX_EXACT``); printed per split and cap: reranked
recall@1 both ways, how many queries' rank 1 moved, and the share of pairs the network scored. Choose the cap on
the train and calibration splits; read dev only to confirm.

    mgeo-index build ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --index-dir /tmp/ccks-index
    OMP_NUM_THREADS=1 python research/eval_cascade.py --index-dir /tmp/ccks-index --splits train calib dev
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from mgeo_index.measure.evaluate import gold_entry_ids, read_gold_queries
from mgeo_index.query.resolver import open_resolver

from eval_network_depth import answers  # beside this script


def first_answers(resolver, queries: list[str]) -> list[int | None]:
    """Each query's reranked rank-1 entry id (None: no candidate)."""
    return [matches[0]["id"] if matches else None for matches in answers(resolver, queries)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index-dir", required=True)
    parser.add_argument("--pairs", default="../shared/data/pairs/ccks2021_train.tsv.gz")
    parser.add_argument("--splits", nargs="+", default=["train", "calib", "dev"])
    parser.add_argument("--caps", nargs="+", type=float, default=[0.05, 0.04, 0.035, 0.03, 0.02])
    args = parser.parse_args()

    resolver = open_resolver(args.index_dir)
    cross = resolver.cross
    if cross is None or cross.gate is None:
        raise SystemExit(f"{args.index_dir}: its cross-encoder has no gate (or MGEO_INDEX_CASCADE=0): nothing to measure")
    gate, gate_probabilities = dict(cross.gate), cross.gate_probabilities
    tally = {"pairs": 0, "network": 0}

    def counted(features):  # the pairs the gate leaves to the network, counted as the resolver asks
        probs, decided = gate_probabilities(features)
        tally["pairs"] += len(decided)
        tally["network"] += int((~decided).sum())
        return probs, decided

    cross.gate_probabilities = counted
    for split in args.splits:
        queries, golds = read_gold_queries(args.pairs, split)
        gold = gold_entry_ids(resolver, golds)
        keep = [i for i, found in enumerate(gold) if found]
        queries, gold = [queries[i] for i in keep], [gold[i] for i in keep]
        cross.gate = None
        full = first_answers(resolver, queries)
        row = {"queries": len(queries), "recall@1_network_on_every_pair": round(float(np.mean([a in g for a, g in zip(full, gold)])), 4)}
        for cap in args.caps:
            cross.gate = {**gate, "max_exact": cap}
            tally.update(pairs=0, network=0)
            gated = first_answers(resolver, queries)
            row[f"cap {cap}"] = {"recall@1": round(float(np.mean([a in g for a, g in zip(gated, gold)])), 4),
                                 "rank_1_moved": sum(a != b for a, b in zip(full, gated)),
                                 "network_share": round(tally["network"] / max(tally["pairs"], 1), 3)}
        print(json.dumps({split: row}, ensure_ascii=False), flush=True)
    cross.gate = gate


if __name__ == "__main__":
    main()
