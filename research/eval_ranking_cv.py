"""Reranked retrieval over 2,118 CCKS queries instead of 306, for choosing between parsers.

The dev split has 306 CCKS queries whose gold is in the catalog (calibration: 108), so a parser change that
moves 4 of them first or out of first place cannot be told from noise. The feature head, which carries most of
the ranking (``resolve``'s key is P(exact_match) + ½·fused retrieval score, and the stack weighs the head's logits
about 4× the network's), is trained on the train split's labelled pairs; here it is **cross-fitted**: the 1,704
train-split queries are cut into 5 folds by their normalized text, and each fold's pools are scored by a head
trained without that fold's pairs (train-split pairs of other queries, Shenzhen's included), so every one of the
2,118 queries is ranked by a head that never saw its labels. (The network is the shipped one for every parser:
its logits are in-sample on train-split queries, alike for the parsers compared.) The stack is fitted on the
calibration split as ``calibrate`` does, and the ranking is ``resolve``'s: the pool of 20 (retrieved with the
parser whose index is given), cut to 10 by the feature-only prior, ordered by the stacked P(exact) + ½·fused.

    mgeo-index build ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --index-dir ccks-index
    OMP_NUM_THREADS=1 python research/eval_ranking_cv.py --index-dir ccks-index --seeds 5
    OMP_NUM_THREADS=1 python research/eval_ranking_cv.py --index-dir ccks-index --retrieval-weights 0.3 0.5 0.7

Run it with the parser to be measured installed (``mgeo_index/text/tagger/``): the index's stored parses,
the pairs' features and the heads all come from it.
"""
from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import numpy as np
import torch

from mgeo_index.query import resolver as resolving
from mgeo_index.query import labelling
from mgeo_index.measure.evaluate import gold_entry_ids, read_gold_queries
from mgeo_index.model.cross_encoder import average_heads
from mgeo_index.model.group_head import stacked_probabilities
from mgeo_index.model.loading import load_cross
from mgeo_index.text import normalize
from mgeo_index.text.parser import parser_version
from mgeo_index.training import data
from mgeo_index.training.calibrate import _features_of, fit_stack, pair_logits, train_feature_head

FOLDS = 5


