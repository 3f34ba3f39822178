"""`mgeo-index bench`: the batcher (runtime.inference) against the naive way, side by side, in one run.

Naive = what slow address-model deployments do: tokenize one item at a time, batch of 1, pad to 64,
FP32. Every figure is measured in the same process on the same inputs, and reported as a ratio.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mgeo_index import settings
from mgeo_index.runtime import inference
from mgeo_index.query import labelling
from mgeo_index.runtime.plan import torch_plan
from mgeo_index.text import normalize

NAIVE_PAD = 64


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def naive_encode(bi, texts: Sequence[str]) -> np.ndarray:
    out = []
    with torch.no_grad():
        for text in texts:
            enc = bi.tokenizer(text, padding="max_length", truncation=True, max_length=NAIVE_PAD, return_tensors="pt")
            out.append(torch.nn.functional.normalize(bi(**enc), dim=-1)[0].numpy())
    return np.stack(out)


def naive_score(cross, first: Sequence[str], second: Sequence[str]) -> np.ndarray:
    out = []
    with torch.no_grad():
        for a, b in zip(first, second):
            enc = cross.tokenizer(a, b, padding="max_length", truncation=True, max_length=NAIVE_PAD, return_tensors="pt")
            out.append(torch.softmax(cross(**enc), dim=-1)[0].numpy())
    return np.stack(out)


# The ops that compute the Linear layers, per backend (int8: fbgemm's dynamic int8 GEMM; fp32 / bf16: addmm).
LINEAR_OPS = frozenset({"quantized::linear_dynamic", "aten::addmm", "aten::mm", "aten::_int_mm"})


def gemm_profile(fn) -> tuple[dict[str, int], float, float]:
    """One call of ``fn`` under the torch profiler: (calls of each GEMM op in LINEAR_OPS, their self time in µs,
    the call's wall time in µs)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    with _native_stderr_silenced():  # torch's profiler prints start / stop lines from C++ on fd 2
        prof.__enter__()
    try:
        t0 = time.perf_counter()
        fn()
        wall_us = (time.perf_counter() - t0) * 1e6
    finally:
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)
    events = [e for e in prof.key_averages() if e.key in LINEAR_OPS]
    return {e.key: e.count for e in events}, sum(e.self_cpu_time_total for e in events), wall_us


def linear_share(fn) -> float | None:
    """Share of one call's time spent in the Linear layers' GEMMs (torch profiler; None when the backend
    runs outside torch, e.g. ONNX Runtime).

    The GEMMs are the arithmetic no batching can remove: with everything else (attention, GELU,
    LayerNorm, tokenization, Python) free, the batched path would be ``1 / share`` times faster, which puts a
    ceiling on its ratio to the naive loop. The profiler's own overhead lands outside the GEMMs, so the
    share is, if anything, understated and the ceiling generous."""
    _, linear_us, wall_us = gemm_profile(fn)
    return linear_us / wall_us if linear_us > 0 else None


@contextlib.contextmanager
def _native_stderr_silenced():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _vs_naive(n: int, fast_s: float, naive_n: int, slow_s: float, rounds: int, batched_call, **extra) -> dict:
    """The batched path's and the naive loop's rates, their ratio, and the ceiling the batched path's GEMM share puts on it."""
    ratio = _rate(n, fast_s) / _rate(naive_n, slow_s)
    share = linear_share(batched_call)
    return {"batched_per_s": _rate(n, fast_s), "naive_per_s": _rate(naive_n, slow_s), "ratio": ratio, "n": n,
            "naive_n": naive_n, **extra, "rounds": rounds, "linear_share": share,
            "ceiling_ratio": ratio / share if share else None}


def bench_encode(bi, texts: Sequence[str], naive_n: int = 200, rounds: int = 3) -> dict:
    """Batcher vs naive loop, interleaved rounds (batcher, naive, batcher, …), best round of each kept."""
    texts = [normalize(t) for t in texts]
    sample = texts[:naive_n]
    inference.encode(bi, texts[:64])  # warm-up
    fast_s = slow_s = float("inf")
    for _ in range(rounds):
        fast_s = min(fast_s, _seconds(lambda: inference.encode(bi, texts)))
        slow_s = min(slow_s, _seconds(lambda: naive_encode(bi, sample)))
    agree = float(np.abs(inference.encode(bi, texts)[: len(sample)] - naive_encode(bi, sample)).max())
    return _vs_naive(len(texts), fast_s, len(sample), slow_s, rounds, lambda: inference.encode(bi, texts), max_abs_diff=agree)


