"""Decision latency of the review page, through the real server: ``mgeo-index review`` in a subprocess
(uvicorn on loopback), a client posting decisions over HTTP with httpx.

One decision is what a reviewer waits for after a key: the form POST (recorded, 303) and the GET of the
next item's page it redirects to. The script reports p50 / p99 / max of the POST alone and of the
whole round trip, over ``--decisions`` decisions (exact on candidate 1, none, partial, skip in turn;
every tenth action is an undo, timed apart). The queue is built first by the same command (its
candidates computed ahead: that time is reported too, but is not part of a decision).

The review writes items and labels into the index's store, so by default the index directory (SQLite
store included) is copied to a temporary directory first (``--in-place`` to skip that).

    .venv/bin/python research/bench_review.py --index-dir demo-index --decisions 200
    .venv/bin/python research/bench_review.py --index-dir /tmp/ccks-index --decisions 200 --json bench-review.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

JSON = {"Accept": "application/json"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary(ms: list[float]) -> dict:
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(percentile(ms, 99), 2),
            "max_ms": round(max(ms), 2), "mean_ms": round(statistics.fmean(ms), 2)}


def live_addresses(index_dir: Path) -> list[str]:
    """The catalog's live entries' addresses, in id order."""
    from sqlalchemy import text

    from mgeo_index import settings, store

    engine = store.connect(settings.database_url(index_dir))
    with engine.connect() as conn:
        addresses = [r[0] for r in conn.execute(text("SELECT address FROM entries WHERE retired_at IS NULL ORDER BY id"))]
    engine.dispose()
    return addresses


def catalog_queries(addresses: list[str], n: int, seed: int) -> list[str]:
    """``n`` queries made from catalog addresses the way people write them: the province, city or
    district dropped or cut short, a character lost (deterministic for ``seed``)."""
    rng = random.Random(seed)
    out, seen = [], set()
    for address in rng.sample(addresses, min(len(addresses), n * 2)):
        query = re.sub(r"^[^省市]{2,3}省", "", address) if rng.random() < 0.7 else address
        query = re.sub(r"^([^市]{2,3})市", r"\1", query) if rng.random() < 0.5 else query
        if len(query) > 6 and rng.random() < 0.3:
            cut = rng.randrange(2, len(query) - 2)
            query = query[:cut] + query[cut + 1 :]
        if query not in seen:
            seen.add(query)
            out.append(query)
        if len(out) == n:
            break
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_review(index_dir: Path, queries: Path, port: int, top_k: int, log: Path) -> tuple[subprocess.Popen, float]:
    """``mgeo-index review`` serving the queue of ``queries``; (process, seconds until it answered)."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "mgeo_index.cli", "review", "--index-dir", str(index_dir), "--file", str(queries),
               "--port", str(port), "--top-k", str(top_k), "--device", "cpu"]
    proc = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "120"})
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mgeo-index review exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("mgeo-index review did not start in 30 minutes")


def run(base: str, decisions: int) -> dict:
    """Post ``decisions`` decisions (plus an undo every tenth action); the timings in milliseconds."""
    actions = [("exact", 1), ("none", None), ("partial", 1), ("skip", None)]
    post_ms, round_ms, undo_ms, statuses = [], [], [], {}
    with httpx.Client(base_url=base, timeout=30) as client:
        client.get("/")  # warm-up
        done = 0
        while done < decisions:
            item = client.get("/", headers=JSON).json()["item"]
            if item is None:
                raise SystemExit(f"the queue ran out after {done} decisions: give more queries (--queries / --items)")
            if done and done % 10 == 0 and len(undo_ms) < done // 10:
                t0 = time.perf_counter()
                client.post("/undo", follow_redirects=False)
                client.get("/")
                undo_ms.append(1000 * (time.perf_counter() - t0))
                continue
            decision, candidate = actions[done % len(actions)]
            if not item["candidates"] and candidate:
                decision, candidate = "none", None
            data = {"item_id": item["id"], "version": item["version"], "model_version": item["model_version"],
                    "decision": decision}
            if candidate:
                data["candidate"] = candidate
            t0 = time.perf_counter()
            answer = client.post("/decide", data=data, follow_redirects=False)
            t1 = time.perf_counter()
            page = client.get(answer.headers.get("location", "/"))
            t2 = time.perf_counter()
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            assert page.status_code == 200
            post_ms.append(1000 * (t1 - t0))
            round_ms.append(1000 * (t2 - t0))
            done += 1
    return {"post": summary(post_ms), "post_and_next_page": summary(round_ms),
            "undo_and_page": summary(undo_ms) if undo_ms else None, "post_statuses": statuses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", type=Path, required=True)
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--queries", type=Path, help="Queries file (one a line) [default: made from the catalog].")
    parser.add_argument("--items", type=int, default=None, help="Queries made from the catalog [default: decisions × 1.3].")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--in-place", action="store_true", help="Review in the index's own store (no copy).")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-review-"))
    try:
        index_dir = args.index_dir if args.in_place else Path(shutil.copytree(args.index_dir, work / "idx"))
        addresses = live_addresses(index_dir)
        queries = args.queries
        if queries is None:
            queries = work / "queries.txt"
            made = catalog_queries(addresses, args.items or int(args.decisions * 1.3) + 10, args.seed)
            queries.write_text("\n".join(made) + "\n", encoding="utf-8")
        n_queries = sum(1 for line in queries.read_text(encoding="utf-8").splitlines() if line.strip())
        port = free_port()
        proc, startup_s = start_review(index_dir, queries, port, args.top_k, work / "review.log")
        try:
            figures = run(f"http://127.0.0.1:{port}", args.decisions)
        finally:
            proc.terminate()
            proc.wait(30)
        report = {"index_dir": str(args.index_dir), "catalog_entries": len(addresses), "queries": n_queries,
                  "top_k": args.top_k, "startup_with_queue_build_s": round(startup_s, 1), **figures}
        print(json.dumps(report, indent=2, ensure_ascii=False))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
