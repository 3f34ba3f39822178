"""`mgeo-index train`: tokenizer → masked-LM pretraining → bi-encoder → cross-encoder → calibration → eval.

Each stage writes its output directory when it finishes; re-running the command skips finished
stages, so an interrupted training resumes at the stage it was in. Stages are bounded by wall-clock
budgets (minutes) rather than step counts so the whole recipe fits the machine it runs on; the
steps actually taken are recorded in ``metrics.json``. The settings are :class:`TrainConfig`
(``training/config.py``), the shared loop in ``training/loops.py``, the calibration in
``training/calibrate.py``.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections import Counter
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

from mgeo_index.runtime import inference
from mgeo_index.measure.evaluate import evaluate_dense_retrieval, evaluate_pairs as evaluate_labeled_pairs
from mgeo_index.model.bi_encoder import BiEncoder, load_bi_encoder
from mgeo_index.model.cross_encoder import CrossEncoder, load_cross_encoder
from mgeo_index.model.tokenizer import build_char_tokenizer
from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data
from mgeo_index.training.calibrate import calibrate, pair_logits
from mgeo_index.training.calibrate import fit_number_policy
from mgeo_index.training.group import fit_group_head, group_head_pairs
from mgeo_index.training.config import TrainConfig
from mgeo_index.training.loops import class_weights, mask_spans, resolve_precision, save_atomic, shuffled_batches, timed_loop


def _autocast(cfg: TrainConfig):
    return inference._autocast("cpu" if not torch.cuda.is_available() else "cuda", resolve_precision(cfg.precision))


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


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
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.getstate(),
                 "step": steps, "elapsed": elapsed, "config": _bert_config(cfg, tokenizer).to_dict()}
        save_atomic(state, ckpt)

    steps, elapsed = timed_loop("mlm", cfg.mlm_minutes, cfg.mlm_lr, optimizer, step, cfg.log,
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
        if split_of(p.group) == "train":
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

    steps, _ = timed_loop("bi", cfg.bi_minutes, cfg.bi_lr, optimizer, step, cfg.log)
    model.eval().cpu().save(path)
    stats = {"steps": steps, "labeled_positives": len(labeled)}
    (cfg.out / "work" / "bi_stage.json").write_text(json.dumps(stats))
    return stats


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
    train = data.split_examples(pairs, "train")
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

    calib = data.split_examples(pairs, "calib")
    best: dict = {"loss": math.inf}

    def keep_best(steps: int, elapsed: float) -> None:
        """Evaluate on the calib split; keep the weights with the lowest loss (many epochs overfit)."""
        loss = _calib_loss(cross, calib, weights)
        cfg.log(f"[cross] step {steps} calib loss {loss:.4f} (best {best['loss']:.4f})")
        if loss < best["loss"]:
            best.update(loss=loss, step=steps, minutes=elapsed / 60,
                        state={k: v.detach().clone() for k, v in model.state_dict().items()})
        model.train()

    steps, elapsed = timed_loop("cross", cfg.cross_minutes, cfg.cross_lr, optimizer, step, cfg.log,
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
    logits = torch.tensor(pair_logits(cross, examples))
    gold = torch.tensor([g for *_, g in examples])
    return float(F.cross_entropy(logits, gold, weight=weights.to(logits.dtype)))


def stage_calibrate(cfg: TrainConfig, pairs: list[data.Pair], decision_pairs: list[data.Pair],
                    extra: list[data.Pair]) -> dict:
    """Calibration, then the group head (its trees also learn from ``extra``: the --pairs files; its stack and
    offsets are fitted on the calibration split only, so that the dev figures below stay out of sample)."""
    cross = load_cross_encoder(cfg.out / "work" / "cross_uncalibrated")
    stats = calibrate(cross, pairs, decision_pairs, seed=cfg.seed)
    trees, stack = group_head_pairs(cfg.data_dir)
    stats["group_head"] = fit_group_head(cross, trees + extra, stack, seed=cfg.seed)
    stats["number_policy"] = fit_number_policy(cross, data.split_examples(decision_pairs, "calib"))
    cross.save(cfg.out / "cross")
    cfg.log(f"[calibrate] {stats}")
    return stats


def evaluate_pairs(cross: CrossEncoder, pairs: list[data.Pair], split: str = "dev", *, grouped: bool = True,
                   numbers: str | None = None) -> dict:
    """The same report as ``mgeo-index eval pairs`` (``--pairwise``: ``grouped=False``; ``numbers``: the number
    policy) on one split of the training pairs."""
    examples = data.split_examples(pairs, split)
    report = evaluate_labeled_pairs(cross, [a for a, _, _ in examples], [b for _, b, _ in examples], [g for *_, g in examples],
                                    grouped=grouped, numbers=numbers)
    report.pop("_probs")
    return report


def evaluate_split_retrieval(bi: BiEncoder, pairs: list[data.Pair], catalog: list[str], split: str = "dev") -> dict:
    """Dense retrieval of ``split``'s queries over the whole catalog (:func:`mgeo_index.measure.evaluate.evaluate_dense_retrieval`);
    gold = the exact_match candidate."""
    position = {text: i for i, text in enumerate(catalog)}
    queries, gold = [], []
    for p in pairs:
        if p.label == "exact_match" and split_of(p.group) == split and p.b in position:
            queries.append(p.a)
            gold.append(position[p.b])
    return evaluate_dense_retrieval(bi, queries, catalog, gold)


def train(cfg: TrainConfig) -> dict:
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rng = random.Random(cfg.seed)
    ccks = data.ccks_pairs(cfg.data_dir)
    shenzhen = data.shenzhen_pairs(cfg.data_dir)
    extra = [p for path in cfg.extra_pairs for p in data.labelled_file_pairs(path)]  # e.g. reviewers' labels
    tagged = data.tagged_addresses(cfg.data_dir)
    texts = data.corpus(cfg.data_dir, rng)
    cfg.log(f"[data] {len(ccks)} CCKS pairs, {len(shenzhen)} Shenzhen pairs, {len(extra)} pairs of --pairs files, "
            f"{len(texts)} corpus texts")
    tokenizer = stage_tokenizer(cfg, texts)
    mlm_path, mlm_stats, pretrained_now = stage_mlm(cfg, tokenizer, texts)
    if pretrained_now:
        _invalidate_after_pretraining(cfg)
    bi_stats = stage_bi(cfg, tokenizer, mlm_path, ccks + shenzhen, tagged)
    cross_stats = stage_cross(cfg, tokenizer, mlm_path, ccks + shenzhen + extra)
    calib_stats = stage_calibrate(cfg, ccks + shenzhen + extra, ccks, extra)
    bi = load_bi_encoder(cfg.out / "bi")
    cross = load_cross_encoder(cfg.out / "cross")
    metrics = {
        "config": {f.name: (str(v) if isinstance(v := getattr(cfg, f.name), Path) else v) for f in fields(cfg) if f.name != "log"},
        "stages": {"mlm": mlm_stats, "bi": bi_stats, "cross": cross_stats, "calibration": calib_stats},
        "ccks_dev": evaluate_pairs(cross, ccks),
        "ccks_dev_pairwise": evaluate_pairs(cross, ccks, grouped=False),
        "shenzhen_dev": evaluate_pairs(cross, shenzhen),
        "ccks_dev_retrieval": evaluate_split_retrieval(bi, ccks, data.ccks_catalog(cfg.data_dir)),
        "parameters": {"bi": sum(p.numel() for p in bi.parameters()), "cross": sum(p.numel() for p in cross.parameters())},
        "fingerprints": {"bi": bi.fingerprint, "cross": cross.fingerprint},
        "minutes": (time.perf_counter() - started) / 60,
    }
    (cfg.out / "metrics.json").write_text(json.dumps(metrics, ensure_ascii=False, indent=2) + "\n")
    return metrics