def bench_score(cross, first: Sequence[str], second: Sequence[str], naive_n: int = 200, rounds: int = 3) -> dict:
    """Network scoring only (the stacked feature head is the same per-pair cost on both sides)."""
    first, second = [normalize(t) for t in first], [normalize(t) for t in second]
    n_slow = min(naive_n, len(first))
    network_scores(cross, first[:64], second[:64])  # warm-up
    fast_s = slow_s = float("inf")
    for _ in range(rounds):
        fast_s = min(fast_s, _seconds(lambda: network_scores(cross, first, second)))
        slow_s = min(slow_s, _seconds(lambda: naive_score(cross, first[:n_slow], second[:n_slow])))
    return _vs_naive(len(first), fast_s, n_slow, slow_s, rounds, lambda: network_scores(cross, first, second))


def bench_resolve(resolver, queries: Sequence[str], *, top_k: int = settings.DEFAULT_TOP_K, warmup: int = 10) -> dict:
    """Single-query latency on a warm process (one query per call, as online traffic arrives)."""
    for q in queries[:warmup]:
        resolver.resolve([q], top_k=top_k)
    latencies = []
    for q in queries:
        t0 = time.perf_counter()
        resolver.resolve([q], top_k=top_k)
        latencies.append((time.perf_counter() - t0) * 1000)
    lat = np.asarray(latencies)
    return {"queries": len(lat), "top_k": top_k, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "mean_ms": float(lat.mean()),
            "catalog_size": int(resolver.index.ntotal)}


