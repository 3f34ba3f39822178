"""Calibrate an existing cross-encoder again on the shared data's calibration split, in place.

`mgeo-index train` ends with this step; run it alone when the features or the parser changed (the
model then refuses to load and names this script), or after swapping in another network:
temperature, the feature head and its stacking weights, the label decision offsets and the group head.
`--decision-only` refits just the decision offsets and the group head (a few minutes); `--numbers-only` just the
number policy (seconds); `--gate-only` just the group head's gate (which pairs `match` labels without the
network; a minute or two); `--replay-only` refits nothing and writes the calibration replay `mgeo-index adapt`
refits with (the calibration pairs as numbers only: the network's logits, the pair features, the gold label and
the source, plus the network's fingerprint and the parser version; no address text) into the model directory —
run it whenever the network or the parser changes (`adapt` refuses a replay of another network or parser).
The group head's stack and offsets are fitted on the calibration and dev splits, so its figures are
cross-validated (`group_head_cv`). `--metrics` records the new calibration, the dev and holdout figures and the
new fingerprint in that metrics.json (the shipped model's, for instance).

    python scripts/recalibrate.py --model mgeo_index/model/default/cross --data ../shared/data \
        --metrics mgeo_index/model/default/metrics.json
    python scripts/recalibrate.py --model mgeo_index/model/default/cross --data ../shared/data --replay-only
    python scripts/recalibrate.py --model mgeo_index/model/default/cross --data ../shared/data \
        --metrics mgeo_index/model/default/metrics.json --metrics-only
"""
import argparse
import datetime
import json
import time
from pathlib import Path

from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.training import data
from mgeo_index.training.adapt import write_replay
from mgeo_index.training.calibrate import refit_number_policy
from mgeo_index.training.recalibrate import recalibrate
from mgeo_index.training.group import cross_validate, group_head_pairs, refit_group_gate
from mgeo_index.training.train import evaluate_pairs, evaluate_split_retrieval


def record(metrics_path: Path, model: Path, data_dir: Path, stats: dict | None, kept_stage: bool) -> None:
    """Measure the model's dev and holdout figures into ``metrics_path``; ``stats``: what was refitted (None:
    nothing), merged into the recorded calibration stage (``kept_stage``) or replacing it."""
    metrics = json.loads(metrics_path.read_text())
    cross = load_cross_encoder(model)
    if stats is not None:
        stage = metrics["stages"]["calibration"] if kept_stage else {}
        metrics["stages"]["calibration"] = stage | stats | {"refitted": f"scripts/recalibrate.py, {datetime.date.today()}"}
    ccks, shenzhen = data.ccks_pairs(data_dir), data.shenzhen_pairs(data_dir)
    round2 = [p for p in ccks if p.source == "round2_train"]
    metrics["ccks_dev"] = evaluate_pairs(cross, ccks)  # each query's candidates together
    metrics["ccks_dev_pairwise"] = evaluate_pairs(cross, ccks, grouped=False)
    for source in ("round2_train", "round1_train_fold0"):  # the held-out pairs are all round 2: report by source
        pairs = [p for p in ccks if p.source == source]
        metrics.setdefault("ccks_dev_by_source", {})[source] = {
            "grouped": evaluate_pairs(cross, pairs), "pairwise": evaluate_pairs(cross, pairs, grouped=False)}
    metrics["shenzhen_dev"] = evaluate_pairs(cross, shenzhen)
    metrics["holdout"] = {  # read by no fitting or choice (mgeo_index/measure/splits.py)
        "ccks": evaluate_pairs(cross, ccks, "holdout"),
        "ccks_pairwise": evaluate_pairs(cross, ccks, "holdout", grouped=False),
        "ccks_round2": evaluate_pairs(cross, round2, "holdout"),
        "shenzhen": evaluate_pairs(cross, shenzhen, "holdout")}
    bi_path = metrics_path.parent / "bi"
    if (bi_path / "config.json").is_file():  # the bi-encoder beside it: dense retrieval of each split's queries
        bi, catalog = load_bi_encoder(bi_path), data.ccks_catalog(data_dir)
        metrics["ccks_dev_retrieval"] = evaluate_split_retrieval(bi, ccks, catalog)
        metrics["holdout"]["ccks_retrieval"] = evaluate_split_retrieval(bi, ccks, catalog, "holdout")
    if cross.group_head is not None:  # its stack and offsets saw the dev split: measured out of fold
        metrics["group_head_cv"] = cross_validate(cross, group_head_pairs(data_dir)[1]) | {
            "command": "python research/eval_group_head.py --data ../shared/data"}
    metrics["fingerprints"]["cross"] = cross.fingerprint
    metrics_path.write_text(json.dumps(metrics, ensure_ascii=False, indent=2) + "\n")
    print(json.dumps({k: metrics[k]["macro_f1"] for k in ("ccks_dev", "ccks_dev_pairwise", "shenzhen_dev")}
                     | {f"{s} {k}": r["macro_f1"] for s, by in metrics["ccks_dev_by_source"].items() for k, r in by.items()}
                     | {f"holdout {k}": r["macro_f1"] for k, r in metrics["holdout"].items() if "macro_f1" in r}))


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", type=Path, required=True, help="cross-encoder directory (rewritten in place)")
parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
parser.add_argument("--decision-only", action="store_true", help="refit only the label decision offsets and the group head")
parser.add_argument("--numbers-only", action="store_true",
                    help="refit only the number policy (how pairs whose numbers conflict are scored), in the manifest")
parser.add_argument("--gate-only", action="store_true",
                    help="refit only the group head's gate (the pairs match labels without the network), in the manifest")
parser.add_argument("--head", choices=("mlp", "trees"), default="mlp",
                    help="the feature head: averaged MLPs (shipped) or gradient-boosted trees (measured, not "
                         "shipped: see the README)")
parser.add_argument("--replay-only", action="store_true",
                    help="refit nothing: write the calibration replay `mgeo-index adapt` refits with into the model")
parser.add_argument("--metrics", type=Path, help="metrics.json to update with the calibration, dev and holdout figures")
parser.add_argument("--metrics-only", action="store_true",
                    help="refit nothing: measure the dev and holdout figures into --metrics (after the splits changed)")
args = parser.parse_args()
if args.replay_only:
    started = time.perf_counter()
    print(json.dumps(write_replay(args.model, args.data) | {"seconds": round(time.perf_counter() - started, 1)},
                     ensure_ascii=False))
    raise SystemExit
if args.metrics_only:
    if args.metrics is None:
        parser.error("--metrics-only needs --metrics FILE")
    record(args.metrics, args.model, args.data, None, True)
    raise SystemExit
if args.numbers_only:
    stats = {"number_policy": refit_number_policy(args.model, args.data)}
elif args.gate_only:
    stats = {"group_head_gate": refit_group_gate(args.model, args.data)}
else:
    stats = recalibrate(args.model, args.data, decision_only=args.decision_only, head=args.head)
print(json.dumps(stats, ensure_ascii=False))
if args.metrics:
    record(args.metrics, args.model, args.data, stats, args.decision_only or args.numbers_only or args.gate_only)
