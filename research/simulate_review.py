"""A simulated reviewer for `mgeo-index adapt`: does refitting on a few hundred labels teach the shipped
cross-encoder a labelling policy it was not calibrated for, and do the review queue's labels teach more
than labels picked at random?

The reviewer labels like CCKS2021 round 1 (`pairs/ccks2021_round1_extra.tsv.gz`: about 4% exact_match,
where round 2, which the shipped model was calibrated for, has about 20%). Its queries are split (by query
text, seeded) into a review pool and a test part. Each pool pair is an item; the queue orders them as the
review page does (`mgeo_index.review.uncertainty`: smallest margin first, then the largest disagreement
between the network and the feature head). The first 100 / 300 / 1,000 become labels and go through the
same library function `mgeo-index adapt` runs (`mgeo_index.training.adapt.adapt_model`: labels dedup,
a held-back fifth, refit with the shipped calibration replay); the test part's macro-F1 and exact_match F1
are measured before and after, against the same numbers of labels drawn at random (mean of 3 seeds).
CCKS dev (the shipped model's reported split) checks that the adapted model did not forget round 2.

    python research/simulate_review.py --data ../shared/data --markdown /tmp/w/readme_adapt.md
    python research/simulate_review.py --data ../shared/data --policy lenient --markdown /tmp/w/lenient.md
    python research/simulate_review.py --data ../shared/data --sizes 300 --label-weights 3,10,30 --epochs 0  # the weight
"""
import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import numpy as np

from mgeo_index import settings
from mgeo_index.query.labelling import component_probabilities
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.review.uncertainty import disagreement, margin
from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import adapt, data

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
parser.add_argument("--sizes", default="100,300,1000", help="numbers of labels")
parser.add_argument("--random-seeds", type=int, default=3, help="random draws averaged per size")
parser.add_argument("--label-weights", default=str(adapt.LABEL_WEIGHT), help="label weights to compare (comma-separated)")
parser.add_argument("--epochs", type=int, default=adapt.HEAD_EPOCHS)
parser.add_argument("--seed", type=int, default=0, help="pool / test split and adapt seed")
parser.add_argument("--policy", choices=("round1", "lenient"), default="round1",
                    help="round1: the file's labels as they are; lenient: a reviewer for whom a partial match (a shop "
                         "inside the mall, a building of the estate) is the same place: partial_match → exact_match")
parser.add_argument("--markdown", type=Path, help="also write the table here")
args = parser.parse_args()

cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
replay = adapt.load_replay(adapt.default_replay_path(), cross)

# the reviewer's pairs, split by query text
extra = data.ccks_extra_pairs(args.data)
if args.policy == "lenient":
    extra = [dataclasses.replace(p, label="exact_match") if p.label == "partial_match" else p for p in extra]
queries = sorted({p.a for p in extra})
random.Random(args.seed).shuffle(queries)
pool_queries = set(queries[: len(queries) // 2])
pool = [p for p in extra if p.a in pool_queries]
test = [p for p in extra if p.a not in pool_queries]


def numbers(pairs):
    """Examples (features, network logits) of data.Pair's, for measuring without rescoring."""
    return adapt.examples_of(cross, [(normalize(p.a), normalize(p.b), p.label) for p in pairs])


test_x = numbers(test)
# CCKS dev as the shipped model was calibrated for (a lenient reviewer's model is meant to leave it)
dev_x = numbers([p for p in data.ccks_pairs(args.data) if split_of(p.group) == "dev"])

# the queue's order over the pool: margin of the pair's probabilities, then network / feature head disagreement
pool_x = numbers(pool)
probs = adapt.probabilities(cross, pool_x.network_logits, pool_x.features)
network, features_only = component_probabilities(cross, pool_x.a, pool_x.b, device="cpu", features=pool_x.features)
keys = [(margin(probs[i][None, :]), -disagreement(network[i], features_only[i]), i) for i in range(len(pool))]
queue = [i for *_, i in sorted(keys)]


def label_rows(rows):
    """The pool pairs ``rows`` as the store's label rows (what `adapt` reads with store.list_labels)."""
    return [{"query": pool[i].a, "query_normalized": normalize(pool[i].a), "entry_address": pool[i].b,
             "label": pool[i].label} for i in rows]


def run(rows, weight):
    started = time.perf_counter()
    model, figures = adapt.adapt_model(cross, adapt.labelled_pairs(label_rows(rows)), replay, epochs=args.epochs,
                                       label_weight=weight, seed=args.seed)
    seconds = time.perf_counter() - started
    test_report = adapt.report(model, test_x.network_logits, test_x.features, test_x.gold)
    dev_report = adapt.report(model, dev_x.network_logits, dev_x.features, dev_x.gold)
    return {"macro_f1": test_report["macro_f1"], "exact_f1": test_report["f1"]["exact_match"],
            "dev_macro_f1": dev_report["macro_f1"], "held_back_after": figures["after"].get("macro_f1"),
            "seconds": seconds}


def mean(results):
    return {k: float(np.mean([r[k] for r in results])) for k in results[0]}


shipped_test = adapt.report(cross, test_x.network_logits, test_x.features, test_x.gold)
shipped_dev = adapt.report(cross, dev_x.network_logits, dev_x.features, dev_x.gold)
counts = {label: int(sum(p.label == label for p in pool)) for label in LABELS}
print(json.dumps({"policy": args.policy, "pool_pairs": len(pool), "test_pairs": len(test), "pool_labels": counts,
                  "shipped_test": shipped_test, "shipped_ccks_dev": shipped_dev["macro_f1"]}, ensure_ascii=False))

sizes = [int(s) for s in args.sizes.split(",")]
weights = [int(w) for w in args.label_weights.split(",")]
lines = [
    "| labels | label weight | chosen by | test macro-F1 | Δ vs shipped | test exact F1 | CCKS dev macro-F1 | adapt s |",
    "|---:|---:|---|---:|---:|---:|---:|---:|",
    f"| 0 (shipped) | – | – | {shipped_test['macro_f1']:.3f} | – | {shipped_test['f1']['exact_match']:.3f} | "
    f"{shipped_dev['macro_f1']:.3f} | – |",
]
results = {}
for size in sizes:
    for weight in weights:
        chosen = {"queue": run(queue[:size], weight),
                  f"random (mean of {args.random_seeds})": mean([run(random.Random(s).sample(range(len(pool)), size), weight)
                                                                 for s in range(args.random_seeds)])}
        for how, r in chosen.items():
            results[f"{size}/{weight}/{how}"] = r
            lines.append(f"| {size} | {weight} | {how} | {r['macro_f1']:.3f} | {r['macro_f1'] - shipped_test['macro_f1']:+.3f} | "
                         f"{r['exact_f1']:.3f} | {r['dev_macro_f1']:.3f} | {r['seconds']:.0f} |")
            print(lines[-1], flush=True)
table = "\n".join(lines)
print()
print(table)
print(json.dumps(results))
if args.markdown:
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(table + "\n")
