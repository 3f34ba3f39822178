"""`mgeo-index train`: tokenizer → masked-LM pretraining → bi-encoder → cross-encoder → calibration → eval.

Each stage writes its output directory when it finishes; re-running the command skips finished
stages, so an interrupted training resumes at the stage it was in. Stages are bounded by wall-clock
budgets (minutes) rather than step counts so the whole recipe fits the machine it runs on; the
steps actually taken are recorded in ``metrics.json``.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

from mgeo_index import inference
from mgeo_index.metrics import retrieval_report
from mgeo_index.features import FEATURE_NAMES, pair_features_batch
from mgeo_index.model.bi_encoder import BiEncoder, load_bi_encoder
from mgeo_index.model.cross_encoder import CrossEncoder, FeatureHead, average_heads, load_cross_encoder
from mgeo_index.model.tokenizer import SPECIAL_TOKENS, build_char_tokenizer
from mgeo_index.settings import LABELS
from mgeo_index.text import normalize
from mgeo_index.training import data


@dataclass
class TrainConfig:
    data_dir: Path
    out: Path
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 1024
    mlm_minutes: float = 12.0
    bi_minutes: float = 10.0
    cross_minutes: float = 18.0
    mlm_batch: int = 128
    bi_batch: int = 96
    cross_batch: int = 64
    mlm_lr: float = 5e-4
    bi_lr: float = 2e-4
    cross_lr: float = 1e-4
    bi_max_length: int = 64
    cross_max_length: int = 128
    # autocast for training: "auto" is bf16 on CUDA and on CPUs with AVX512-BF16/AMX (3× fp32 per
    # cross-encoder step on the 2-core EPYC with avx512_bf16), fp32 elsewhere (bf16 emulated is ~20× slower).
    precision: str = "auto"
    seed: int = 0
    log: Callable[[str], None] = field(default=print, repr=False)


def cpu_has_fast_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX); Linux /proc/cpuinfo flags."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() or cpu_has_fast_bf16() else "fp32"


def _autocast(cfg: TrainConfig):
    return inference._autocast("cpu" if not torch.cuda.is_available() else "cuda", resolve_precision(cfg.precision))


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def lr_at(elapsed: float, budget: float, peak: float, warmup: float = 0.05) -> float:
    """Linear warm-up over the first ``warmup`` of the budget, then linear decay to 10%."""
    frac = min(elapsed / budget, 1.0)
    if frac < warmup:
        return peak * max(frac / warmup, 0.01)
    return peak * (1.0 - 0.9 * (frac - warmup) / (1.0 - warmup))


def _timed_loop(
    name: str,
    minutes: float,
    peak_lr: float,
    optimizer,
    step_fn,
    log,
    *,
    start_step: int = 0,
    start_elapsed: float = 0.0,
    checkpoint: Callable[[int, float], None] | None = None,
    checkpoint_every: float = 300.0,
) -> tuple[int, float]:
    """Run ``step_fn()`` (returns the loss) until the budget is spent; returns (steps, seconds).

    ``start_*`` continue a resumed run (the schedule follows the total elapsed time); ``checkpoint``
    is called every ``checkpoint_every`` seconds with (steps, elapsed).
    """
    budget = minutes * 60.0
    start = time.perf_counter() - start_elapsed
    last_checkpoint = time.perf_counter()
    step, running = start_step, None
    while (elapsed := time.perf_counter() - start) < budget:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(elapsed, budget, peak_lr)
        optimizer.zero_grad(set_to_none=True)
        loss = step_fn()  # may accumulate gradients itself (several passes); its .backward() adds the rest
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
        optimizer.step()
        step += 1
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0:
            log(f"[{name}] step {step} loss {running:.4f} ({elapsed / 60:.1f}/{minutes:.0f} min)")
        if checkpoint is not None and time.perf_counter() - last_checkpoint >= checkpoint_every:
            checkpoint(step, time.perf_counter() - start)
            last_checkpoint = time.perf_counter()
    return step, time.perf_counter() - start


def shuffled_batches(items: list, size: int, rng: random.Random) -> Iterator[list]:
    """Endless batches of ``size`` items, reshuffled every epoch (a short last batch is dropped)."""
    while True:
        order = list(range(len(items)))
        rng.shuffle(order)
        for start in range(0, len(order) - size + 1, size):
            yield [items[i] for i in order[start : start + size]]


def class_weights(labels: list[int]) -> torch.Tensor:
    """Inverse-sqrt frequency weights: exact_match is rare (≈ 8% of CCKS) and is what users need most."""
    counts = Counter(labels)
    return torch.tensor([(len(labels) / (len(LABELS) * max(counts[i], 1))) ** 0.5 for i in range(len(LABELS))])


def _bert_config(cfg: TrainConfig, tokenizer) -> BertConfig:
    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        intermediate_size=cfg.intermediate,
        max_position_embeddings=max(cfg.cross_max_length, cfg.bi_max_length),
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
    )


def mask_spans(input_ids: torch.Tensor, special: torch.Tensor, tokenizer, rng: random.Random, rate: float = 0.15):
    """Whole-span masking (spans of 1–4 characters) of ``rate`` of each row's real tokens; 80/10/10."""
    labels = torch.full_like(input_ids, -100)
    ids = input_ids.clone()
    for row in range(ids.shape[0]):
        positions = (~special[row]).nonzero().flatten().tolist()
        if not positions:
            continue
        target = max(1, round(rate * len(positions)))
        chosen: set[int] = set()
        while len(chosen) < target:
            start = rng.randrange(len(positions))
            span = min(rng.choice((1, 1, 2, 2, 3, 4)), target - len(chosen))
            chosen.update(positions[start : start + span])
        for pos in chosen:
            labels[row, pos] = ids[row, pos]
            roll = rng.random()
            if roll < 0.8:
                ids[row, pos] = tokenizer.mask_token_id
            elif roll < 0.9:
                ids[row, pos] = rng.randrange(len(SPECIAL_TOKENS), len(tokenizer))
    return ids, labels