def pools_of(index_dir: Path, pairs_file: Path) -> dict:
    """Every CCKS query with its gold in the catalog: resolve's pool of 20 with the network's logits on all of
    them, the pairs' features and fused retrieval scores, and which candidates are gold."""
    res = resolving.open_resolver(index_dir)
    queries, golds, splits = [], [], []
    for split in ("train", "calib", "dev"):
        qs, gs = read_gold_queries(pairs_file, split)
        queries, golds, splits = queries + qs, golds + gs, splits + [split] * len(qs)
    gold_sets = gold_entry_ids(res, golds)
    keep = [i for i, found in enumerate(gold_sets) if found]
    queries, gold_sets, splits = [queries[i] for i in keep], [gold_sets[i] for i in keep], [splits[i] for i in keep]
    seen: dict = {}
    score_pairs, rerank = labelling.score_pairs, resolving.Resolver._rerank

    def scoring(cross, firsts, seconds, *, features=None, **kw):  # the pairs resolve scores, and their parts
        seen["net"], _ = labelling.component_logits(cross, firsts, seconds, features=features)
        seen["features"] = features
        return score_pairs(cross, firsts, seconds, features=features, **kw)

    def reranking(self, normalized, results, depth, parsed, numbers):
        seen["pools"] = [[(c.id, c.fused) for c in matches] for matches in results]
        rerank(self, normalized, results, depth, parsed, numbers)

    out: dict[str, list] = {"query": [], "fused": [], "gold": [], "net": [], "features": []}
    labelling.score_pairs, resolving.Resolver._rerank = scoring, reranking
    try:
        for start in range(0, len(queries), 128):
            res.resolve(queries[start : start + 128], top_k=10, rerank_depth=20)  # the network on the whole pool
            for k, pool in enumerate(seen["pools"]):
                out["query"] += [start + k] * len(pool)
                out["fused"] += [fused for _, fused in pool]
                out["gold"] += [i in gold_sets[start + k] for i, _ in pool]
            out["net"].append(seen["net"])
            out["features"].append(seen["features"])
    finally:
        labelling.score_pairs, resolving.Resolver._rerank = score_pairs, rerank
    return {"query": np.array(out["query"]), "fused": np.array(out["fused"]), "gold": np.array(out["gold"]),
            "net": np.concatenate(out["net"]), "features": np.concatenate(out["features"]),
            "texts": queries, "splits": np.array(splits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", type=Path, required=True, help="an index of the CCKS catalog built with this parser")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seeds", type=int, default=5, help="MLP heads averaged, as calibrate does (5)")
    parser.add_argument("--retrieval-weights", type=float, nargs="+", default=[resolving.RETRIEVAL_WEIGHT],
                        help="the share of the fused retrieval score in the prescreen and the ranking key, each "
                             "measured (resolver.RETRIEVAL_WEIGHT by default)")
    args = parser.parse_args()
    pools = pools_of(args.index_dir, args.data / "pairs" / "ccks2021_train.tsv.gz")
    ccks = data.ccks_pairs(args.data)
    pairs = ccks + data.shenzhen_pairs(args.data)
    train, calib = data.split_examples(pairs, "train"), data.split_examples(pairs, "calib")
    x_train, y_train = _features_of(train), torch.tensor([g for *_, g in train])
    fold = lambda text: zlib.crc32(normalize(text).encode()) % FOLDS  # noqa: E731
    pair_fold = torch.tensor([fold(a) for a, _, _ in train])

    def head(rows: torch.Tensor):
        return average_heads([train_feature_head(x_train[rows], y_train[rows], seed=s) for s in range(args.seeds)])

    features = torch.from_numpy(pools["features"])
    query, splits = pools["query"], pools["splits"]
    query_fold = np.array([fold(t) for t in pools["texts"]])
    full = head(torch.ones(len(train), dtype=torch.bool))
    with torch.inference_mode():
        head_logits = full(features).double().numpy()
        calib_head = full(_features_of(calib)).double().numpy()
    for f in range(FOLDS):
        fitted = head(pair_fold != f)
        rows = np.where((splits[query] == "train") & (query_fold[query] == f))[0]
        with torch.inference_mode():
            head_logits[rows] = fitted(features[rows]).double().numpy()
    cross = load_cross()
    cross.feature_head = cross.stack = None
    stack = fit_stack(pair_logits(cross, calib), calib_head, np.array([g for *_, g in calib]))
    exact = cross.labels.index("exact_match")
    alpha, beta, bias = stack["alpha"], stack["beta"], stack["bias"]
    report = {"parser": parser_version(), "seeds": args.seeds, "stack": {k: stack[k] for k in ("alpha", "beta", "bias")}}
    exact_prior = stacked_probabilities([beta], bias, [head_logits])[:, exact]
    exact_stacked = stacked_probabilities([alpha, beta], bias, [pools["net"], head_logits])[:, exact]
    for weight in args.retrieval_weights:
        prior = exact_prior + weight * pools["fused"]
        key = exact_stacked + weight * pools["fused"]
        first = {}
        for k in range(len(pools["texts"])):
            rows = np.where(query == k)[0]
            if len(rows) > resolving.RERANK_DEPTH:  # the prescreen: the feature-only prior keeps 10 for the network
                rows = np.sort(rows[np.argsort(-prior[rows], kind="stable")[: resolving.RERANK_DEPTH]])
            hits = np.where(pools["gold"][rows[np.argsort(-key[rows], kind="stable")]])[0]
            first[k] = int(hits[0]) if len(hits) else None
        out = report if len(args.retrieval_weights) == 1 else report.setdefault(f"retrieval_weight {weight}", {})
        for split in ("train", "calib", "dev", "all"):
            ranks = [r for k, r in first.items() if split == "all" or splits[k] == split]
            out[split] = {
                "queries": len(ranks),
                "recall@1": round(sum(r == 0 for r in ranks) / len(ranks), 4),
                "recall@10": round(sum(r is not None for r in ranks) / len(ranks), 4),
                "mrr@10": round(sum(1 / (r + 1) for r in ranks if r is not None) / len(ranks), 4),
            }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