def _seconds(fn) -> float:
    """Wall time of one call (callers interleave rounds and keep the least: the figure least disturbed
    by other work on a shared machine)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_backends(
    names: Sequence[str],
    texts: Sequence[str],
    others: Sequence[str],
    *,
    model=None,
    cross_model=None,
    pairs: tuple[list[str], list[str], list[int]] | None = None,
    n_pairs: int = 500,
    rounds: int = 3,
) -> list[dict]:
    """Each backend on the same inputs: addresses/s, pairs/s (network), agreement with ``torch``, dev macro-F1.

    Timings are interleaved (round 1 of every backend, then round 2 …) and the best round is kept, so a
    burst of load from other processes does not land on one backend only. A backend whose optional extra
    is not installed (``onnx`` without ONNX Runtime) is not timed, nor ``numpy`` (it computes the models of one-shot
    commands; a torch module given it runs on the default): its row is ``{"backend": name, "skipped": why}``, in its
    place.
    """
    from mgeo_index.runtime import backends
    from mgeo_index.measure.evaluate import evaluate_pairs
    from mgeo_index.model.loading import stored_bi, stored_cross

    texts = [normalize(t) for t in texts]
    first, second = texts[:n_pairs], [normalize(t) for t in others[:n_pairs]]
    loaded, skipped = {}, {}
    for name in names:
        if name == "numpy":
            skipped[name] = "numpy computes the models of one-shot commands (resolve ADDRESS); not timed here"
            continue
        try:
            backends.require(name)
        except backends.MissingExtra as exc:
            skipped[name] = str(exc)
            continue
        t0 = time.perf_counter()
        bi = backends.apply(stored_bi(model), name)
        cross = backends.apply(stored_cross(cross_model), name)
        inference.encode(bi, texts[:64])
        network_scores(cross, first[:64], second[:64])  # warm-up (and compilation) of what the rounds time
        loaded[name] = {"backend": name, "setup_s": time.perf_counter() - t0, "bi": bi, "cross": cross,
                        "encode_s": float("inf"), "pairs_s": float("inf")}
    for _ in range(rounds):
        for r in loaded.values():
            r["encode_s"] = min(r["encode_s"], _seconds(lambda: inference.encode(r["bi"], texts)))
            r["pairs_s"] = min(r["pairs_s"], _seconds(lambda: network_scores(r["cross"], first, second)))
    reference = loaded.get("torch")
    ref_vectors = inference.encode(reference["bi"], texts[:500]) if reference is not None else None
    out = []
    for name, r in loaded.items():
        row = {"backend": name, "setup_s": r["setup_s"], "encode_per_s": _rate(len(texts), r["encode_s"]),
               "pairs_per_s": _rate(len(first), r["pairs_s"])}
        if reference is not None:
            vectors = inference.encode(r["bi"], texts[:500])
            row["embedding_cosine_min"] = float((vectors * ref_vectors).sum(1).min())
        if pairs is not None:
            report = evaluate_pairs(r["cross"], *pairs)
            row["macro_f1"] = report["macro_f1"]
            row["pairs_evaluated"] = report["n"]
        out.append(row)
    if reference is not None:
        torch_row = out[list(loaded).index("torch")]
        for row in out:
            row["encode_vs_torch"] = row["encode_per_s"] / torch_row["encode_per_s"]
            row["pairs_vs_torch"] = row["pairs_per_s"] / torch_row["pairs_per_s"]
            if pairs is not None:
                row["macro_f1_delta"] = row["macro_f1"] - torch_row["macro_f1"]
    timed = iter(out)
    return [{"backend": name, "skipped": skipped[name]} if name in skipped else next(timed)
            for name in dict.fromkeys(names)]


def network_scores(cross, first: Sequence[str], second: Sequence[str]) -> np.ndarray:
    """The cross-encoder network alone (the stacked feature head costs the same per pair on every side)."""
    head, cross.feature_head = getattr(cross, "feature_head", None), None
    try:
        return labelling.score_pairs(cross, first, second)
    finally:
        cross.feature_head = head


def run_bench(
    addresses: str | Path,
    *,
    limit: int,
    naive: int,
    queries: int,
    backend: str | None = None,
    model=None,
    cross_model=None,
    names: Sequence[str] = (),
    pairs: str | Path | None = None,
    split: str = "dev",
    index_dir: str | Path | None = None,
    build_sizes: Sequence[int] = (),
    data: str | Path | None = None,
    work_dir: str | Path = "bench-work",
) -> dict:
    """`mgeo-index bench`: the first ``limit`` addresses of ``addresses`` through the batcher and ``naive``
    of them through the naive loop with ``backend``; with ``names`` those backends side by side (and
    their macro-F1 on the ``split`` of ``pairs``); with ``index_dir`` single-query resolve latency over
    ``queries`` queries (plain torch and ``backend``); with ``build_sizes`` a fresh build of catalogs of
    those sizes synthesized from ``data`` in ``work_dir``. Returns the report (what ``--json`` prints)."""
    import random

    from mgeo_index.catalog.reader import read_catalog
    from mgeo_index.measure.evaluate import read_labeled_pairs
    from mgeo_index.model.loading import load_bi, load_cross

    if build_sizes and data is None:
        raise ValueError("build_sizes needs data, the shared data folder the catalogs are synthesized from")
    texts: list[str] = []
    for rows, _ in read_catalog(addresses, chunk_size=5000).chunks():
        texts += [r.address for r in rows]
        if len(texts) >= limit:
            break
    texts = texts[:limit]
    rng = random.Random(0)
    shuffled = rng.sample(texts, len(texts))
    chosen = torch_plan(backend).backend  # numpy is for one-shot commands: the default is timed
    bi = load_bi(model, device="cpu", backend=chosen)
    cross = load_cross(cross_model, device="cpu", backend=chosen)
    report = {
        "torch_threads": torch.get_num_threads(),
        "backend": chosen,
        "encode": bench_encode(bi, texts, naive),
        "score_pairs": bench_score(cross, texts, shuffled, naive),
    }
    if names:
        labeled = read_labeled_pairs(pairs, split) if pairs is not None else None
        report["backends"] = bench_backends(names, texts, shuffled, model=model, cross_model=cross_model, pairs=labeled)
    if index_dir is not None:
        from mgeo_index.query.resolver import open_resolver

        sample = [t[2:] for t in rng.sample(texts, min(queries, len(texts)))]
        report["resolve"] = {}
        for name in dict.fromkeys(["torch", chosen]):  # the plain reference, then the chosen backend
            resolver = open_resolver(index_dir, model=model, cross_model=cross_model, device="cpu", backend=name)
            report["resolve"][name] = bench_resolve(resolver, sample)
    if build_sizes:
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        report["build"] = []
        for n in build_sizes:
            catalog = synthesize_catalog(data, n, work_dir / f"catalog-{n}.tsv")
            built = bench_build(catalog, work_dir / f"index-{n}", backend=chosen)
            built["resolve"] = bench_built_resolve(work_dir / f"index-{n}", catalog, queries=queries, backend=chosen)
            report["build"].append(built)
    return report


# --- the 200,000-row build: throughput and peak resident memory of the build process ---------------

_VARIANTS = ("{n}栋", "{n}号楼{u}单元", "{n}栋{u}0{f}室", "{n}幢{f}楼", "{n}号{u}层", "东区{n}栋{u}单元{f}0{u}")


def base_addresses(data_dir: str | Path) -> list[str]:
    """Every distinct real address string of the shared catalogs (CCKS candidates, Shenzhen, tagged sets)."""
    data_dir = Path(data_dir)
    seen: dict[str, None] = {}
    with gzip.open(data_dir / "catalog" / "ccks2021_poi_candidates.tsv.gz", "rt", encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            seen.setdefault(line.rstrip("\n").split("\t")[0], None)
    with gzip.open(data_dir / "catalog" / "shenzhen_standard_addresses.txt.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            seen.setdefault(line.strip(), None)
    for name in ("tagged_addresses_swei412.jsonl.gz", "tagged_addresses_ncap2019.jsonl.gz"):
        with gzip.open(data_dir / "catalog" / name, "rt", encoding="utf-8") as fh:
            for line in fh:
                seen.setdefault(json.loads(line)["text"], None)
    seen.pop("", None)
    return list(seen)


def synthesize_catalog(data_dir: str | Path, rows: int, path: str | Path) -> Path:
    """A TSV catalog (``id``, ``address``) of ``rows`` distinct addresses: the real ones, then building /
    unit / floor variants of them (deterministic), as large catalogs of one city's doors look."""
    bases = base_addresses(data_dir)
    path = Path(path)
    written: set[str] = set()
    with path.open("w", encoding="utf-8") as fh:
        fh.write("id\taddress\n")
        k = 0
        while len(written) < rows:
            base = bases[k % len(bases)]
            round_ = k // len(bases)
            text = base if round_ == 0 else base + _VARIANTS[(round_ - 1) % len(_VARIANTS)].format(
                n=(k * 7 + round_) % 38 + 1, u=round_ % 4 + 1, f=(k % 29) + 1)
            k += 1
            if text in written or "\t" in text:
                continue
            written.add(text)
            fh.write(f"s{len(written)}\t{text}\n")
    return path