def stage_tokenizer(cfg: TrainConfig, texts: list[str]):
    path = cfg.out / "work" / "tokenizer"
    if (path / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(path)
    tokenizer = build_char_tokenizer((normalize(t) for t in texts), min_freq=2)
    tokenizer.save_pretrained(path)
    cfg.log(f"[tokenizer] {len(tokenizer)} tokens")
    return tokenizer


def stage_mlm(cfg: TrainConfig, tokenizer, texts: list[str]) -> tuple[Path, dict, bool]:
    """Masked-LM pretraining, checkpointed every 5 minutes and resumable.

    Done when its output records at least ``cfg.mlm_minutes`` of training; a larger budget on a
    later run continues from the checkpoint (pretraining longer than one session). Returns
    (encoder dir, stats, whether it trained now — later stages are then stale).
    """
    path, ckpt = cfg.out / "work" / "mlm", cfg.out / "work" / "mlm_checkpoint.pt"
    if (path / "stage.json").exists():
        stats = json.loads((path / "stage.json").read_text())
        if stats.get("minutes", math.inf) >= cfg.mlm_minutes - 1e-9:
            return path, stats, False
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = BertForMaskedLM(_bert_config(cfg, tokenizer)).to(_device()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.mlm_lr, weight_decay=0.01)
    start_step, start_elapsed = 0, 0.0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=_device(), weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.setstate(state["rng"])
        start_step, start_elapsed = state["step"], state["elapsed"]
        cfg.log(f"[mlm] resuming at step {start_step} ({start_elapsed / 60:.1f} min done)")
    batches = shuffled_batches([normalize(t) for t in texts], cfg.mlm_batch, rng)
    accuracy = []

    def step():
        batch = next(batches)
        enc = tokenizer(batch, padding=True, truncation=True, max_length=cfg.bi_max_length,
                        return_tensors="pt", return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask").bool() | ~enc["attention_mask"].bool()
        ids, labels = mask_spans(enc["input_ids"], special, tokenizer, rng)
        with _autocast(cfg):
            out = model(input_ids=ids.to(_device()), attention_mask=enc["attention_mask"].to(_device()),
                        labels=labels.to(_device()))
        picked = labels != -100
        accuracy.append(float((out.logits.argmax(-1).cpu()[picked] == labels[picked]).float().mean()))
        return out.loss

    def save_checkpoint(steps: int, elapsed: float) -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.getstate(),
                    "step": steps, "elapsed": elapsed, "config": _bert_config(cfg, tokenizer).to_dict()}, tmp)
        os.replace(tmp, ckpt)

    steps, elapsed = _timed_loop("mlm", cfg.mlm_minutes, cfg.mlm_lr, optimizer, step, cfg.log,
                                 start_step=start_step, start_elapsed=start_elapsed, checkpoint=save_checkpoint)
    save_checkpoint(steps, elapsed)
    model.bert.save_pretrained(path)  # the encoder only; heads are task-specific
    stats = {"steps": steps, "minutes": elapsed / 60,
             "masked_accuracy_last100": float(np.mean(accuracy[-100:])) if accuracy else None}
    (path / "stage.json").write_text(json.dumps(stats))
    cfg.log(f"[mlm] {stats}")
    return path, stats, True


