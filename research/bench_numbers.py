"""The number policy's cost and effect: match pairs/s (3,000 CCKS dev pairs, in process) and one-query resolve
p50 / p99 of whichever mgeo_index is on the path, and with --recall the reranked recall@1 / @10 of the CCKS dev
queries under each policy. Run it with an earlier release on PYTHONPATH beside this one for a side-by-side ratio
(docs/numbers.md).

    mgeo-index build ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --index-dir ccks-idx --address-column text
    python research/bench_numbers.py --index-dir ccks-idx --recall
"""
import argparse
import inspect
import json
import statistics
import time
from pathlib import Path

import numpy as np

from mgeo_index.measure.evaluate import gold_entry_ids, read_gold_queries
from mgeo_index.query.match import score_sides
from mgeo_index.query.resolver import open_resolver
from mgeo_index.text import model_text
from mgeo_index.training import data

ap = argparse.ArgumentParser()
ap.add_argument("--index-dir", type=Path, required=True)
ap.add_argument("--data", type=Path, default=Path("../shared/data"))
ap.add_argument("--pairs", type=int, default=3000)
ap.add_argument("--queries", type=int, default=200)
ap.add_argument("--recall", action="store_true")
ap.add_argument("--profile", default=None, help="default or accurate (the cross-encoder that reranks)")
args = ap.parse_args()
ex = data.split_examples(data.ccks_pairs(args.data), "dev")[: args.pairs]
a, b = [model_text(x) for x, _, _ in ex], [model_text(y) for _, y, _ in ex]
resolver = open_resolver(args.index_dir, device="cpu", **({"profile": args.profile} if args.profile else {}))
cross = resolver.cross
score_sides(cross, a[:200], b[:200], grouped=True)  # warm-up
started = time.perf_counter()
score_sides(cross, a, b, grouped=True)
match_s = time.perf_counter() - started
queries, golds = read_gold_queries(args.data / "pairs" / "ccks2021_train.tsv.gz", "dev")
resolver.resolve(queries[:5])
times = []
for q in queries[: args.queries]:
    started = time.perf_counter()
    resolver.resolve([q])
    times.append((time.perf_counter() - started) * 1000)
out = {"module": inspect.getfile(score_sides), "profile": getattr(resolver, "profile", "default"), "match_pairs_per_s": round(len(a) / match_s, 1),
       "resolve_p50_ms": round(statistics.median(times), 2), "resolve_p99_ms": round(float(np.percentile(times, 99)), 2)}
if args.recall:
    gold = gold_entry_ids(resolver, golds)
    keep = [i for i, g in enumerate(gold) if g]
    for mode in ("strict", "loose"):
        results = resolver.resolve([queries[i] for i in keep], top_k=10, numbers=mode)
        r1 = np.mean([bool(res) and res[0]["id"] in gold[i] for i, res in zip(keep, results)])
        r10 = np.mean([any(m["id"] in gold[i] for m in res[:10]) for i, res in zip(keep, results)])
        out[f"recall_{mode}"] = {"queries": len(keep), "recall@1": round(float(r1), 4), "recall@10": round(float(r10), 4)}
print(json.dumps(out))
