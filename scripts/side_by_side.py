"""Side by side in one run on one machine: this checkout against another version of the code, or the two profiles.

    git worktree add /tmp/release 15d7988
    python scripts/side_by_side.py throughput --release /tmp/release --data ../shared/data
    python scripts/side_by_side.py start --release /tmp/release --rounds 5
    python scripts/side_by_side.py answers --before /tmp/release --index-dir ccks-index --queries 2000
    python scripts/side_by_side.py profiles --index-dir ccks-index --data ../shared/data --pairs 3000 --rows 1000

``throughput`` — each version builds its own index of the same catalog (the first ``--catalog-rows`` CCKS
catalog strings; 0: all 39,627) and measures two views. **As a user runs it** (whole process: start-up, imports
and model loading included, the machine's threads): ``mgeo-index normalize`` of ``--rows`` CCKS queries, all
distinct, and of the same number of rows where each of ``rows / 5`` addresses appears 5 times (order files repeat
a store's address), with ``--workers N`` also in N worker processes (this checkout, against the release's one
process); ``mgeo-index match`` of ``--pairs`` CCKS pairs; a one-shot ``mgeo-index resolve``. **The
resolver alone**: the same normalize jobs with the resolver opened before the clock starts (rows/s, split into the
two networks' forward passes and the rest), and single-query resolve latency (p50 / p99 over ``--queries`` calls
in one warm process). ``bounds`` gives the normalize ratios this checkout would reach if its networks took no
time at all (the release's time per row over this checkout's time outside the networks). Best of ``--rounds``.

``start`` — wall time and peak memory of one-shot commands from the shell (each version builds its own two-entry
index first), beside ``python -c "import torch"``. Rounds interleave the commands, so a burst of load from other
processes falls on all of them; per command the median and best wall time, the median peak resident memory
(``ru_maxrss``) and the median as a multiple of ``import torch``'s.

``answers`` — do two versions give the same answers? Each resolves the same ``--queries`` CCKS queries (a fixed
shuffle of the distinct queries of ``pairs/ccks2021_train.tsv.gz``) against the same index and records every
match's id, label and probabilities; reported: queries whose ranked ids differ, matches whose label differs, the
largest probability difference. A speed change that keeps results must report 0 / 0. ``--backend NAME`` runs this
checkout's side on that backend (``--before .``: a backend against the default, in the same code).

``profiles`` — the two profiles' cost in this checkout, alternating round by round, best of ``--rounds``:
``match`` of the first ``--pairs`` CCKS pairs and ``normalize`` of ``--rows`` distinct CCKS queries over the
index (seconds, rate, peak resident memory of the whole process), and resolve p50 / p99 of ``--queries`` queries
one at a time in one warm process.

Every child process runs the code it is given, and only that code (see ``CHECK``), with this virtual
environment's packages; the CPU kind is printed with the figures.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
from mgeo_index.runtime.plan import torch_plan  # noqa: E402
from mgeo_index.settings import PROFILES, cpu_kind  # noqa: E402

# Every child runs the code it is given, and only that code. ``python -c`` puts its working directory first on
# sys.path (so a child started from this checkout imported this checkout's mgeo_index whatever PYTHONPATH said),
# and this checkout's editable install answers for any module the other code lacks (a release's
# ``import mgeo_index.query`` found this checkout's): the child runs in the code's directory, without the
# editable install's finder, and checks where mgeo_index came from (without that, a "release" figure is this
# checkout measured twice).
CHECK = """
import os, sys
sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", type(f).__name__) != "_EditableFinder"]
import mgeo_index
if not os.path.realpath(mgeo_index.__file__).startswith(os.path.realpath(os.environ["PYTHONPATH"]) + os.sep):
    sys.exit(f"imported {mgeo_index.__file__}, not the code under {os.environ['PYTHONPATH']}")
"""
CLI = "from mgeo_index.cli import app; sys.argv[0] = 'mgeo-index'; app()"

NORMALIZE = r"""
import json, sys, time
try:
    from mgeo_index.jobs import normalize_file
except ImportError:  # versions whose jobs package was called normalize
    from mgeo_index.normalize import normalize_file
try:
    from mgeo_index.query.resolver import open_resolver
except ImportError:  # releases before the query package
    from mgeo_index.resolver import open_resolver
try:
    from mgeo_index.runtime import inference as engine
except ImportError:
    try:  # releases before the runtime package
        from mgeo_index import inference as engine
    except ImportError:  # releases before inference.py
        from mgeo_index import engine