def _invalidate_after_pretraining(cfg: TrainConfig) -> None:
    """New pretraining makes the fine-tuned stages stale: remove them so they are trained again."""
    for stale in (cfg.out / "bi", cfg.out / "work" / "cross_uncalibrated"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in (cfg.out / "work" / "bi_stage.json", cfg.out / "work" / "cross_stage.json"):
        stale.unlink(missing_ok=True)


def _bi_examples(cfg: TrainConfig, pairs: list[data.Pair], tagged: list[dict]):
    """Positive pairs (query, target) with an optional hard negative, from three sources."""
    by_group: dict[str, list[data.Pair]] = {}
    for p in pairs:
        if data.split_of(p.group) == "train":
            by_group.setdefault(p.group, []).append(p)
    labeled = []
    for group in by_group.values():
        negatives = [p.b for p in group if p.label == "not_match"]
        for p in group:
            if p.label == "exact_match":
                labeled.append((p.a, p.b, negatives))
    tagged = [t for t in tagged if t.get("split", "train") == "train" and t.get("elements")]
    return labeled, tagged


def stage_bi(cfg: TrainConfig, tokenizer, mlm_path: Path, pairs: list[data.Pair], tagged: list[dict]) -> dict:
    path = cfg.out / "bi"
    if (path / "mgeo_index.json").exists():
        return json.loads((cfg.out / "work" / "bi_stage.json").read_text())
    rng = random.Random(cfg.seed + 1)
    torch.manual_seed(cfg.seed + 1)
    encoder = BertModel.from_pretrained(mlm_path, add_pooling_layer=False)
    model = BiEncoder(encoder, tokenizer, pooling="mean", max_length=cfg.bi_max_length).to(_device()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.bi_lr, weight_decay=0.01)
    labeled, tagged = _bi_examples(cfg, pairs, tagged)
    cfg.log(f"[bi] {len(labeled)} labeled positives, {len(tagged)} tagged addresses for augmentation")

    def embed(texts: list[str]) -> torch.Tensor:
        enc = tokenizer([normalize(t) for t in texts], padding=True, truncation=True,
                        max_length=cfg.bi_max_length, return_tensors="pt")
        enc = {k: v.to(_device()) for k, v in enc.items()}
        return F.normalize(model(**enc).float(), dim=-1)

    def step():
        anchors, targets, negatives = [], [], []
        for _ in range(cfg.bi_batch):
            if rng.random() < 0.6:
                a, b, negs = rng.choice(labeled)
                if negs and len(negatives) < cfg.bi_batch // 2:
                    negatives.append(rng.choice(negs))
            else:
                b, a = data.augment_tagged(rng.choice(tagged)["elements"], rng)
            anchors.append(a)
            targets.append(b)
        with _autocast(cfg):
            q = embed(anchors)  # (B, D)
            d = embed(targets + negatives)  # (B + H, D)
        logits = q @ d.T / 0.05  # in-batch negatives + hard negatives
        labels = torch.arange(len(anchors), device=logits.device)
        # symmetric InfoNCE: query→documents and document→queries (positives only)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits[:, : len(anchors)].T, labels)) / 2

    steps, _ = _timed_loop("bi", cfg.bi_minutes, cfg.bi_lr, optimizer, step, cfg.log)
    model.eval().cpu().save(path)
    stats = {"steps": steps, "labeled_positives": len(labeled)}
    (cfg.out / "work" / "bi_stage.json").write_text(json.dumps(stats))
    return stats


def _cross_examples(pairs: list[data.Pair], split: str) -> list[tuple[str, str, int]]:
    return [(p.a, p.b, LABELS.index(p.label)) for p in pairs if data.split_of(p.group) == split]


def stage_cross(cfg: TrainConfig, tokenizer, mlm_path: Path, pairs: list[data.Pair]) -> dict:
    path = cfg.out / "work" / "cross_uncalibrated"
    if (path / "mgeo_index.json").exists():
        return json.loads((cfg.out / "work" / "cross_stage.json").read_text())
    rng = random.Random(cfg.seed + 2)
    torch.manual_seed(cfg.seed + 2)
    config = BertConfig.from_pretrained(mlm_path, num_labels=len(LABELS),
                                        id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)})
    model = BertForSequenceClassification.from_pretrained(mlm_path, config=config).to(_device()).train()
    cross = CrossEncoder(model, tokenizer, max_length=cfg.cross_max_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.cross_lr, weight_decay=0.01)
    train = _cross_examples(pairs, "train")
    counts = Counter(label for *_, label in train)
    weights = class_weights([label for *_, label in train])
    cfg.log(f"[cross] {len(train)} training pairs, class counts {dict(counts)}, weights {weights.tolist()}")
    batches = shuffled_batches(train, cfg.cross_batch, rng)

    def step():
        batch = next(batches)
        # random swap of sides: the relation is symmetric for exact/not, near-symmetric for partial
        firsts, seconds = zip(*[(a, b) if rng.random() < 0.8 else (b, a) for a, b, _ in batch])
        enc = tokenizer([normalize(t) for t in firsts], [normalize(t) for t in seconds], padding=True,
                        truncation=True, max_length=cfg.cross_max_length, return_tensors="pt")
        labels = torch.tensor([label for *_, label in batch], device=_device())
        with _autocast(cfg):
            logits = cross(**{k: v.to(_device()) for k, v in enc.items()})
        return F.cross_entropy(logits.float(), labels, weight=weights.to(_device()))

    calib = _cross_examples(pairs, "calib")
    best: dict = {"loss": math.inf}

    def keep_best(steps: int, elapsed: float) -> None:
        """Evaluate on the calib split; keep the weights with the lowest loss (many epochs overfit)."""
        loss = _calib_loss(cross, calib, weights)
        cfg.log(f"[cross] step {steps} calib loss {loss:.4f} (best {best['loss']:.4f})")
        if loss < best["loss"]:
            best.update(loss=loss, step=steps, minutes=elapsed / 60,
                        state={k: v.detach().clone() for k, v in model.state_dict().items()})
        model.train()

    steps, elapsed = _timed_loop("cross", cfg.cross_minutes, cfg.cross_lr, optimizer, step, cfg.log,
                                 checkpoint=keep_best, checkpoint_every=cfg.cross_minutes * 60 / 8)
    keep_best(steps, elapsed)
    model.load_state_dict(best["state"])
    cross.eval().cpu().save(path)
    stats = {"steps": steps, "train_pairs": len(train), "class_counts": {LABELS[k]: v for k, v in counts.items()},
             "kept_step": best["step"], "kept_minutes": best["minutes"], "calib_loss": best["loss"]}
    (cfg.out / "work" / "cross_stage.json").write_text(json.dumps(stats))
    return stats


