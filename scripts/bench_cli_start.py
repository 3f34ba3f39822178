"""Wall time of a command from the shell, side by side with `python -c "import torch"` (`parse` of one
address within 1.6× of importing torch). Commands run interleaved (round 1 of each, then round 2, …) so a burst of
load from other processes falls on all of them; the median and the best of the rounds are reported.

    python scripts/bench_cli_start.py --rounds 7
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "mgeo-index parse ADDRESS": [str(BIN / "mgeo-index"), "parse", "北京朝阳建国路88号"],
    "mgeo-index parse ADDRESS --json": [str(BIN / "mgeo-index"), "parse", "北京朝阳建国路88号", "--json"],
    "mgeo-index --help": [str(BIN / "mgeo-index"), "--help"],
    "mgeo-index jobs --db sqlite://": [str(BIN / "mgeo-index"), "jobs", "--db", "sqlite://"],
    "mgeo-index db current --db sqlite://": [str(BIN / "mgeo-index"), "db", "current", "--db", "sqlite://"],
}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--json", action="store_true")
args = parser.parse_args()
seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
for _ in range(args.rounds):
    for name, command in COMMANDS.items():
        t0 = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds[name].append(time.perf_counter() - t0)
torch_median = statistics.median(seconds["import torch"])
report = {name: {"median_s": round(statistics.median(s), 3), "best_s": round(min(s), 3),
                 "x_import_torch": round(statistics.median(s) / torch_median, 2)} for name, s in seconds.items()}
if args.json:
    print(json.dumps(report, ensure_ascii=False))
else:
    print(f"{'command':40} {'median s':>9} {'best s':>8} {'× import torch (medians)':>26}")
    for name, r in report.items():
        print(f"{name:40} {r['median_s']:9.2f} {r['best_s']:8.2f} {r['x_import_torch']:26.2f}")
