"""Benchmark `mgeo-index normalize` (local engine) against the bare batched resolver, and check
that its memory is bounded by the chunk size rather than the file.

    python research/bench_normalize.py throughput --rows 2000 --top-k 10
    python research/bench_normalize.py memory --small 10000 --large 1000000

throughput: the same rows go through ``Resolver.resolve`` in micro-batches of ``--batch-size`` (the
bare resolver) and through ``normalize_file`` with the same resolver object (read, validate,
resolve, decide, write parts, checkpoint, merge); rounds alternate and the best of each is kept.

memory: runs normalize in a fresh process per input size with a stub resolver (constant matches,
no model), so that peak RSS measures what the job itself holds (reader, parts, checkpoints, merge);
the model's own memory does not depend on the file's length (one micro-batch at a time).
"""
from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mgeo_index import settings


def make_input(path: Path, rows: int) -> list[str]:
    catalog = [r["address"] for r in csv.DictReader(settings.SAMPLE_CATALOG.open(encoding="utf-8"))]
    addresses = []
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "address", "note"])
        for i in range(rows):
            a = catalog[i % len(catalog)]
            a = a[3:] if i % 2 else a  # every other row without its province
            addresses.append(a)
            writer.writerow([i, a, "x" * (i % 7)])
    return addresses


def ensure_index(index_dir: Path | None, work: Path, device: str) -> Path:
    if index_dir is not None:
        return index_dir
    from mgeo_index.catalog.build import build

    index_dir = work / "idx"
    build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device=device)
    return index_dir


def throughput(args) -> None:
    from mgeo_index.jobs import normalize_file
    from mgeo_index.query.resolver import open_resolver

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        index_dir = ensure_index(args.index_dir, work, args.device)
        src = work / "in.csv"
        addresses = make_input(src, args.rows)
        resolver = open_resolver(index_dir, device=args.device)
        resolver.resolve(addresses[:32], top_k=args.top_k)  # warm-up
        bare, job = [], []
        for r in range(args.rounds):
            t0 = time.perf_counter()
            for i in range(0, len(addresses), args.batch_size):
                resolver.resolve(addresses[i : i + args.batch_size], top_k=args.top_k, rerank=True)
            bare.append(len(addresses) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            normalize_file(src, work / f"out{r}.csv", index_dir, device=args.device, top_k=args.top_k,
                           batch_size=args.batch_size, chunk_size=args.chunk_size, resolver=resolver)
            job.append(len(addresses) / (time.perf_counter() - t0))
            print(f"round {r + 1}: bare resolver {bare[-1]:,.1f} rows/s, normalize (local) {job[-1]:,.1f} rows/s", flush=True)
        print(json.dumps({
            "rows": args.rows, "top_k": args.top_k, "batch_size": args.batch_size, "device": args.device,
            "bare_rows_per_s": round(max(bare), 1), "normalize_rows_per_s": round(max(job), 1),
            "ratio": round(max(job) / max(bare), 3),
        }))


class StubResolver:
    """Constant matches, no model: isolates the job's own memory and overhead."""

    manifest = {}

    def resolve(self, queries, top_k=10, rerank=True):
        probs = {"exact_match": 0.7, "partial_match": 0.2, "not_match": 0.1}
        return [[{"id": k, "source_id": f"P{k:04d}", "address": "广东省深圳市南山区中山路75号", "score": 0.9,
                  "label": "exact_match", "probability": 0.7, "probabilities": probs} for k in range(min(top_k, 3))]
                for _ in queries]


def memory_child(args) -> None:
    from mgeo_index.jobs import normalize_file

    t0 = time.perf_counter()
    result = normalize_file(args.src, args.out, args.index_dir, device="cpu", top_k=3, chunk_size=args.chunk_size,
                            resolver=StubResolver())
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": result.rows, "peak_rss_mib": round(peak_kib / 1024, 1),
                      "seconds": round(time.perf_counter() - t0, 1)}))


def memory(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        index_dir = ensure_index(args.index_dir, work, "cpu")
        report = {}
        for n in (args.small, args.large):
            src = work / f"in{n}.csv"
            make_input(src, n)
            out = subprocess.run(
                [sys.executable, __file__, "memory-child", "--src", str(src), "--out", str(work / f"out{n}.csv"),
                 "--index-dir", str(index_dir), "--chunk-size", str(args.chunk_size)],
                check=True, capture_output=True, text=True,
            ).stdout.strip().splitlines()[-1]
            report[n] = json.loads(out)
            print(f"{n:,} rows: {report[n]}", flush=True)
            src.unlink()
        delta = report[args.large]["peak_rss_mib"] - report[args.small]["peak_rss_mib"]
        print(json.dumps({"peak_rss_delta_mib": round(delta, 1), "within_1_gib": delta < 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--index-dir", type=Path)
    t.add_argument("--rows", type=int, default=2000)
    t.add_argument("--top-k", type=int, default=10)
    t.add_argument("--batch-size", type=int, default=1024)
    t.add_argument("--chunk-size", type=int, default=8192)
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--device", default=settings.device())
    m = sub.add_parser("memory")
    m.add_argument("--index-dir", type=Path)
    m.add_argument("--small", type=int, default=10_000)
    m.add_argument("--large", type=int, default=1_000_000)
    m.add_argument("--chunk-size", type=int, default=8192)
    c = sub.add_parser("memory-child")
    for name in ("--src", "--out", "--index-dir"):
        c.add_argument(name, type=Path, required=True)
    c.add_argument("--chunk-size", type=int, default=8192)
    args = parser.parse_args()
    {"throughput": throughput, "memory": memory, "memory-child": memory_child}[args.cmd](args)


if __name__ == "__main__":
    main()
