"""Three ways to retrain the shipped cross-encoder's network, measured:

- ``--mode student --layers 0,3``: a smaller network made of some of the shipped network's layers (embeddings,
  pooler and classifier copied), distilled on the shipped network's logits over the train split (0.7 · KL to
  its probabilities + 0.3 · class-weighted cross-entropy on the labels); the weights closest to the shipped
  network on the calibration split (lowest KL) are kept;
- ``--mode residual``: the shipped network fine-tuned on the *residual* of the stacked feature head: the loss is
  taken on ``network logits + feature-head logits`` (the head fixed), over every labelled pair of the train split
  (per-source weights as the teacher's), so that the network learns what the features miss; with ``--teacher``,
  the stack head + network + teacher fitted on the calibration split gives soft targets (``--alpha`` · KL) and the
  network's logits enter at the weight the head + network stack gives them: the teacher's complement to the
  head and the shipped network, distilled;
- ``--mode distil --teacher PATH``: the shipped network fine-tuned on the teacher's temperature-scaled
  probabilities (``--alpha`` · KL) plus the gold labels (the rest, class- and source-weighted cross-entropy)
  over every labelled pair of the train split, and ``--unlabelled N`` pairs no human labelled (N unlabelled
  addresses and N/2 CCKS catalog entries, each against its nearest CCKS catalog entries by the shipped
  bi-encoder), where the teacher's probabilities are the only target. The teacher's logits are cached in
  ``~/.cache/mgeo-index/distil/``. The weights with the lowest gold loss on the calibration split are kept.
  With ``--from-teacher 0,2,4,6,8,10`` the student is not the shipped network but the teacher with only these
  layers (embeddings, pooler and classifier copied): a deeper cut of a stronger network.

The output folder is an uncalibrated cross-encoder: calibrate and score it as the shipped one,

    OMP_NUM_THREADS=1 python research/finetune_network.py --mode student --layers 0,3 --minutes 20 --out runs/student2
    OMP_NUM_THREADS=1 python research/finetune_network.py --mode distil \
        --teacher ~/.cache/mgeo-index/teacher/cross_best.pt --unlabelled 12000 --minutes 30 --out runs/distil
    python scripts/recalibrate.py --model runs/student2 --data ../shared/data
    mgeo-index eval pairs ../shared/data/pairs/ccks2021_train.tsv.gz --split dev --source round2_train --cross-model runs/student2
"""
import argparse
import copy
import hashlib
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mgeo_index import settings
from mgeo_index.compare.features import pair_features_batch
from mgeo_index.runtime.inference import _autocast
from mgeo_index.model.cross_encoder import CrossEncoder, load_cross_encoder
from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data
from mgeo_index.training.calibrate import column_stack, fit_column_stack, fit_temperature, pair_logits
from mgeo_index.training.loops import class_weights, resolve_precision, shuffled_batches, timed_loop
from mgeo_index.training.teacher import SOURCE_WEIGHTS, load_teacher

SHIPPED = Path(__file__).resolve().parents[1] / "mgeo_index" / "model" / "default" / "cross"

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--mode", choices=("student", "residual", "distil"), required=True)
parser.add_argument("--layers", default="0,3", help="student: the shipped network's layers kept, in order")
parser.add_argument("--from-teacher", default=None, metavar="LAYERS",
                    help="distil: start from the teacher's layers LAYERS (e.g. 0,2,4,6,8,10) instead of the shipped network")
parser.add_argument("--minutes", type=float, default=20.0)
parser.add_argument("--teacher", type=Path, help="distil / residual: the teacher's cross_best.pt, checkpoint or FP16 snapshot")
parser.add_argument("--alpha", type=float, default=0.5, help="distil: weight of the KL to the teacher (labelled pairs)")
parser.add_argument("--mix", type=float, default=1.0,
                    help="distil: the targets mix the teacher's log-probabilities (this share) with the shipped network's")
parser.add_argument("--unlabelled", type=int, default=0, help="distil: unlabelled addresses paired with the catalog")
parser.add_argument("--lr", type=float, default=None, help="peak learning rate (student 1e-4, others 5e-5)")
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--data", type=Path, default=Path("../shared/data"))
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
if args.mode == "student" and args.teacher:
    parser.error("--teacher goes with --mode distil or --mode residual")
if args.mode == "distil" and not args.teacher:
    parser.error("--mode distil needs --teacher (e.g. ~/.cache/mgeo-index/teacher/cross_best.pt)")
lr = args.lr or (1e-4 if args.mode == "student" else 5e-5)
torch.manual_seed(args.seed)
rng = random.Random(args.seed)