def _calib_loss(cross: CrossEncoder, examples, weights: torch.Tensor) -> float:
    """Class-weighted cross-entropy of the network (no feature head) on held-out examples."""
    cross.eval()
    logits = torch.tensor(_pair_logits(cross, examples))
    gold = torch.tensor([g for *_, g in examples])
    return float(F.cross_entropy(logits, gold, weight=weights.to(logits.dtype)))


def fit_temperature(logits: np.ndarray, gold: np.ndarray) -> float:
    """Temperature minimizing the negative log-likelihood (golden-section search on log T)."""
    logits_t = torch.tensor(logits, dtype=torch.float64)
    gold_t = torch.tensor(gold)

    def nll(log_t: float) -> float:
        return float(F.cross_entropy(logits_t / math.exp(log_t), gold_t))

    lo, hi = math.log(0.05), math.log(20.0)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if nll(a) < nll(b):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


def _pair_logits(cross: CrossEncoder, examples) -> np.ndarray:
    saved, cross.temperature = cross.temperature, 1.0
    probs = inference.score_pairs(cross, [normalize(a) for a, _, _ in examples], [normalize(b) for _, b, _ in examples])
    cross.temperature = saved
    return np.log(np.clip(probs, 1e-12, None))  # log-softmax = logits up to a per-row constant


