"""Two ways to retrain the shipped cross-encoder's network, measured for issues #14 and #16 (neither shipped):

- ``--mode student --layers 0,3``: a smaller network made of some of the shipped network's layers (embeddings,
  pooler and classifier copied), distilled on the shipped network's logits over the train split (0.7 · KL to
  its probabilities + 0.3 · class-weighted cross-entropy on the labels); the weights closest to the shipped
  network on the calibration split (lowest KL) are kept;
- ``--mode residual``: the shipped network fine-tuned on the *residual* of the stacked feature head: the loss is
  taken on ``network logits + feature-head logits`` (the head fixed), over every labelled pair of the train split
  (per-source weights as the teacher's), so that the network learns what the features miss.

The output folder is an uncalibrated cross-encoder: calibrate and score it as the shipped one,

    OMP_NUM_THREADS=1 python scripts/finetune_network.py --mode student --layers 0,3 --minutes 20 --out runs/student2
    python scripts/recalibrate.py --model runs/student2 --data ../shared/data
    mgeo-index eval pairs ../shared/data/pairs/ccks2021_train.tsv.gz --split dev --source round2_train --cross-model runs/student2
"""
import argparse
import copy
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mgeo_index.features import pair_features_batch
from mgeo_index.model.cross_encoder import CrossEncoder, load_cross_encoder
from mgeo_index.settings import LABELS
from mgeo_index.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data
from mgeo_index.training.calibrate import pair_logits
from mgeo_index.training.loops import class_weights, shuffled_batches, timed_loop
from mgeo_index.training.teacher import SOURCE_WEIGHTS

SHIPPED = Path(__file__).resolve().parents[1] / "mgeo_index" / "model" / "default" / "cross"

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--mode", choices=("student", "residual"), required=True)
parser.add_argument("--layers", default="0,3", help="student: the shipped network's layers kept, in order")
parser.add_argument("--minutes", type=float, default=20.0)
parser.add_argument("--lr", type=float, default=None, help="peak learning rate (student 1e-4, residual 5e-5)")
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
lr = args.lr or (1e-4 if args.mode == "student" else 5e-5)
torch.manual_seed(args.seed)
rng = random.Random(args.seed)

shipped = load_cross_encoder(SHIPPED)  # with its feature head
network = load_cross_encoder(SHIPPED, stacked=False)
network.feature_head = network.stack = network.gate = None
model = copy.deepcopy(network.model)
if args.mode == "student":
    keep = [int(i) for i in args.layers.split(",")]
    model.bert.encoder.layer = torch.nn.ModuleList([model.bert.encoder.layer[i] for i in keep])
    model.config.num_hidden_layers = len(keep)
    pairs = data.ccks_pairs(args.data) + data.shenzhen_pairs(args.data)  # what the shipped network learnt from
else:
    pairs = data.all_pairs(args.data)
cross = CrossEncoder(model, network.tokenizer, max_length=network.max_length)


def examples(split: str) -> list[tuple]:
    return [(normalize(p.a), normalize(p.b), LABELS.index(p.label), SOURCE_WEIGHTS.get(p.source, 1.0))
            for p in pairs if split_of(p.group) == split]


train, calib = examples("train"), examples("calib")
weights = class_weights([e[2] for e in train])
started = time.perf_counter()
if args.mode == "student":  # the targets: the shipped network's logits
    targets = torch.tensor(pair_logits(network, [e[:3] for e in train])).float()
    calib_targets = torch.tensor(pair_logits(network, [e[:3] for e in calib])).float()
else:  # the fixed offsets: the feature head's logits
    def head_logits(rows):
        x = torch.from_numpy(pair_features_batch([e[0] for e in rows], [e[1] for e in rows]))
        with torch.inference_mode():
            return shipped.feature_head(x).float()

    targets, calib_targets = head_logits(train), head_logits(calib)
print(f"{args.mode}: {len(train)} train / {len(calib)} calib pairs, targets in {time.perf_counter() - started:.0f} s", flush=True)
rows = [e + (i,) for i, e in enumerate(train)]
batches = shuffled_batches(rows, args.batch, rng)
optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
model.train()


def step():
    batch = next(batches)
    # the residual network sees sides swapped now and then (as training does); the student keeps the order its
    # targets were scored in
    swap = args.mode == "residual"
    firsts, seconds = zip(*[(b, a) if swap and rng.random() >= 0.8 else (a, b) for a, b, *_ in batch])
    enc = network.tokenizer(list(firsts), list(seconds), padding=True, truncation=True, max_length=network.max_length,
                            return_tensors="pt")
    gold = torch.tensor([e[2] for e in batch])
    rows_of = [e[4] for e in batch]
    logits = model(**enc).logits.float()
    if args.mode == "student":
        kd = F.kl_div(F.log_softmax(logits, 1), F.softmax(targets[rows_of], 1), reduction="batchmean")
        return 0.7 * kd + 0.3 * F.cross_entropy(logits, gold, weight=weights)
    per_pair = F.cross_entropy(logits + targets[rows_of], gold, weight=weights, reduction="none")
    sample_weights = torch.tensor([e[3] for e in batch])
    return (per_pair * sample_weights).sum() / sample_weights.sum()


gold_calib = torch.tensor([e[2] for e in calib])
best: dict = {"loss": math.inf}


def keep_best(steps: int, elapsed: float) -> None:
    """Calibration loss: KL to the shipped network (student) or the stacked residual NLL (residual)."""
    cross.eval()
    logits = torch.tensor(pair_logits(cross, [e[:3] for e in calib])).float()
    model.train()
    if args.mode == "student":
        loss = float(F.kl_div(F.log_softmax(logits, 1), F.softmax(calib_targets, 1), reduction="batchmean"))
    else:
        loss = float(F.cross_entropy(logits + calib_targets, gold_calib))
    print(f"step {steps} ({elapsed / 60:.1f} min) calib loss {loss:.4f} (best {best['loss']:.4f})", flush=True)
    if loss < best["loss"]:
        best.update(loss=loss, step=steps, state={k: v.detach().clone() for k, v in model.state_dict().items()})


keep_best(0, 0.0)
steps, elapsed = timed_loop(args.mode, args.minutes, lr, optimizer, step, print, checkpoint=keep_best,
                            checkpoint_every=args.minutes * 60 / 6)
keep_best(steps, elapsed)
model.load_state_dict(best["state"])
cross.eval().save(args.out, half=False)
print(f"kept step {best['step']} of {steps} (calib loss {best['loss']:.4f}) in {args.out}")