# The child runs the real CLI and, on exit, writes its VmHWM (peak resident set of its own address space).
# ru_maxrss is not used: on Linux it carries over the parent's resident size across fork and exec.
_CHILD = """
import atexit, os, re, sys
def _peak():
    status = open('/proc/self/status').read()
    open(os.environ['MGEO_BENCH_PEAK_FILE'], 'w').write(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))
atexit.register(_peak)
sys.argv = ['mgeo-index'] + sys.argv[1:]
from mgeo_index.cli import app
app()
"""


def bench_build(catalog: str | Path, index_dir: str | Path, *, backend: str | None = None) -> dict:
    """Run ``mgeo-index build`` in a child process (a fresh index); wall time, rows/s and the child's peak RSS."""
    index_dir = Path(index_dir)
    if index_dir.exists():
        shutil.rmtree(index_dir)  # nothing is reused from a previous run
    peak_file = index_dir.with_name(index_dir.name + ".peak-kib")
    peak_file.unlink(missing_ok=True)
    command = [sys.executable, "-c", _CHILD, "build", str(catalog), "--index-dir", str(index_dir), "--id-column", "id"]
    command += ["--backend", backend] if backend else []
    t0, cpu0 = time.perf_counter(), _children_cpu_seconds()
    # a wide terminal: the summary line that names the structure ``auto`` chose is not wrapped
    child = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={**os.environ, "MGEO_BENCH_PEAK_FILE": str(peak_file), "COLUMNS": "1000"})
    seconds, cpu_seconds = time.perf_counter() - t0, _children_cpu_seconds() - cpu0
    if child.returncode != 0:
        raise RuntimeError(f"build of {catalog} failed ({child.returncode}): {child.stderr.decode(errors='replace')[-2000:]}")
    with open(catalog, encoding="utf-8") as fh:
        rows = sum(1 for _ in fh) - 1
    # CPU seconds too: on a shared machine the wall clock counts other processes' load, the CPU time does not
    report = {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "cpu_seconds": cpu_seconds,
              "rows_per_cpu_s": rows / max(cpu_seconds, 1e-9), "peak_rss_mib": int(peak_file.read_text()) / 1024}
    return report | chosen_structure(child.stdout.decode(errors="replace")) | disk_sizes(index_dir)


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished (waited-for) children."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_CHOSEN = re.compile(r"auto: (\S+?)(?: \(nprobe (\d+): recall@10 ([0-9.]+) of exact search on (\d+) catalog vectors\))?(?:\s|$)")


