"""Incremental update vs full rebuild on a real catalog, measured in one run.

    OMP_NUM_THREADS=1 python research/bench_update.py --catalog ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz

1. full: `build` of the whole catalog into a fresh index directory (every entry embedded);
2. update: `add` of a delta holding --fraction of the catalog's size (default 1%): half of it existing
   ids with a changed address (re-embedded), half new ids;
3. remove: `remove` of the same number of ids.
The model is loaded once, before the timings, so each figure is the command's own work (store,
embedding, index files, n-gram index, checksums, pointer switch, gc).  `check` must be clean after each.
The catalog is copied (with an id column added) to a temporary directory, never into the repository.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from pathlib import Path

from mgeo_index import settings
from mgeo_index.catalog.build import build
from mgeo_index.catalog.reader import read_catalog
from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.catalog.update import add, check, remove


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "address"])
        writer.writerows(rows)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catalog", type=Path, required=True)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--index", default=settings.DEFAULT_INDEX_FACTORY)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    addresses = [row.address for rows, _ in read_catalog(args.catalog, chunk_size=50_000).chunks() for row in rows]
    rows = [(f"C{i:06d}", a) for i, a in enumerate(addresses)]
    rnd = random.Random(args.seed)
    n = max(2, round(len(rows) * args.fraction))
    changed = [(cid, a + f"{rnd.randint(1, 99)}号") for cid, a in rnd.sample(rows, n // 2)]
    new = [(f"N{i:06d}", a + "附近") for i, (_, a) in enumerate(rnd.sample(rows, n - n // 2))]
    doomed = [cid for cid, _ in rnd.sample(rows, n)]
    bi = load_bi_encoder(settings.bi_model_path(None))
    report: dict = {"catalog": str(args.catalog), "entries": len(rows), "delta_rows": n, "index": args.index}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        index_dir = work / "idx"
        t0 = time.perf_counter()
        full = build(write_csv(work / "catalog.csv", rows), index_dir, id_column="id", model=bi, device=args.device,
                     factory=args.index)
        report["full_seconds"] = round(time.perf_counter() - t0, 2)
        report["full_stages"] = {k: round(v, 2) for k, v in full.seconds.items()}
        assert check(index_dir).clean

        t0 = time.perf_counter()
        update = add(write_csv(work / "delta.csv", changed + new), index_dir, model=bi, device=args.device)
        report["update_seconds"] = round(time.perf_counter() - t0, 2)
        report["update_stages"] = {k: round(v, 2) for k, v in update.seconds.items()}
        report["update_counts"] = {"new": update.rows_inserted, "updated": update.rows_updated,
                                   "vectors_added": update.vectors_added, "vectors_removed": update.vectors_removed}
        assert check(index_dir).clean

        t0 = time.perf_counter()
        removed = remove(doomed, index_dir, model=bi, device=args.device)
        report["remove_seconds"] = round(time.perf_counter() - t0, 2)
        report["removed"] = removed.removed
        assert check(index_dir).clean
    report["update_vs_full"] = round(report["update_seconds"] / report["full_seconds"], 4)
    report["remove_vs_full"] = round(report["remove_seconds"] / report["full_seconds"], 4)
    print(json.dumps(report, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
