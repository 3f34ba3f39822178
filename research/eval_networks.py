"""CCKS2021 dev macro-F1 of cross-encoder *networks alone* (no feature head, no cascade), per source.

Each network's decision offsets are fitted on the calibration split (all CCKS sources), then applied to the
dev split; this is how the teacher's learning curve is compared with the shipped network and with a
student. A model is a saved cross-encoder folder, or ``teacher:PATH`` for a teacher checkpoint / snapshot
(``cross_best.pt``, ``cross_checkpoint.pt`` or ``teacher/cross-snapshot.safetensors``).

``--stack`` also reports what each network adds to the shipped feature head: the head alone, the head with each
network, and the head with all of them, each combination's weights (one per network, one for the head, a bias per
label) and decision offsets fitted on the calibration split, as the shipped stack is.

    OMP_NUM_THREADS=1 python research/eval_networks.py --data ../shared/data --stack \\
        mgeo_index/model/default/cross teacher:teacher/cross-snapshot.safetensors
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from mgeo_index.query import labelling
from mgeo_index.measure.metrics import classification_report
from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data
from mgeo_index.training.calibrate import column_stack, fit_column_stack, fit_decision_offsets, fit_temperature


def load_network(spec: str):
    """A CrossEncoder without feature head from a folder or ``teacher:PATH``."""
    from mgeo_index.model.cross_encoder import load_cross_encoder

    if not spec.startswith("teacher:"):
        cross = load_cross_encoder(spec, stacked=False)
        cross.feature_head, cross.gate = None, None
        return cross
    from mgeo_index.training.teacher import load_teacher

    return load_teacher(spec.removeprefix("teacher:"))


def evaluate(cross, calib, dev) -> dict:
    cross.temperature, cross.decision_offsets = 1.0, None
    gold_c = np.array([g for _, _, g, _ in calib])
    logp = np.log(np.clip(labelling.score_pairs(cross, [a for a, *_ in calib], [b for _, b, *_ in calib]), 1e-12, 1))
    cross.temperature = fit_temperature(logp, gold_c)
    offsets = fit_decision_offsets(np.exp(logp / cross.temperature) / np.exp(logp / cross.temperature).sum(1, keepdims=True),
                                   gold_c, list(LABELS))
    probs = labelling.score_pairs(cross, [a for a, *_ in dev], [b for _, b, *_ in dev])
    pred = np.argmax(np.log(np.clip(probs, 1e-12, 1)) + np.array(offsets), axis=1)
    return {"temperature": round(float(cross.temperature), 3), "offsets": [round(float(o), 2) for o in offsets],
            "dev_macro_f1": dev_report(pred, dev)}


def dev_report(pred: np.ndarray, dev) -> dict:
    out = {}
    for source in ["all", *sorted({s for *_, s in dev})]:
        keep = [i for i, (*_, s) in enumerate(dev) if source in ("all", s)]
        out[source] = round(classification_report([dev[i][2] for i in keep], pred[keep], list(LABELS))["macro_f1"], 4)
    return out


def stacked(columns: dict[str, dict[str, np.ndarray]], calib, dev) -> dict:
    """Weights (one per column) and a per-label bias fitted by L-BFGS on calib NLL, decision offsets for
    macro-F1 on calib; the dev macro-F1 per source."""
    import torch
    import torch.nn.functional as F

    names = list(columns)
    x = {split: torch.tensor(np.stack([columns[n][split] for n in names])) for split in ("calib", "dev")}
    gold = torch.tensor([g for _, _, g, _ in calib])
    params = fit_column_stack(list(x["calib"]), gold)

    def combined(split: str) -> torch.Tensor:
        return column_stack(params, list(x[split]))

    nll = float(F.cross_entropy(combined("calib"), gold))
    probs = {split: torch.softmax(combined(split), 1).numpy() for split in ("calib", "dev")}
    offsets = fit_decision_offsets(probs["calib"], gold.numpy(), list(LABELS))
    pred = np.argmax(np.log(np.clip(probs["dev"], 1e-12, 1)) + offsets, axis=1)
    return {"weights": dict(zip(names, [round(float(w), 3) for w in params[: len(names)]])),
            "calib_nll": round(nll, 4), "dev_macro_f1": dev_report(pred, dev)}


def stack_report(specs: list[str], examples: dict) -> dict:
    """The shipped feature head alone, with each network, with all of them (see the module docstring)."""
    import torch

    from mgeo_index.compare.features import pair_features_batch
    from mgeo_index.model.cross_encoder import load_cross_encoder
    from mgeo_index.training.calibrate import pair_logits

    head = load_cross_encoder(Path(__file__).resolve().parents[1] / "mgeo_index" / "model" / "default" / "cross").feature_head
    columns = {"feature head": {}}
    for split, rows in examples.items():
        with torch.inference_mode():
            x = torch.from_numpy(pair_features_batch([a for a, *_ in rows], [b for _, b, *_ in rows]))
            columns["feature head"][split] = head(x).double().numpy()
    for spec in specs:
        cross = load_network(spec)
        columns[spec] = {split: pair_logits(cross, [(a, b, g) for a, b, g, _ in rows]) for split, rows in examples.items()}
    out = {"feature head alone": stacked({"feature head": columns["feature head"]}, examples["calib"], examples["dev"])}
    for spec in specs:
        out[f"feature head + {spec}"] = stacked({k: columns[k] for k in ("feature head", spec)}, examples["calib"], examples["dev"])
    if len(specs) > 1:
        out["feature head + all"] = stacked(columns, examples["calib"], examples["dev"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--stack", action="store_true", help="also stack each network with the shipped feature head")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    examples = {"calib": [], "dev": []}
    for p in data.ccks_pairs(args.data):
        split = split_of(p.group)
        if split in examples:
            examples[split].append((normalize(p.a), normalize(p.b), LABELS.index(p.label), p.source))
    results = {}
    for spec in args.models:
        started = time.perf_counter()
        results[spec] = evaluate(load_network(spec), examples["calib"], examples["dev"])
        results[spec]["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps({spec: results[spec]}, ensure_ascii=False), flush=True)
    if args.stack:
        results["stacked"] = stack_report(args.models, examples)
        for name, row in results["stacked"].items():
            print(json.dumps({name: row}, ensure_ascii=False), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
