"""Where reranking loses the gold: each query whose gold entry is not ranked first, by cause.

    python research/classify_misses.py --index-dir ccks-index --split dev [--profile accurate]

For every query of ``--split`` with a gold entry in the catalog (CCKS pairs file: its ``exact_match``
candidates): ``not in pool`` (hybrid retrieval's pool of 2 × top_k candidates holds no gold), ``cut`` (in the
pool, but the feature-head prescreen kept other candidates for the network), ``ranked below`` (scored, but
another candidate ranks first), split by what the first candidate was labelled and whether it is the same text
as the gold once normalized (the catalog listing one place twice: a label that looks wrong). Choices are made on
dev; holdout is for reporting.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from mgeo_index.measure.evaluate import gold_entry_ids, read_gold_queries
from mgeo_index.query.resolver import open_resolver
from mgeo_index.text import normalize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", type=Path, required=True)
    parser.add_argument("--pairs", type=Path, default=Path("../shared/data/pairs/ccks2021_train.tsv.gz"))
    parser.add_argument("--split", default="dev")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--examples", type=int, default=3, help="queries shown per cause")
    args = parser.parse_args()
    queries, golds = read_gold_queries(args.pairs, args.split)
    resolver = open_resolver(args.index_dir, device="cpu", profile=args.profile)
    gold_ids = gold_entry_ids(resolver, golds)
    causes: Counter[str] = Counter()
    examples: dict[str, list] = {}
    for query, gold, ids in zip(queries, golds, gold_ids):
        if not ids:
            continue
        pool = resolver.resolve([query], top_k=args.top_k * 2, rerank=False)[0]
        ranked = resolver.resolve([query], top_k=args.top_k)[0]
        if ranked and ranked[0]["id"] in ids:
            causes["first"] += 1
            continue
        if not any(m["id"] in ids for m in pool):
            cause = "not in pool"
        elif not any(m["id"] in ids for m in ranked):
            cause = "cut before the network"
        else:
            top = ranked[0]
            same = normalize(top["address"]) in {normalize(g) for g in gold}
            cause = f"ranked below a candidate labelled {top['label']}" + (" (same text as the gold)" if same else "")
        causes[cause] += 1
        if len(examples.setdefault(cause, [])) < args.examples:
            examples[cause].append({"query": query, "gold": gold[:2],
                                    "first": [ranked[0]["address"], ranked[0]["label"], ranked[0]["probability"]] if ranked else None,
                                    "gold_rank": next((i + 1 for i, m in enumerate(ranked) if m["id"] in ids), None)})
    total = sum(causes.values())
    print(json.dumps({"split": args.split, "profile": args.profile or "default", "queries": total,
                      "causes": {k: [v, round(v / total, 3)] for k, v in causes.most_common()},
                      "examples": examples}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