shipped = load_cross_encoder(SHIPPED)  # with its feature head
network = load_cross_encoder(SHIPPED, stacked=False)
network.feature_head = network.stack = network.gate = None
model = copy.deepcopy(network.model)
teacher = load_teacher(args.teacher) if args.teacher else None  # read once: targets, and --from-teacher's start
if args.from_teacher:
    if args.mode != "distil":
        parser.error("--from-teacher goes with --mode distil")
    model = copy.deepcopy(teacher.model)
if args.mode == "student" or args.from_teacher:
    keep = [int(i) for i in (args.from_teacher or args.layers).split(",")]
    model.bert.encoder.layer = torch.nn.ModuleList([model.bert.encoder.layer[i] for i in keep])
    model.config.num_hidden_layers = len(keep)
if args.mode == "student":
    pairs = data.ccks_pairs(args.data) + data.shenzhen_pairs(args.data)  # what the shipped network learnt from
else:
    pairs = data.all_pairs(args.data)
cross = CrossEncoder(model, network.tokenizer, max_length=network.max_length)


def examples(split: str) -> list[tuple]:
    return [(normalize(p.a), normalize(p.b), LABELS.index(p.label), SOURCE_WEIGHTS.get(p.source, 1.0))
            for p in pairs if split_of(p.group) == split]


def unlabelled_pairs(n: int) -> list[tuple]:
    """``n`` unlabelled addresses against their 2 nearest CCKS catalog entries and ``n // 2`` catalog entries
    against their nearest other entry (the shipped bi-encoder, exact search): (a, b, -1, 1.0) rows."""
    import faiss

    from mgeo_index.runtime import inference
    from mgeo_index.model.bi_encoder import load_bi_encoder
    from mgeo_index.settings import DEFAULT_BI_MODEL

    pick = random.Random(args.seed + 1)
    catalog = list(dict.fromkeys(normalize(t) for t in data.ccks_catalog(args.data)))
    queries = pick.sample([normalize(t) for t in data.unlabeled_addresses(args.data)], n)
    own = pick.sample(range(len(catalog)), n // 2)
    bi = load_bi_encoder(DEFAULT_BI_MODEL)
    vectors = inference.encode(bi, catalog)
    _, near = faiss.knn(inference.encode(bi, queries), vectors, 2)
    _, near_own = faiss.knn(vectors[own], vectors, 2)
    out = [(q, catalog[j], -1, 1.0) for q, row in zip(queries, near) for j in row if catalog[j] != q]
    return out + [(catalog[i], catalog[row[1]], -1, 1.0) for i, row in zip(own, near_own)]


def teacher_logits(rows: list[tuple]) -> np.ndarray:
    """The teacher's logits (temperature 1) for the rows, cached by teacher file and rows."""
    key = hashlib.sha1(f"{args.teacher.resolve()}:{args.teacher.stat().st_mtime_ns}".encode())
    for a, b, *_ in rows:
        key.update(f"{a}\t{b}\n".encode())
    cache = settings.cache_dir() / "distil"
    path = cache / f"{key.hexdigest()[:16]}.npy"
    if path.exists():
        return np.load(path)
    logits = pair_logits(teacher, [e[:3] for e in rows])
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, logits)
    return logits


scale = 1.0  # residual: the weight of the network's logits beside the fixed offsets
train, calib = examples("train"), examples("calib")
weights = class_weights([e[2] for e in train])
started = time.perf_counter()
if args.mode == "student":  # the targets: the shipped network's logits
    targets = torch.tensor(pair_logits(network, [e[:3] for e in train])).float()
    calib_targets = torch.tensor(pair_logits(network, [e[:3] for e in calib])).float()
elif args.mode == "distil":  # the targets: the teacher's logits over its temperature on the calibration split
    train = train + (unlabelled_pairs(args.unlabelled) if args.unlabelled else [])
    calib_logits = teacher_logits(calib)
    temperature = fit_temperature(calib_logits, np.array([e[2] for e in calib]))
    targets = torch.log_softmax(torch.tensor(teacher_logits(train) / temperature).float(), 1)
    if args.mix < 1.0:  # an ensemble of the teacher and the network it starts from (stacked, both add to the head)
        own = pair_logits(network, [e[:3] for e in train])
        own_temperature = fit_temperature(pair_logits(network, [e[:3] for e in calib]), np.array([e[2] for e in calib]))
        targets = args.mix * targets + (1 - args.mix) * torch.log_softmax(torch.tensor(own / own_temperature).float(), 1)
    calib_targets = torch.tensor([e[2] for e in calib])
    print(f"teacher temperature {temperature:.3f} on {len(calib)} calibration pairs", flush=True)
