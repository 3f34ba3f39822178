"""What the character n-gram index (mgeo_index.index.sparse) costs as the catalog grows: build time, its size in
memory and on disk, and single-query search latency — pruned (the default: candidates share a rare n-gram; those
that cannot make the top k by a bound are not scored), pruned without the bound (every candidate scored: the same
ids and scores, checked) and unpruned side by side, with how much of the unpruned top 20 the pruned search keeps —
at each of --rows
synthesized catalog sizes (the same synthesizer as `mgeo-index bench --build-rows`).

    python research/bench_sparse.py --data ../shared/data --rows 50000,200000,1000000
"""
import argparse
import json
import os
import random
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from mgeo_index.index import sparse
from mgeo_index.measure.bench import synthesize_catalog
from mgeo_index.text import normalize

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--rows", default="50000,200000,1000000")
parser.add_argument("--queries", type=int, default=200)
args = parser.parse_args()


def rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


out = []
with tempfile.TemporaryDirectory() as tmp:
    for n in [int(r) for r in args.rows.split(",")]:
        path = synthesize_catalog(args.data, n, Path(tmp) / f"catalog-{n}.tsv")
        texts = [normalize(line.split("\t", 1)[1].rstrip("\n")) for line in path.open(encoding="utf-8").readlines()[1:]]
        before = rss_mib()
        started = time.perf_counter()
        index = sparse.build_sparse(texts, list(range(1, n + 1)))
        build_s = time.perf_counter() - started
        matrix_mib = (index.matrix.data.nbytes + index.matrix.indices.nbytes + index.matrix.indptr.nbytes) / 2**20
        file = Path(tmp) / f"sparse-{n}.npz"
        sparse.save_atomic(index, file)
        rng = random.Random(0)
        queries = [t[rng.randrange(0, 4):] for t in rng.sample(texts, args.queries)]  # a few leading characters cut
        index.search(queries[:2], 20)  # the transposed matrix is built once, on the first search
        after = rss_mib()
        times, answers = [], []
        for q in queries:
            t0 = time.perf_counter()
            answers.append(index.search([q], 20))
            times.append((time.perf_counter() - t0) * 1000)
        found = [ids[0] for _, ids in answers]
        # the same searches scoring every candidate (no bound): the same answers, and its time, side by side
        bound_times, same = [], True
        sparse.BOUND_SLACK, slack = np.inf, sparse.BOUND_SLACK
        for q, (scores, ids) in zip(queries, answers):
            t0 = time.perf_counter()
            every = index.search([q], 20)
            bound_times.append((time.perf_counter() - t0) * 1000)
            same = same and np.array_equal(every[1], ids) and np.array_equal(every[0], scores)
        sparse.BOUND_SLACK = slack
        # the same searches without pruning (no n-gram common): exact top 20, and its time, side by side
        pruning, index._common = index._common, np.zeros_like(index._common)
        exact_times, overlap = [], []
        for q, mine in zip(queries, found):
            t0 = time.perf_counter()
            exact = index.search([q], 20)[1][0]
            exact_times.append((time.perf_counter() - t0) * 1000)
            overlap.append(len(set(mine[mine >= 0]) & set(exact[exact >= 0])) / max((exact >= 0).sum(), 1))
        index._common = pruning
        row = {"rows": n, "build_s": round(build_s, 1), "rows_per_s": round(n / build_s), "nnz": int(index.matrix.nnz),
               "vocabulary": len(index.vocabulary), "matrix_mib": round(matrix_mib, 1),
               "rss_growth_mib": round(after - before, 1), "file_mib": round(file.stat().st_size / 2**20, 1),
               "search_p50_ms": round(float(np.percentile(times, 50)), 1),
               "search_p99_ms": round(float(np.percentile(times, 99)), 1),
               "unbounded_p50_ms": round(float(np.percentile(bound_times, 50)), 1),
               "unbounded_p99_ms": round(float(np.percentile(bound_times, 99)), 1), "unbounded_same_answers": same,
               "unpruned_p50_ms": round(float(np.percentile(exact_times, 50)), 1),
               "unpruned_p99_ms": round(float(np.percentile(exact_times, 99)), 1),
               "top20_overlap_with_unpruned": round(float(np.mean(overlap)), 4)}
        print(json.dumps(row), flush=True)
        out.append(row)
        del index, texts
print(json.dumps({"sparse_scale": out, "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
