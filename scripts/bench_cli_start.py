"""Wall time and peak memory of one-shot commands from the shell, side by side with ``python -c "import torch"``
and, with ``--release``, with an earlier release's code on the same machine in the same run.

    git worktree add /tmp/release 15d7988
    python scripts/bench_cli_start.py --release /tmp/release --rounds 5

Each code version builds its own two-entry index first; then every command runs once per round, rounds
interleaved (round 1 of each, then round 2, …) so a burst of load from other processes falls on all of them.
Reported per command: the median and best wall time over the rounds, the median peak resident memory of the
process (``ru_maxrss``), and the median as a multiple of ``import torch``'s. Commands run as ``python -m
mgeo_index.cli`` with ``PYTHONPATH`` set to each version's checkout, so both use this environment's packages.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
from mgeo_index.settings import cpu_kind  # noqa: E402

CATALOG = "id,address\n1,杭州市西湖区文三路478号\n2,北京市朝阳区建国路88号\n"
ADDRESS = "杭州西湖文三路478号"


def commands(index_dir: Path) -> dict[str, list[str]]:
    return {
        "resolve ADDRESS": ["resolve", ADDRESS, "--index-dir", str(index_dir)],
        "resolve ADDRESS --json": ["resolve", ADDRESS, "--index-dir", str(index_dir), "--json"],
        "parse ADDRESS": ["parse", ADDRESS],
        "--help": ["--help"],
    }


def run(argv: list[str], code: Path | None) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of one child process."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if code is not None:
        env["PYTHONPATH"] = str(code)
        argv = [sys.executable, "-m", "mgeo_index.cli", *argv]
    started = time.perf_counter()
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tempfile.gettempdir())
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{child.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, help="a checkout of an earlier release, run side by side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    versions = {"this checkout": HERE} | ({"release": args.release.resolve()} if args.release else {})
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Path(tmp) / "catalog.csv"
        catalog.write_text(CATALOG, encoding="utf-8")
        jobs = {"import torch": ([sys.executable, "-c", "import torch"], None)}
        for version, code in versions.items():
            index_dir = Path(tmp) / f"index-{len(jobs)}"
            run(["build", str(catalog), "--index-dir", str(index_dir)], code)
            for name, argv in commands(index_dir).items():
                jobs[f"{version}: mgeo-index {name}"] = (argv, code)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in jobs}
        for _ in range(args.rounds):
            for name, (argv, code) in jobs.items():
                samples[name].append(run(argv, code))
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
    print(f"{'command':52} {'median s':>9} {'best s':>7} {'peak MB':>8} {'x import torch':>15}")
    for name, r in report.items():
        print(f"{name:52} {r['median_s']:9.2f} {r['best_s']:7.2f} {r['peak_mb']:8d} {r['x_import_torch']:15.2f}")


if __name__ == "__main__":
    main()