else:  # the fixed offsets: the feature head's logits
    def head_logits(rows):
        x = torch.from_numpy(pair_features_batch([e[0] for e in rows], [e[1] for e in rows]))
        with torch.inference_mode():
            return shipped.feature_head(x).float()

    targets, calib_targets = head_logits(train), head_logits(calib)
    if teacher is not None:  # the residual of a stack with the teacher: soft targets, the head and network stacked as shipped
        gold_c = torch.tensor([e[2] for e in calib])
        columns = {"train": [targets.double(), torch.tensor(pair_logits(network, [e[:3] for e in train]))],
                   "calib": [calib_targets.double(), torch.tensor(pair_logits(network, [e[:3] for e in calib]))]}
        columns["train"].append(torch.tensor(teacher_logits(train)))
        columns["calib"].append(torch.tensor(teacher_logits(calib)))
        two = fit_column_stack(columns["calib"][:2], gold_c)
        three = fit_column_stack(columns["calib"], gold_c)
        print(f"stack on calib: head + network {two.tolist()}, + teacher {three.tolist()}", flush=True)
        soft = torch.log_softmax(column_stack(three, columns["train"]), 1).float()
        scale = float(two[1])  # the student's logits enter as the shipped network's do
        targets = (two[0] * targets.double() + two[2:]).float()
        calib_targets = (two[0] * calib_targets.double() + two[2:]).float()
print(f"{args.mode}: {len(train)} train / {len(calib)} calib pairs, targets in {time.perf_counter() - started:.0f} s", flush=True)
rows = [e + (i,) for i, e in enumerate(train)]
batches = shuffled_batches(rows, args.batch, rng)
optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
precision = resolve_precision("auto")
model.train()


def step():
    batch = next(batches)
    # the residual network sees sides swapped now and then (as training does); the student keeps the order its
    # targets were scored in
    swap = args.mode == "residual"  # distil: the teacher scored (a, b) in this order too
    firsts, seconds = zip(*[(b, a) if swap and rng.random() >= 0.8 else (a, b) for a, b, *_ in batch])
    enc = network.tokenizer(list(firsts), list(seconds), padding=True, truncation=True, max_length=network.max_length,
                            return_tensors="pt")
    gold = torch.tensor([e[2] for e in batch])
    rows_of = [e[4] for e in batch]
    with _autocast("cpu", precision):
        logits = model(**enc).logits.float()
    if args.mode == "distil":
        kd = F.kl_div(F.log_softmax(logits, 1), F.softmax(targets[rows_of], 1), reduction="batchmean")
        sample_weights = torch.tensor([e[3] for e in batch]) * (gold >= 0)
        per_pair = F.cross_entropy(logits, gold.clamp(min=0), weight=weights, reduction="none")
        return args.alpha * kd + (1 - args.alpha) * (per_pair * sample_weights).sum() / sample_weights.sum().clamp(min=1e-6)
    if args.mode == "student":
        kd = F.kl_div(F.log_softmax(logits, 1), F.softmax(targets[rows_of], 1), reduction="batchmean")
        return 0.7 * kd + 0.3 * F.cross_entropy(logits, gold, weight=weights)
    combined = scale * logits + targets[rows_of]
    per_pair = F.cross_entropy(combined, gold, weight=weights, reduction="none")
    sample_weights = torch.tensor([e[3] for e in batch])
    loss = (per_pair * sample_weights).sum() / sample_weights.sum()
    if args.teacher:
        kd = F.kl_div(F.log_softmax(combined, 1), soft[rows_of].exp(), reduction="batchmean")
        return args.alpha * kd + (1 - args.alpha) * loss
    return loss


gold_calib = torch.tensor([e[2] for e in calib])
best: dict = {"loss": math.inf}


def keep_best(steps: int, elapsed: float) -> None:
    """Calibration loss: KL to the shipped network (student), the stacked residual NLL (residual) or the
    class-weighted gold cross-entropy (distil)."""
    cross.eval()
    logits = torch.tensor(pair_logits(cross, [e[:3] for e in calib])).float()
    model.train()
    if args.mode == "student":
        loss = float(F.kl_div(F.log_softmax(logits, 1), F.softmax(calib_targets, 1), reduction="batchmean"))
    elif args.mode == "distil":
        loss = float(F.cross_entropy(logits, calib_targets, weight=weights))
    else:
        loss = float(F.cross_entropy(scale * logits + calib_targets, gold_calib))
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
