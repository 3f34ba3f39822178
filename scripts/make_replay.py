"""Write the calibration replay that `mgeo-index adapt` refits with, beside the cross-encoder it is for.

The shipped cross-encoder was calibrated on the calibration split of the CCKS2021 and Shenzhen pairs
(`mgeo_index.training.calibrate`). The replay keeps those pairs as numbers only — the network's logits,
the pair features, the gold label and the source — plus the model's fingerprint, the network's
fingerprint and the parser version: no address text, so it ships with the package and `adapt` replays
the original calibration at a user's site. Run it again whenever the cross-encoder or the parser changes
(`adapt` refuses a replay of another network or parser and names this script).

    python scripts/make_replay.py --data ../shared/data
    python scripts/make_replay.py --data ../shared/data --cross-model runs/train/cross
"""
import argparse
import json
import time
from pathlib import Path

from mgeo_index import settings
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.measure.splits import split_of
from mgeo_index.training import data
from mgeo_index.training.adapt import REPLAY_FILE, load_replay, make_replay, save_replay

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
parser.add_argument("--cross-model", type=Path, default=settings.DEFAULT_CROSS_MODEL,
                    help="cross-encoder directory (default: the shipped one); the replay is written into it")
parser.add_argument("--out", type=Path, help=f"output file (default: <cross-model>/{REPLAY_FILE})")
args = parser.parse_args()

started = time.perf_counter()
cross = load_cross_encoder(args.cross_model)
# the pairs calibrate.calibrate fits on: CCKS (three-way) and Shenzhen (binary), calibration split
pairs = [(p.a, p.b, p.label, p.source) for p in data.ccks_pairs(args.data) + data.shenzhen_pairs(args.data)
         if split_of(p.group) == "calib"]
replay = make_replay(cross, pairs)
out = args.out or args.cross_model / REPLAY_FILE
save_replay(replay, out)
check = load_replay(out, cross)
sources = {str(s): int((check.source == s).sum()) for s in sorted(set(check.source.tolist()))}
print(json.dumps({"out": str(out), "pairs": len(check), "bytes": out.stat().st_size, "sources": sources,
                  "fingerprint": check.meta["fingerprint"], "network_fingerprint": check.meta["network_fingerprint"],
                  "parser": check.meta["parser"], "seconds": round(time.perf_counter() - started, 1)}, ensure_ascii=False))