def chosen_structure(build_output: str) -> dict:
    """What ``--index auto`` chose, from the build's summary: structure, and for IVF the nprobe it tuned with
    the recall@10 that nprobe reached against exact (Flat) search on a sample of the catalog's own vectors."""
    found = _CHOSEN.search(build_output)
    if found is None:
        return {}
    structure, nprobe, recall, queries = found.groups()
    return {"structure": structure} | ({"nprobe": int(nprobe), "recall_at_10_vs_flat": float(recall),
                                        "recall_queries": int(queries)} if nprobe else {"recall_at_10_vs_flat": 1.0})


def disk_sizes(index_dir: str | Path) -> dict:
    """MiB on disk of the index directory's vector index, n-gram index and embedded store files."""
    sizes = {"vectors_mib": 0.0, "ngrams_mib": 0.0, "store_mib": 0.0}
    for path in Path(index_dir).iterdir():
        key = "vectors_mib" if path.suffix == ".faiss" else "ngrams_mib" if path.suffix == ".npz" else \
            "store_mib" if path.suffix in (".db", ".sqlite") else None
        if key and path.is_file():
            sizes[key] += path.stat().st_size / 2**20
    return sizes


def resident_mib(kind: str = "VmRSS") -> float:
    """This process's resident memory now, MiB: ``VmRSS`` (all of it) or ``RssAnon`` (its own, not file pages
    mapped from disk such as a memory-mapped index's lists, which the page cache shares and can evict)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(kind + r":\s+(\d+) kB", status).group(1)) / 1024


def bench_built_resolve(index_dir: str | Path, catalog: str | Path, *, queries: int = 200, backend: str | None = None,
                        seed: int = 0) -> dict:
    """Single-query resolve latency (top-10 with rerank, warm) on a freshly built index, the queries being catalog
    addresses with their first two characters cut; with the resolver's resident memory (the process's growth
    from opening it and answering them: models, n-gram matrix, index), all of it and its own (anonymous) part."""
    import random

    from mgeo_index.heap import release_freed
    from mgeo_index.query.resolver import open_resolver

    with open(catalog, encoding="utf-8") as fh:
        texts = [line.rstrip("\n").split("\t", 1)[1] for line in fh.readlines()[1:]]
    sample = [t[2:] for t in random.Random(seed).sample(texts, min(queries, len(texts)))]
    del texts
    release_freed()  # as opening the resolver does at its end, so that its growth is not offset by older frees
    before, before_anon = resident_mib(), resident_mib("RssAnon")
    resolver = open_resolver(index_dir, device="cpu", backend=backend)
    report = bench_resolve(resolver, sample)
    # after the queries: what opening and serving them added (models, n-gram matrix, the index as far as touched)
    return report | {"resolver_rss_mib": resident_mib() - before, "resolver_anon_mib": resident_mib("RssAnon") - before_anon}