index_dir, rows, out = sys.argv[1:4]
resolver = open_resolver(index_dir, device="cpu")  # loaded before the clock starts, as a server would have it
resolver.resolve(["北京朝阳建国路88号"])
network = {"bi": 0.0, "cross": 0.0}  # seconds in the networks' batched forward passes (tokenizing included)
forward = engine._run


def timed(module, tokenizer, first, second, **options):
    started = time.perf_counter()
    try:
        return forward(module, tokenizer, first, second, **options)
    finally:
        network["bi" if second is None else "cross"] += time.perf_counter() - started


engine._run = timed
started = time.perf_counter()
result = normalize_file(rows, out, index_dir, device="cpu", resolver=resolver, restart=True)
print(json.dumps({"rows": result.rows, "seconds": time.perf_counter() - started, "network": network}))
"""

LATENCY = r"""
import json, sys, time
import numpy as np
try:
    from mgeo_index.query.resolver import open_resolver
except ImportError:  # releases before the query package
    from mgeo_index.resolver import open_resolver
queries = json.loads(sys.argv[2])
profile = {"profile": sys.argv[3]} if len(sys.argv) > 3 else {}  # releases before profiles take none
resolver = open_resolver(sys.argv[1], device="cpu", **profile)
for q in queries[:10]:
    resolver.resolve([q])
times = []
for q in queries:
    t = time.perf_counter(); resolver.resolve([q]); times.append(time.perf_counter() - t)
print(json.dumps({"p50_ms": 1000 * float(np.percentile(times, 50)), "p99_ms": 1000 * float(np.percentile(times, 99))}))
"""

ANSWERS = r"""
import json, sys
try:
    from mgeo_index.query.resolver import open_resolver
except ImportError:  # releases before the query package
    from mgeo_index.resolver import open_resolver
index_dir, queries_file, out, top_k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
queries = json.loads(open(queries_file, encoding="utf-8").read())
resolver = open_resolver(index_dir, device="cpu")
answers = []
for start in range(0, len(queries), 256):
    for matches in resolver.resolve(queries[start : start + 256], top_k=top_k):
        answers.append([[m["id"], m.get("label"), m.get("probabilities")] for m in matches])