def train_feature_head(x: torch.Tensor, y: torch.Tensor, *, epochs: int = 6, seed: int = 0) -> FeatureHead:
    """The feature-only scorer on (pair features, LABELS index) of the train split (features are
    deterministic: no leakage). Few epochs: on CCKS calib the NLL is lowest at 4–12 and rises after."""
    torch.manual_seed(seed)
    weights = class_weights(y.tolist())
    head = FeatureHead(x.shape[1])
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=generator).split(256):
            loss = F.cross_entropy(head(x[idx]), y[idx], weight=weights)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return head.eval()


def _features_of(examples) -> torch.Tensor:
    return torch.from_numpy(pair_features_batch([normalize(a) for a, _, _ in examples], [normalize(b) for _, b, _ in examples]))


def fit_stack(network_logits: np.ndarray, feature_logits: np.ndarray, gold: np.ndarray) -> dict:
    """alpha, beta, per-class bias minimizing NLL of alpha·network + beta·features + bias (L-BFGS)."""
    net, feat = torch.tensor(network_logits, dtype=torch.float64), torch.tensor(feature_logits, dtype=torch.float64)
    target = torch.tensor(gold)
    params = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([params], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(params[0] * net + params[1] * feat + params[2:], target)
        loss.backward()
        return loss

    optimizer.step(closure)
    alpha, beta, *bias = params.detach().tolist()
    return {"alpha": alpha, "beta": beta, "bias": bias, "features": list(FEATURE_NAMES)}


def stage_calibrate(cfg: TrainConfig, pairs: list[data.Pair], decision_pairs: list[data.Pair]) -> dict:
    cross = load_cross_encoder(cfg.out / "work" / "cross_uncalibrated")
    stats = calibrate(cross, pairs, decision_pairs, seed=cfg.seed)
    cross.save(cfg.out / "cross")
    cfg.log(f"[calibrate] {stats}")
    return stats


def calibrate(cross: CrossEncoder, pairs: list[data.Pair], decision_pairs: list[data.Pair], *, seed: int = 0,
              heads: int = 5) -> dict:
    """Temperature of the network alone, the stacked scorer, and the feature head alone; keep whichever
    fits calib best (:func:`choose_scorer`: the network must earn its running time).

    The feature head: the average of ``heads`` seeds trained on the train split (one seed's dev
    macro-F1 varies by ±0.01; their mean less). Then the label decision offsets, fitted for macro-F1
    on the calibration split of ``decision_pairs`` (the three-way CCKS pairs: the binary Shenzhen
    pairs have no partial class).
    """
    from mgeo_index.text.parser import parser_version

    train, calib = _cross_examples(pairs, "train"), _cross_examples(pairs, "calib")
    gold = np.array([g for *_, g in calib])
    cross.feature_head = cross.stack = None
    cross.temperature = 1.0
    network_logits = _pair_logits(cross, calib)
    temperature = fit_temperature(network_logits, gold)
    x_train, x_calib = _features_of(train), _features_of(calib)
    y_train = torch.tensor([g for *_, g in train])
    head = average_heads([train_feature_head(x_train, y_train, seed=s) for s in range(seed, seed + heads)])
    with torch.inference_mode():
        feature_logits = head(x_calib).double().numpy()
    head_nll = float(F.cross_entropy(torch.tensor(feature_logits), torch.tensor(gold)))
    stack = fit_stack(network_logits, feature_logits, gold) | {"parser": parser_version()}
    # the feature head alone: the same fit with the network's logits left out (alpha 0)
    features_only = fit_stack(np.zeros_like(network_logits), feature_logits, gold) | {"alpha": 0.0, "parser": parser_version()}
    nll = {
        "network": float(F.cross_entropy(torch.tensor(network_logits / temperature), torch.tensor(gold))),
        "stacked": _stack_nll(stack, network_logits, feature_logits, gold),
        "features": _stack_nll(features_only, network_logits, feature_logits, gold),
    }
    scorer = choose_scorer(nll)
    cross.temperature = temperature
    if scorer != "network":
        cross.feature_head, cross.stack = head, stack if scorer == "stacked" else features_only
    fit_decision(cross, _cross_examples(decision_pairs, "calib"))
    return {"temperature": temperature, "calibration_pairs": len(calib), "calib_nll_network": nll["network"],
            "calib_nll_feature_head": head_nll, "feature_heads": heads, "calib_nll_stacked": nll["stacked"],
            "calib_nll_features_only": nll["features"], "scorer": scorer,
            "stack": {k: v for k, v in (cross.stack or stack).items() if k != "features"},
            "decision_offsets": dict(zip(cross.labels, cross.decision_offsets))}


# Calib NLL (nats) the transformer must save over the feature head alone to be run at all: it is
# nearly all of a pair's scoring time.
NETWORK_MIN_GAIN = 0.005


def choose_scorer(nll: dict[str, float]) -> str:
    """"network" (alone, temperature-scaled), "stacked" (network + feature head) or "features" (the
    feature head alone, alpha 0: the network is never run), by calibration NLL."""
    if nll["network"] < min(nll["stacked"], nll["features"]):
        return "network"
    return "stacked" if nll["stacked"] <= nll["features"] - NETWORK_MIN_GAIN else "features"


def _stack_nll(stack: dict, network_logits: np.ndarray, feature_logits: np.ndarray, gold: np.ndarray) -> float:
    combined = stack["alpha"] * network_logits + stack["beta"] * feature_logits + np.array(stack["bias"])
    return float(F.cross_entropy(torch.tensor(combined), torch.tensor(gold)))


def fit_decision_offsets(probs: np.ndarray, gold: np.ndarray, labels, grid=np.arange(-1.0, 2.001, 0.1)) -> list[float]:
    """Per-label offsets (``not_match`` fixed at 0) maximizing macro-F1 of argmax(log p + offsets).

    Grid search on held-out pairs; ties go to the smallest change. ``gold`` in ``labels`` order.
    """
    from mgeo_index.metrics import classification_report

    logp = np.log(np.clip(probs, 1e-12, 1.0))
    exact, partial = labels.index("exact_match"), labels.index("partial_match")
    best = (-1.0, 0.0, [0.0] * len(labels))
    for a in grid:
        for b in grid:
            offsets = [0.0] * len(labels)
            offsets[exact], offsets[partial] = round(float(a), 3) + 0.0, round(float(b), 3) + 0.0  # no -0.0
            f1 = classification_report(gold, np.argmax(logp + offsets, 1), labels)["macro_f1"]
            if (f1, -abs(a) - abs(b)) > best[:2]:
                best = (f1, -abs(a) - abs(b), offsets)
    return best[2]


def fit_decision(cross: CrossEncoder, examples: list[tuple[str, str, int]]) -> None:
    """Set ``cross.decision_offsets`` from held-out (a, b, LABELS index) examples."""
    probs = inference.score_pairs(cross, [normalize(a) for a, _, _ in examples], [normalize(b) for _, b, _ in examples])
    gold = np.array([cross.labels.index(LABELS[g]) for *_, g in examples])
    cross.decision_offsets = fit_decision_offsets(probs, gold, cross.labels)


def recalibrate(cross_dir: Path, data_dir: Path, *, decision_only: bool = False) -> dict:
    """Calibrate an existing cross-encoder again (temperature, feature head, stack, decision offsets;
    or the decision offsets alone) on the shared data's calibration split; saved in place."""
    ccks = data.ccks_pairs(data_dir)
    if decision_only:
        cross = load_cross_encoder(cross_dir)
        fit_decision(cross, _cross_examples(ccks, "calib"))
        stats = {"decision_offsets": dict(zip(cross.labels, cross.decision_offsets))}
    else:
        cross = load_cross_encoder(cross_dir, stacked=False)
        stats = calibrate(cross, ccks + data.shenzhen_pairs(data_dir), ccks)
    cross.save(cross_dir)
    return stats


def evaluate_pairs(cross: CrossEncoder, pairs: list[data.Pair], split: str = "dev") -> dict:
    """The same report as ``mgeo-index eval pairs`` on one split of the training pairs."""
    from mgeo_index.evaluate import evaluate_pairs as evaluate_labeled_pairs

    examples = _cross_examples(pairs, split)
    report = evaluate_labeled_pairs(cross, [a for a, _, _ in examples], [b for _, b, _ in examples], [g for *_, g in examples])
    report.pop("_probs")
    return report


def evaluate_retrieval(bi: BiEncoder, pairs: list[data.Pair], catalog: list[str], split: str = "dev") -> dict:
    """Dense retrieval of dev queries over the whole catalog; gold = the exact_match candidate."""
    from mgeo_index import index as faiss_index

    position = {text: i for i, text in enumerate(catalog)}
    queries, gold = [], []
    for p in pairs:
        if p.label == "exact_match" and data.split_of(p.group) == split and p.b in position:
            queries.append(p.a)
            gold.append(position[p.b])
    index = faiss_index.make_index(bi.dim, "Flat")
    faiss_index.add(index, inference.encode(bi, [normalize(t) for t in catalog]), np.arange(len(catalog), dtype=np.int64))
    _, ids = faiss_index.search(index, inference.encode(bi, [normalize(q) for q in queries]), 10)
    return retrieval_report(ids, gold)


def train(cfg: TrainConfig) -> dict:
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rng = random.Random(cfg.seed)
    ccks = data.ccks_pairs(cfg.data_dir)
    shenzhen = data.shenzhen_pairs(cfg.data_dir)
    tagged = data.tagged_addresses(cfg.data_dir)
    texts = data.corpus(cfg.data_dir, rng)
    cfg.log(f"[data] {len(ccks)} CCKS pairs, {len(shenzhen)} Shenzhen pairs, {len(texts)} corpus texts")
    tokenizer = stage_tokenizer(cfg, texts)
    mlm_path, mlm_stats, pretrained_now = stage_mlm(cfg, tokenizer, texts)
    if pretrained_now:
        _invalidate_after_pretraining(cfg)
    bi_stats = stage_bi(cfg, tokenizer, mlm_path, ccks + shenzhen, tagged)
    cross_stats = stage_cross(cfg, tokenizer, mlm_path, ccks + shenzhen)
    calib_stats = stage_calibrate(cfg, ccks + shenzhen, ccks)
    bi = load_bi_encoder(cfg.out / "bi")
    cross = load_cross_encoder(cfg.out / "cross")
    metrics = {
        "config": {f.name: (str(v) if isinstance(v := getattr(cfg, f.name), Path) else v) for f in fields(cfg) if f.name != "log"},
        "stages": {"mlm": mlm_stats, "bi": bi_stats, "cross": cross_stats, "calibration": calib_stats},
        "ccks_dev": evaluate_pairs(cross, ccks),
        "shenzhen_dev": evaluate_pairs(cross, shenzhen),
        "ccks_dev_retrieval": evaluate_retrieval(bi, ccks, data.ccks_catalog(cfg.data_dir)),
        "parameters": {"bi": sum(p.numel() for p in bi.parameters()), "cross": sum(p.numel() for p in cross.parameters())},
        "fingerprints": {"bi": bi.fingerprint, "cross": cross.fingerprint},
        "minutes": (time.perf_counter() - started) / 60,
    }
    (cfg.out / "metrics.json").write_text(json.dumps(metrics, ensure_ascii=False, indent=2) + "\n")
    return metrics
