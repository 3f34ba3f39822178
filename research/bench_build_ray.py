"""`build --runner ray` against the local runner, side by side in one run, on the same synthesized catalog.

Builds the catalog twice into fresh index directories (local runner first, then Ray with ``--workers``
actors, Ray started by the build itself, as the CLI does) and prints each build's seconds, rows/s and
stage timings, then whether the two catalogs are the same: entries (ids, catalog ids, addresses, normalized
text), parsed elements, the FAISS ids, and the largest vector difference.

    OMP_NUM_THREADS=1 .venv/bin/python research/bench_build_ray.py --data ../shared/data --rows 20000 --workers 2
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mgeo_index.measure.bench import synthesize_catalog  # noqa: E402
from mgeo_index.catalog.build import build  # noqa: E402
from mgeo_index.catalog.consistency import catalog_state# noqa: E402

TOLERANCE = 1e-5  # FP32 on the CPU is batch-independent and both runners embed the same batches: ~0 expected



def compare(local: Path, remote: Path) -> dict:
    (entries_a, elements_a, vectors_a), (entries_b, elements_b, vectors_b) = catalog_state(local), catalog_state(remote)
    same_ids = sorted(vectors_a) == sorted(vectors_b) == sorted(entries_a) == sorted(entries_b)
    diff = max((float(np.abs(vectors_a[i] - vectors_b[i]).max()) for i in vectors_a), default=0.0) if same_ids else None
    return {
        "entries_match": entries_a == entries_b,
        "elements_match": elements_a == elements_b,
        "ids_match": same_ids,
        "vectors_max_abs_diff": diff,
        "vectors_match": diff is not None and diff <= TOLERANCE,
    }


def timed_build(catalog: Path, index_dir: Path, args, **runner) -> dict:
    started = time.perf_counter()
    result = build(catalog, index_dir, id_column="id", device=args.device, backend=args.backend,
                   chunk_size=args.chunk_size, **runner)
    seconds = time.perf_counter() - started
    return {"runner": result.runner, "seconds": round(seconds, 2), "rows_per_second": round(result.rows_read / seconds, 1),
            "entries": result.entries_total, "stages": {k: round(v, 2) for k, v in result.seconds.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data", help="the shared data folder (catalogs to synthesize from)")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=5000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--work-dir", default=None, help="where the catalog and both indexes go [default: a temporary directory]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="bench-build-ray-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("local", "ray"):
        shutil.rmtree(work / name, ignore_errors=True)
    catalog = synthesize_catalog(args.data, args.rows, work / "catalog.tsv")
    local = timed_build(catalog, work / "local", args)
    remote = timed_build(catalog, work / "ray", args, runner="ray", workers=args.workers)
    try:
        import ray

        ray.shutdown()
    except ImportError:
        pass
    report = {"rows": args.rows, "workers": args.workers, "chunk_size": args.chunk_size, "local": local, "ray": remote,
              "ray_over_local": round(remote["seconds"] / local["seconds"], 3), **compare(work / "local", work / "ray")}
    if args.json:
        print(json.dumps(report))
        return
    for side in (local, remote):
        print(f"{side['runner']:>5}: {side['seconds']:7.1f} s  {side['rows_per_second']:8.1f} rows/s  "
              + ", ".join(f"{k} {v:.1f}" for k, v in side["stages"].items()))
    print(f"ray / local: {report['ray_over_local']:.3f}")
    print(f"entries match: {report['entries_match']}; elements match: {report['elements_match']}; ids match: "
          f"{report['ids_match']}; vectors max |diff| {report['vectors_max_abs_diff']} "
          f"({'within' if report['vectors_match'] else 'NOT within'} {TOLERANCE:g})")


if __name__ == "__main__":
    main()