open(out, "w", encoding="utf-8").write(json.dumps(answers))
"""


def run(argv: list[str], *, code: Path | None = None, env_extra: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak resident MB, stdout) of one child process; ``code``: run ``argv`` (``python -c``
    arguments) on the mgeo_index of that checkout, PYTHONPATH and working directory both ``code``; ``env_extra``:
    variables set for the child."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (env_extra or {})
    if code is not None:
        env["PYTHONPATH"] = str(code)
        argv = [sys.executable, "-c", CHECK + argv[0], *argv[1:]]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # files: no pipe to fill
        started = time.perf_counter()
        child = subprocess.Popen(argv, env=env, cwd=code or tempfile.gettempdir(), stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            sys.exit(f"{' '.join(map(str, argv))[:300]} failed:\n{err.read()[-3000:]}")
        out.seek(0)
        return seconds, usage.ru_maxrss / 1024, out.read()


def cli(code: Path, *args: str) -> tuple[float, float, str]:
    """One ``mgeo-index`` command of the checkout ``code`` as a user runs it: (seconds, peak MB, stdout)."""
    return run([CLI, *map(str, args)], code=code)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def ccks_pairs(data: Path) -> list[dict]:
    with gzip.open(data / "pairs" / "ccks2021_train.tsv.gz", "rt", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


def shuffled_queries(pair_rows: list[dict], rng: random.Random) -> list[str]:
    queries = list(dict.fromkeys(row["query"] for row in pair_rows))
    rng.shuffle(queries)
    return queries


def write_rows(path: Path, addresses: list[str]) -> None:
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "address"])
        writer.writerows((i, a) for i, a in enumerate(addresses))


def write_pairs(path: Path, pair_rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8", newline="") as fh:
        csv.writer(fh, delimiter="\t").writerows([("a", "b")] + [(r["query"], r["candidate"]) for r in pair_rows])


def keep_best(figures: dict, key: str, value: float, higher: bool = False) -> None:
    if key not in figures or (value > figures[key] if higher else value < figures[key]):
        figures[key] = value


# ---- throughput ----------------------------------------------------------------------------------------------


def throughput(args: argparse.Namespace) -> None:
    rng = random.Random(0)
    with gzip.open(args.data / "catalog" / "ccks2021_poi_candidates.tsv.gz", "rt", encoding="utf-8") as fh:
        catalog = [row["text"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
    catalog = catalog[: args.catalog_rows] if args.catalog_rows else catalog
    pair_rows = ccks_pairs(args.data)
    queries = shuffled_queries(pair_rows, rng)
    distinct = queries[: args.rows]
    repeated = [a for a in queries[args.rows : args.rows + args.rows // 5] for _ in range(5)]
    rng.shuffle(repeated)
    versions = {"release": args.release.resolve(), "this": HERE}
    report: dict[str, dict] = {name: {} for name in versions}
    user: dict[str, dict[str, float]] = {name: {} for name in versions}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_rows(tmp / "catalog.csv", catalog)
        write_rows(tmp / "distinct.csv", distinct)
        write_rows(tmp / "repeated.csv", repeated)
        write_pairs(tmp / "pairs.tsv", pair_rows[: args.pairs])
        for name, code in versions.items():
            report[name]["build_s"] = cli(code, "build", tmp / "catalog.csv", "--index-dir", tmp / name, "--id-column", "id")[0]
        for round_ in range(args.rounds):
            for name, code in versions.items():
                runs = {f"normalize {kind} {args.rows} rows": ("normalize", tmp / f"{kind}.csv", "--index-dir", tmp / name,
                                                               "--out", tmp / f"{name}-{kind}-{round_}.csv")
                        for kind in ("distinct", "repeated")}
                runs[f"match {args.pairs} pairs"] = ("match", "--file", tmp / "pairs.tsv", "--out", tmp / f"{name}-match-{round_}.tsv")
                runs["resolve one address"] = ("resolve", queries[-1], "--index-dir", tmp / name)
                if args.workers and name == "this":  # against the release's own (single-process) normalize
                    for kind in ("distinct", "repeated"):
                        runs[f"normalize {kind} {args.rows} rows --workers {args.workers}"] = (
                            *runs[f"normalize {kind} {args.rows} rows"], "--workers", args.workers)
                for what, command in runs.items():
                    keep_best(user[name], what, cli(code, *command)[0])
                for kind in ("distinct", "repeated"):
                    job = last_json(run([NORMALIZE, str(tmp / name), str(tmp / f"{kind}.csv"), str(tmp / f"{name}-{kind}-out.csv")],
                                        code=code)[2])
                    rate = job["rows"] / job["seconds"]
                    if rate > report[name].get(f"normalize_{kind}_rows_per_s", 0):  # the best run, with its split
                        report[name][f"normalize_{kind}_rows_per_s"] = rate
                        report[name][f"normalize_{kind}_ms_per_row"] = {
                            "all": 1000 * job["seconds"] / job["rows"],
                            **{f"{net} network": 1000 * s / job["rows"] for net, s in job["network"].items()},
                            "the rest": 1000 * (job["seconds"] - sum(job["network"].values())) / job["rows"],
                        }
                latency = last_json(run([LATENCY, str(tmp / name), json.dumps(queries[-args.queries:], ensure_ascii=False)],
                                        code=code)[2])
                for key, value in latency.items():
                    keep_best(report[name], key, value)
    ratios = {
        "normalize_distinct": report["this"]["normalize_distinct_rows_per_s"] / report["release"]["normalize_distinct_rows_per_s"],
        "normalize_repeated": report["this"]["normalize_repeated_rows_per_s"] / report["release"]["normalize_repeated_rows_per_s"],
        "resolve_p50": report["this"]["p50_ms"] / report["release"]["p50_ms"],
    }
    # What the normalize ratios could be if this version's networks took no time at all: the release's time per
    # row over this version's time outside the networks (parsing, features, sparse search, store, the job's I/O).
    bounds = {
        f"normalize_{kind}_if_networks_were_free": report["release"][f"normalize_{kind}_ms_per_row"]["all"]
        / report["this"][f"normalize_{kind}_ms_per_row"]["the rest"]
        for kind in ("distinct", "repeated")
    }
    as_user = {}
    for what in user["this"]:
        release = user["release"][what.split(" --workers")[0]]
        as_user[what] = {"release_s": round(release, 2), "this_s": round(user["this"][what], 2),
                         "speed-up": round(release / user["this"][what], 2)}
    print(json.dumps({"cpu": cpu_kind(), "cores": os.cpu_count(), "catalog_rows": len(catalog),
                      "versions": {k: str(v) for k, v in versions.items()}, "as_a_user_runs_it": as_user,
                      "resolver_alone": {"report": report, "ratios": ratios, "bounds": bounds}}, indent=2, ensure_ascii=False))
    print(f"\nas a user runs it, CPU {cpu_kind()}, {os.cpu_count()} cores, catalog {len(catalog):,} entries, "
          f"best of {args.rounds}:")
    for what, row in as_user.items():
        print(f"  {what:45} release {row['release_s']:7.2f} s   this {row['this_s']:7.2f} s   {row['speed-up']:5.2f}x")
    release, this = report["release"], report["this"]
    print(f"\nthe resolver alone (opened before the clock starts), best of {args.rounds}; speed-up = this over the release:")
    for kind in ("distinct", "repeated"):
        key = f"normalize_{kind}_rows_per_s"
        print(f"  {'normalize ' + kind + ', rows/s':45} release {release[key]:7.1f}     this {this[key]:7.1f}     "
              f"{this[key] / release[key]:5.2f}x")
    print(f"  {'resolve one query a call, p50 / p99 ms':45} release {release['p50_ms']:5.1f} / {release['p99_ms']:<5.1f} "
          f"this {this['p50_ms']:5.1f} / {this['p99_ms']:<5.1f} {release['p50_ms'] / this['p50_ms']:5.2f}x")
    print(f"  were this version's networks free: normalize distinct {bounds['normalize_distinct_if_networks_were_free']:.2f}x, "
          f"repeated {bounds['normalize_repeated_if_networks_were_free']:.2f}x")


# ---- start ---------------------------------------------------------------------------------------------------

START_CATALOG = "id,address\n1,杭州市西湖区文三路478号\n2,北京市朝阳区建国路88号\n"
START_ADDRESS = "杭州西湖文三路478号"


def start_commands(index_dir: Path) -> dict[str, list[str]]:
    return {
        "resolve ADDRESS": ["resolve", START_ADDRESS, "--index-dir", str(index_dir)],
        "resolve ADDRESS --json": ["resolve", START_ADDRESS, "--index-dir", str(index_dir), "--json"],
        "parse ADDRESS": ["parse", START_ADDRESS],
        "--help": ["--help"],
    }


def start(args: argparse.Namespace) -> None:
    versions = {"this checkout": HERE} | ({"release": args.release.resolve()} if args.release else {})
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Path(tmp) / "catalog.csv"
        catalog.write_text(START_CATALOG, encoding="utf-8")
        jobs: dict[str, tuple[list[str], Path | None]] = {"import torch": ([sys.executable, "-c", "import torch"], None)}
        for version, code in versions.items():
            index_dir = Path(tmp) / f"index-{len(jobs)}"
            cli(code, "build", catalog, "--index-dir", index_dir)
            commands = start_commands(index_dir)
            for name, argv in commands.items():
                jobs[f"{version}: mgeo-index {name}"] = ([CLI, *argv], code)
            if version == "this checkout":  # beside the one-shot default: the models as torch modules
                backend = torch_plan().backend
                argv = [*commands["resolve ADDRESS"], "--backend", backend]
                jobs[f"{version}: mgeo-index resolve ADDRESS --backend {backend}"] = ([CLI, *argv], code)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in jobs}
        for _ in range(args.rounds):
            for name, (argv, code) in jobs.items():
                samples[name].append(run(argv, code=code)[:2])
    torch_median = statistics.median(s for s, _ in samples["import torch"])
    report = {name: {"median_s": round(statistics.median(s for s, _ in runs), 3),
                     "best_s": round(min(s for s, _ in runs), 3),
                     "peak_mb": round(statistics.median(m for _, m in runs)),
                     "x_import_torch": round(statistics.median(s for s, _ in runs) / torch_median, 2)}
              for name, runs in samples.items()}
    header = {"cpu": cpu_kind(), "cores": os.cpu_count(), "rounds": args.rounds,
              "versions": {k: str(v) for k, v in versions.items()}}
    if args.json:
        print(json.dumps({**header, "report": report}, ensure_ascii=False))
        return
    print(f"CPU {header['cpu']}, {header['cores']} cores, {args.rounds} rounds")
    print(f"{'command':60} {'median s':>9} {'best s':>7} {'peak MB':>8} {'x import torch':>15}")
    for name, r in report.items():
        print(f"{name:60} {r['median_s']:9.2f} {r['best_s']:7.2f} {r['peak_mb']:8d} {r['x_import_torch']:15.2f}")


# ---- answers -------------------------------------------------------------------------------------------------


def answers(args: argparse.Namespace) -> None:
    queries = shuffled_queries(ccks_pairs(args.data), random.Random(0))[: args.queries]
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        queries_file = Path(tmp) / "queries.json"
        queries_file.write_text(json.dumps(queries, ensure_ascii=False), encoding="utf-8")
        for name, code in (("before", args.before.resolve()), ("after", HERE)):
            out = Path(tmp) / f"{name}.json"
            chosen = {"MGEO_INDEX_BACKEND": args.backend} if name == "after" and args.backend else None
            run([ANSWERS, str(args.index_dir.resolve()), str(queries_file), str(out), str(args.top_k)], code=code,
                env_extra=chosen)
            found[name] = json.loads(out.read_text(encoding="utf-8"))
    before, after = found["before"], found["after"]
    rankings = sum([m[0] for m in a] != [m[0] for m in b] for a, b in zip(before, after))
    labels = matches = 0
    largest = 0.0
    for a, b in zip(before, after):
        by_id = {m[0]: m for m in b}
        for id_, label, probs in a:
            other = by_id.get(id_)
            if other is None:
                continue
            matches += 1
            labels += label != other[1]
            if probs and other[2]:
                largest = max(largest, *(abs(probs[k] - other[2][k]) for k in probs))
    print(json.dumps({"queries": len(queries), "top_k": args.top_k, "rankings_differ": rankings,
                      "matches_compared": matches, "labels_differ": labels, "largest_probability_difference": largest,
                      "before": str(args.before), "after": str(HERE) + (f" --backend {args.backend}" if args.backend else "")},
                     indent=2))


# ---- profiles ------------------------------------------------------------------------------------------------


def profiles(args: argparse.Namespace) -> None:
    pair_rows = ccks_pairs(args.data)
    queries = shuffled_queries(pair_rows, random.Random(0))
    report: dict[str, dict] = {profile: {} for profile in PROFILES}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_pairs(tmp / "pairs.tsv", pair_rows[: args.pairs])
        write_rows(tmp / "rows.csv", queries[: args.rows])
        index_dir = args.index_dir.resolve()
        for round_ in range(args.rounds):
            for profile in PROFILES:
                figures = report[profile]
                seconds, peak, _ = cli(HERE, "match", "--file", tmp / "pairs.tsv", "--out", tmp / f"{profile}-{round_}.tsv",
                                       "--profile", profile)
                if seconds < figures.get("match_s", float("inf")):
                    figures.update(match_s=seconds, match_pairs_per_s=args.pairs / seconds, match_peak_mb=peak)
                seconds, peak, _ = cli(HERE, "normalize", tmp / "rows.csv", "--index-dir", index_dir,
                                       "--out", tmp / f"{profile}-{round_}.csv", "--profile", profile)
                if seconds < figures.get("normalize_s", float("inf")):
                    figures.update(normalize_s=seconds, normalize_rows_per_s=args.rows / seconds, normalize_peak_mb=peak)
                latency = last_json(run([LATENCY, str(index_dir), json.dumps(queries[-args.queries:], ensure_ascii=False),
                                         profile], code=HERE)[2])
                for key, value in latency.items():
                    keep_best(figures, key, value)
    rounded = {p: {k: round(v, 1) for k, v in f.items()} for p, f in report.items()}
    print(json.dumps({"cpu": cpu_kind(), "cores": os.cpu_count(), "pairs": args.pairs, "rows": args.rows,
                      "queries": args.queries, "rounds": args.rounds, "profiles": rounded}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data = HERE.parent / "shared" / "data"
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("throughput", help="normalize / match / resolve against a release, both views")
    p.add_argument("--release", type=Path, required=True, help="a checkout of the release to compare with")
    p.add_argument("--data", type=Path, default=data)
    p.add_argument("--catalog-rows", type=int, default=3000, help="0: the whole CCKS catalog")
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--pairs", type=int, default=5000, help="CCKS pairs for the match figure")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=0, help="also normalize in this many worker processes (this checkout)")
    p.set_defaults(run=throughput)
    p = sub.add_parser("start", help="one-shot commands' wall time and peak memory")
    p.add_argument("--release", type=Path, help="a checkout of an earlier release, run side by side")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=start)
    p = sub.add_parser("answers", help="labels and rankings of two versions on the same queries")
    p.add_argument("--before", type=Path, required=True, help="a checkout of the version to compare with")
    p.add_argument("--index-dir", type=Path, required=True)
    p.add_argument("--data", type=Path, default=data)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--backend", help="this checkout resolves with this backend (MGEO_INDEX_BACKEND); with --before . "
                                     "it is compared with the default one")
    p.set_defaults(run=answers)
    p = sub.add_parser("profiles", help="the default and accurate profiles' cost")
    p.add_argument("--index-dir", type=Path, required=True, help="an index of the CCKS catalog")
    p.add_argument("--data", type=Path, default=data)
    p.add_argument("--pairs", type=int, default=3000)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.set_defaults(run=profiles)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
