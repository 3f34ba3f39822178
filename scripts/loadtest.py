"""Load test of `mgeo-index serve`: the batched server against the same server with --max-batch 1.

For each server (started here on a free loopback port, cache off so every request is computed) and each
concurrency (1, 8, 32 by default), N closed-loop clients send one-address /v1/resolve requests until
--requests are sent or --seconds have passed. Each request carries its own address (a catalog address
with its first characters cut, as a caller would write it) and must come back with exactly that query:
the report counts every response by status and the requests that got none (lost) or another's answer.
An overload phase (--overload) drives a server with a small queue and a short deadline past capacity:
every request must still get exactly one answer, 200, 429 or 504.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python scripts/loadtest.py --index-dir ccks-index \\
        --addresses ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --overload --json loadtest.json

Loopback only: the servers bind 127.0.0.1 and nothing else is contacted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_addresses(path: Path, n: int, seed: int) -> list[str]:
    from mgeo_index.catalog.reader import read_catalog

    texts: list[str] = []
    for rows, _ in read_catalog(path, chunk_size=5000).chunks():
        texts += [r.address for r in rows]
        if len(texts) >= 4 * n:
            break
    rng = random.Random(seed)
    picked = rng.sample(texts, min(n, len(texts)))
    return [t[2:] if len(t) > 6 else t for t in picked]  # the province / city prefix left out


def start_server(index_dir: Path, port: int, extra: list[str], log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mgeo_index.cli", "serve", "--index-dir", str(index_dir), "--host", "127.0.0.1",
           "--port", str(port), "--cache-size", "0", "--log-level", "warning", *extra]
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ.copy())


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {timeout} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def run_level(url: str, addresses: list[str], concurrency: int, max_requests: int, seconds: float,
                    start_index: int, top_k: int, client_timeout: float, rerank: bool = True) -> dict:
    """Closed loop: `concurrency` clients, each sends its next request when the previous one is answered."""
    next_request = 0
    outcomes: dict[int, tuple[int | str, float]] = {}  # request number → (status or error, seconds)
    wrong_answers = 0
    stop_at = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal next_request, wrong_answers
        while next_request < max_requests and time.monotonic() < stop_at:
            n = next_request
            next_request += 1
            query = addresses[(start_index + n) % len(addresses)]
            t0 = time.perf_counter()
            try:
                r = await http.post(url + "/v1/resolve", json={"query": query, "top_k": top_k, "rerank": rerank})
                status: int | str = r.status_code
                if status == 200 and r.json()["query"] != query:
                    wrong_answers += 1
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            if n in outcomes:
                raise AssertionError(f"request {n} answered twice")
            outcomes[n] = (status, time.perf_counter() - t0)

    async with httpx.AsyncClient(limits=limits, timeout=client_timeout) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    statuses: dict[str, int] = {}
    for status, _ in outcomes.values():
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    ok = np.array([s for status, s in outcomes.values() if status == 200]) * 1000
    return {
        "concurrency": concurrency,
        "sent": next_request,
        "answered": sum(isinstance(status, int) for status, _ in outcomes.values()),
        "lost": next_request - sum(isinstance(status, int) for status, _ in outcomes.values()),
        "wrong_answers": wrong_answers,
        "statuses": statuses,
        "seconds": round(elapsed, 2),
        "throughput": round(len(ok) / elapsed, 2),
        "p50_ms": round(float(np.percentile(ok, 50)), 1) if len(ok) else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 1) if len(ok) else None,
    }


def direct_costs(index_dir: Path, addresses: list[str], n: int, top_k: int, rerank: bool, batch: int,
                 rounds: int = 2) -> dict:
    """The same resolves in this process, no HTTP: single-address latency, and the time per query of the
    same queries resolved ``batch`` at a time. Their ratio estimates what batching can gain over one
    query at a time on this machine, before HTTP, queueing and the load client.

    Warm-up uses other addresses than the timed ones; single and batched rounds alternate (each round
    first sees the queries' parser caches in the state the previous round left) and the best round of
    each is kept."""
    from mgeo_index.query.resolver import open_resolver

    queries = addresses[: max(len(addresses) - 2 * batch, 0)][:n]
    warm = addresses[len(queries) :][: 2 * batch]
    if not queries:
        raise ValueError(f"--direct needs more than {2 * batch} addresses, got {len(addresses)}")
    resolver = open_resolver(index_dir, device="cpu")
    for q in warm[:5]:
        resolver.resolve([q], top_k=top_k, rerank=rerank)
    resolver.resolve(warm[:batch], top_k=top_k, rerank=rerank)  # the batch shapes
    single_ms, batched_ms, best_single = float("inf"), float("inf"), []
    for _ in range(rounds):
        ms = []
        for q in queries:
            t0 = time.perf_counter()
            resolver.resolve([q], top_k=top_k, rerank=rerank)
            ms.append((time.perf_counter() - t0) * 1000)
        if float(np.mean(ms)) < single_ms:
            single_ms, best_single = float(np.mean(ms)), ms
        t0 = time.perf_counter()
        for start in range(0, len(queries), batch):
            resolver.resolve(queries[start : start + batch], top_k=top_k, rerank=rerank)
        batched_ms = min(batched_ms, (time.perf_counter() - t0) * 1000 / len(queries))
    return {"queries": len(queries), "rounds": rounds, "p50_ms": round(float(np.percentile(best_single, 50)), 1),
            "p99_ms": round(float(np.percentile(best_single, 99)), 1), "single_ms_per_query": round(single_ms, 1),
            "batch": batch, "batched_ms_per_query": round(batched_ms, 1), "batching_gain": round(single_ms / batched_ms, 2)}


def measure(name: str, index_dir: Path, extra: list[str], addresses: list[str], levels: list[int], args) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(index_dir, port, extra, Path(args.logs) / f"loadtest-{name}.log")
    try:
        wait_ready(url, proc, args.ready_timeout)
        rerank = not args.no_rerank
        asyncio.run(run_level(url, addresses, 1, 5, 60, 10**6, args.top_k, 60, rerank))  # a few warm requests, not counted
        results = []
        for i, c in enumerate(levels):
            r = asyncio.run(run_level(url, addresses, c, args.requests, args.seconds, i * args.requests, args.top_k, 120, rerank))
            print(f"{name:>14} c={c:<3} {r['throughput']:7.1f} req/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  "
                  f"{r['statuses']}  lost {r['lost']}", flush=True)
            results.append(r)
        return {"server": name, "args": extra, "levels": results}
    finally:
        stop_server(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index-dir", type=Path, required=True)
    p.add_argument("--addresses", type=Path, default=ROOT / "mgeo_index" / "data" / "sample_catalog.csv",
                   help="catalog file the request addresses are drawn from")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=400, help="most requests per concurrency level")
    p.add_argument("--seconds", type=float, default=30.0, help="longest a concurrency level runs")
    p.add_argument("--max-batch", type=int, default=32, help="of the batched server")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--no-rerank", action="store_true", help='requests ask for retrieval only ("rerank": false)')
    p.add_argument("--server-args", default="", help="more `mgeo-index serve` options for both servers, e.g. '--max-wait-ms 2'")
    p.add_argument("--timeout-ms", type=float, default=60000, help="server deadline while measuring")
    p.add_argument("--direct", type=int, default=128, help="queries resolved in-process first, one and --max-batch per call (0: none)")
    p.add_argument("--overload", action="store_true", help="also run the overload phase")
    p.add_argument("--ready-timeout", type=float, default=300)
    p.add_argument("--logs", default="/tmp", help="folder for the servers' logs")
    p.add_argument("--json", type=Path, help="write the full report here")
    args = p.parse_args()

    addresses = load_addresses(args.addresses, 4000, seed=0)
    common = args.server_args.split()
    report = {"index_dir": str(args.index_dir), "requests_per_level": args.requests, "seconds_per_level": args.seconds,
              "top_k": args.top_k, "rerank": not args.no_rerank, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "runs": []}
    if args.direct:
        d = report["direct"] = direct_costs(args.index_dir, addresses, args.direct, args.top_k, not args.no_rerank,
                                            args.max_batch)
        print(f"in-process Resolver.resolve, one address per call: p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms, "
              f"mean {d['single_ms_per_query']} ms; {d['batch']} per call: {d['batched_ms_per_query']} ms a query "
              f"({d['queries']} queries, best of {d['rounds']} alternating rounds) → in-process batching gain "
              f"{d['batching_gain']}×", flush=True)
    # a generous deadline while measuring, so that slow answers are measured rather than cut at 504
    timeout = ["--timeout-ms", str(args.timeout_ms)]
    for name, extra in (("batched", ["--max-batch", str(args.max_batch), *timeout]), ("max-batch 1", ["--max-batch", "1", *timeout])):
        report["runs"].append(measure(name, args.index_dir, extra + common, addresses, args.concurrency, args))
    if args.overload:
        extra = ["--max-batch", str(args.max_batch), "--max-queue", "16", "--timeout-ms", "1500", *common]
        report["overload"] = measure("overload", args.index_dir, extra, addresses, [64], args)["levels"][0]

    batched, single = (run["levels"] for run in report["runs"])
    print("\n| server | concurrency | requests | throughput (req/s) | p50 ms | p99 ms | statuses | lost |")
    print("|---|---|---|---|---|---|---|---|")
    for run in report["runs"]:
        for r in run["levels"]:
            print(f"| {run['server']} | {r['concurrency']} | {r['sent']} | {r['throughput']} | {r['p50_ms']} | "
                  f"{r['p99_ms']} | {r['statuses']} | {r['lost']} |")
    for b, s in zip(batched, single):
        if s["throughput"]:
            print(f"c={b['concurrency']}: batched / max-batch 1 throughput = {b['throughput'] / s['throughput']:.2f}×")
    if "overload" in report:
        o = report["overload"]
        print(f"overload (c=64, --max-queue 16, --timeout-ms 1500): sent {o['sent']}, answered {o['answered']} "
              f"{o['statuses']}, lost {o['lost']}, wrong answers {o['wrong_answers']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
