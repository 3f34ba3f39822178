"""The teacher: a cross-encoder several times the shipped one's size, trained for hours, never shipped
in the package (its FP16 weights live in ``teacher/`` at the repository root) — it labels pairs for
the small shipped models to learn from (distillation).

Stages, each resumable from checkpoints written every ``checkpoint_minutes`` (default 5) into ``out``
(keep it outside the work tree, default ``~/.cache/mgeo-index/teacher``); re-running the same command
continues where the last run stopped, and a larger budget continues a finished stage:

1. ``mlm`` — masked-language pretraining of an ``layers`` × ``hidden`` BERT on every address text of
   the shared data (catalogs, tagged and unlabelled addresses, the train split's pair texts) with
   n-gram masking (spans of 1–4 characters) and whole-element masking where the elements are
   known (tagged addresses); every other batch is a *pair* batch ``[CLS] a [SEP] b [SEP]`` of the
   train split with its label folded in as a three-way prediction from ``[CLS]`` (the CCKS2021
   round-2 winners' continued pretraining on pair texts).
2. ``cross`` — fine-tuning on all labelled pairs (CCKS round 1 and 2, the round-1 tail, Shenzhen val
   and train; per-source loss weights, the round-2 pairs weigh most since they are what the
   held-out data is), with FGM (an adversarial step on the character embeddings) and multi-sample
   dropout on the classifier; evaluated on the calibration split's round-2 pairs every
   ``eval_minutes`` and the best weights kept (it overfits after a few epochs).
3. ``export`` — the best weights as a plain Hugging Face sequence classifier in FP16 (loadable by
   ``mgeo-index eval pairs --cross-model DIR``), temperature and decision offsets fitted on the
   calibration split (network alone: the teacher's probabilities are the distillation targets).

Run: ``OMP_NUM_THREADS=1 nohup python -m mgeo_index.training.teacher --data ../shared/data
--mlm-minutes 240 --cross-minutes 300 > teacher.log &``; the wall-clock of every stage (summed over
all runs) is in ``out/teacher.json``. ``--export-from WEIGHTS --export DIR`` runs stage 3 alone on given weights
(the repository's ``teacher/cross-snapshot.safetensors`` on a machine that never trained the teacher).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForSequenceClassification

from mgeo_index import settings
from mgeo_index.files import replace_atomic, write_json_atomic
from mgeo_index.model.cross_encoder import CrossEncoder
from mgeo_index.model.manifest import quiet_transformers
from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data
from mgeo_index.training.calibrate import fit_decision_offsets, fit_temperature
from mgeo_index.training.loops import (checkpoint_of, class_weights, mask_spans, record_stage, resolve_precision,
                                      restore_checkpoint, save_atomic, shuffled_batches, timed_loop)

DEFAULT_OUT = settings.cache_dir() / "teacher"
# Loss weight of a labelled pair by its source. The held-out CCKS pairs are round-2 queries: round 2
# relabelled some round-1 pairs and calls exact_match five times as often as the round-1 tail.
SOURCE_WEIGHTS = {"round2_train": 1.5, "round1_train_fold0": 1.0, "round1_train_tail": 0.6, "shenzhen": 1.0}


@dataclass
class TeacherConfig:
    data_dir: Path
    out: Path = DEFAULT_OUT
    tokenizer: Path = Path(__file__).resolve().parents[1] / "model" / "default" / "cross"
    hidden: int = 384
    layers: int = 8
    heads: int = 6
    intermediate: int = 1536
    mlm_minutes: float = 240.0
    cross_minutes: float = 300.0
    mlm_batch: int = 96
    cross_batch: int = 48
    mlm_lr: float = 4e-4
    cross_lr: float = 5e-5
    max_length: int = 128
    fgm_epsilon: float = 0.5
    dropout_samples: int = 5
    checkpoint_minutes: float = 5.0
    eval_minutes: float = 30.0
    precision: str = "auto"
    device: str = "auto"  # "cuda" where PyTorch sees a GPU (scripts/device_train.sh), else "cpu"
    workers: int = 0  # pretraining batches made by this many worker processes (0: in the training process)
    seed: int = 0
    # an FP16 snapshot of the pretraining in progress, kept in the repository (teacher/): a run on a machine
    # without the checkpoints in ``out`` starts from it instead of from scratch (fresh optimizer state)
    snapshot: Path | None = None
    log: object = field(default=print, repr=False)


def _device(cfg: TeacherConfig) -> str:
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _autocast(cfg: TeacherConfig):
    from mgeo_index.runtime.inference import _autocast as autocast

    return autocast(_device(cfg), resolve_precision(cfg.precision))


def _record(cfg: TeacherConfig, stage: str, stats: dict) -> None:
    """Merge a stage's figures into ``out/teacher.json`` (the recipe's record, all runs summed)."""
    record_stage(cfg.out / "teacher.json", cfg, stage, stats)


def bert_config(cfg: TeacherConfig, tokenizer) -> BertConfig:
    return BertConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.max_length, type_vocab_size=2, pad_token_id=tokenizer.pad_token_id,
        num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)},
    )


def mask_elements(input_ids: torch.Tensor, offsets: list[list[tuple[int, int]]], tokenizer, rng: random.Random,
                  rate: float = 0.15):
    """Whole-element masking: mask entire elements (given as token ranges per row) until about
    ``rate`` of the row's characters are masked; 80/10/10 as in BERT."""
    labels = torch.full_like(input_ids, -100)
    ids = input_ids.clone()
    for row, spans in enumerate(offsets):
        total = sum(end - start for start, end in spans)
        target, masked = max(1, round(rate * total)), 0
        for start, end in rng.sample(spans, len(spans)):
            if masked >= target:
                break
            if end - start > 2 * target:  # an element longer than the whole budget: mask a part of it
                start = rng.randrange(start, end - target + 1)
                end = start + target
            for pos in range(start, end):
                labels[row, pos] = ids[row, pos]
                roll = rng.random()
                if roll < 0.8:
                    ids[row, pos] = tokenizer.mask_token_id
                elif roll < 0.9:
                    ids[row, pos] = rng.randrange(5, len(tokenizer))
            masked += end - start
    return ids, labels


def _element_ranges(elements: list[list[str]]) -> tuple[str, list[tuple[int, int]]]:
    """The normalized text of a tagged address and its elements' token ranges (1 = after [CLS])."""
    text, ranges = "", []
    for _, span in elements:
        span = normalize(span)
        if span:
            ranges.append((1 + len(text), 1 + len(text) + len(span)))
            text += span
    return text, ranges


def pretraining_data(cfg: TeacherConfig, rng: random.Random):
    singles = [normalize(t) for t in data.corpus(cfg.data_dir, rng)]
    singles = [t for t in dict.fromkeys(singles) if t]
    tagged = []
    for row in data.tagged_addresses(cfg.data_dir):
        if row.get("split", "train") == "train" and row.get("elements"):
            text, ranges = _element_ranges(row["elements"])
            if ranges and len(text) + 2 <= cfg.max_length:
                tagged.append((text, ranges))
    pairs = [(normalize(p.a), normalize(p.b), LABELS.index(p.label)) for p in data.all_pairs(cfg.data_dir)
             if split_of(p.group) == "train"]
    return singles, tagged, [p for p in pairs if p[0] and p[1]]


class PretrainingModel(torch.nn.Module):
    """BERT masked-LM plus a three-way label head on ``[CLS]`` for labelled pair batches."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.mlm = BertForMaskedLM(config)
        self.label_head = torch.nn.Linear(config.hidden_size, len(LABELS))

    def forward(self, labels_for_pairs: torch.Tensor | None = None, **inputs):
        out = self.mlm(**inputs, output_hidden_states=labels_for_pairs is not None)
        loss = out.loss
        if labels_for_pairs is not None:
            cls = out.hidden_states[-1][:, 0]
            loss = loss + 0.5 * F.cross_entropy(self.label_head(cls).float(), labels_for_pairs)
        return loss, out.logits


def pretraining_batches(cfg: TeacherConfig, tokenizer, singles, tagged, pairs, rng: random.Random, first_kind: int = 0):
    """Endless pretraining batches (CPU tensors), in turn: single texts with n-gram masks, tagged addresses
    with whole-element masks, labelled pairs (n-gram masks, plus ``pair_labels`` for the label head)."""
    single_batches = shuffled_batches(singles, cfg.mlm_batch, rng)
    tagged_batches = shuffled_batches(tagged, cfg.mlm_batch, rng)
    pair_batches = shuffled_batches(pairs, cfg.mlm_batch // 2, rng)
    kind = first_kind
    while True:
        extra = {}
        if kind == 2:
            batch = next(pair_batches)
            enc = tokenizer([a for a, _, _ in batch], [b for _, b, _ in batch], padding=True, truncation=True,
                            max_length=cfg.max_length, return_tensors="pt", return_special_tokens_mask=True)
            extra["pair_labels"] = torch.tensor([label for *_, label in batch])
        else:
            batch = next(single_batches) if kind == 0 else next(tagged_batches)
            texts = batch if kind == 0 else [text for text, _ in batch]
            enc = tokenizer(texts, padding=True, truncation=True, max_length=cfg.max_length,
                            return_tensors="pt", return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask").bool() | ~enc["attention_mask"].bool()
        if kind == 1:
            ids, labels = mask_elements(enc["input_ids"], [ranges for _, ranges in batch], tokenizer, rng)
        else:
            ids, labels = mask_spans(enc["input_ids"], special, tokenizer, rng)
        yield {"input_ids": ids, "attention_mask": enc["attention_mask"], "token_type_ids": enc["token_type_ids"],
               "labels": labels} | extra
        kind = (kind + 1) % 3


class _PretrainingStream(torch.utils.data.IterableDataset):
    """:func:`pretraining_batches` in each DataLoader worker, with the worker's own random stream."""

    def __init__(self, cfg: TeacherConfig, tokenizer, texts: tuple, seed: int, first_kind: int):
        self.cfg, self.tokenizer, self.texts, self.seed, self.first_kind = cfg, tokenizer, texts, seed, first_kind

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = 0 if info is None else info.id
        rng = random.Random(self.seed * 1009 + worker)
        return pretraining_batches(self.cfg, self.tokenizer, *self.texts, rng, first_kind=(self.first_kind + worker) % 3)


def stage_mlm(cfg: TeacherConfig, tokenizer) -> Path:
    path, ckpt = cfg.out / "mlm", cfg.out / "mlm_checkpoint.pt"
    if (path / "stage.json").exists():
        stats = json.loads((path / "stage.json").read_text())
        if stats["minutes"] >= cfg.mlm_minutes - 1e-9:
            return path
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    singles, tagged, pairs = pretraining_data(cfg, random.Random(cfg.seed))
    cfg.log(f"[teacher mlm] {len(singles)} texts, {len(tagged)} tagged, {len(pairs)} labelled train pairs")
    device = _device(cfg)
    model = PretrainingModel(bert_config(cfg, tokenizer)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.mlm_lr, weight_decay=0.01)
    start_step, start_elapsed = 0, 0.0
    if ckpt.exists():
        state = restore_checkpoint(ckpt, model, optimizer, rng)
        start_step, start_elapsed = state["step"], state["elapsed"]
        cfg.log(f"[teacher mlm] resuming at step {start_step} ({start_elapsed / 60:.1f} min done)")
    elif cfg.snapshot is not None and (cfg.snapshot / SNAPSHOT_WEIGHTS).exists():
        start_step, start_elapsed = load_snapshot(model, cfg.snapshot)
        cfg.log(f"[teacher mlm] no checkpoint in {cfg.out}: starting from the snapshot in {cfg.snapshot} "
                f"(step {start_step}, {start_elapsed / 60:.1f} min done; optimizer state starts afresh)")
    if cfg.workers > 0:  # batches made by worker processes (a GPU outruns one process's tokenizing and masking)
        stream = torch.utils.data.DataLoader(
            _PretrainingStream(cfg, tokenizer, (singles, tagged, pairs), seed=cfg.seed + start_step, first_kind=start_step % 3),
            batch_size=None, num_workers=cfg.workers, prefetch_factor=8, pin_memory=device.startswith("cuda"))
        batches = iter(stream)
    else:  # one process: a resumed run draws exactly the batches the uninterrupted one would have
        batches = pretraining_batches(cfg, tokenizer, singles, tagged, pairs, rng, first_kind=start_step % 3)
    accuracy: list[float] = []

    def step():
        inputs = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
        pair_labels, labels = inputs.pop("pair_labels", None), inputs["labels"]
        with _autocast(cfg):
            loss, logits = model(labels_for_pairs=pair_labels, **inputs)
        picked = labels != -100
        accuracy.append(float((logits.argmax(-1)[picked] == labels[picked]).float().mean()))
        return loss

    started = time.perf_counter()

    def save_checkpoint(steps: int, elapsed: float) -> None:
        save_atomic(checkpoint_of(model, optimizer, rng, steps, elapsed), ckpt)
        _record(cfg, "mlm", {"steps": steps, "minutes": elapsed / 60, "done": False,
                             "masked_accuracy_last100": float(np.mean(accuracy[-100:])) if accuracy else None,
                             "session_minutes": (time.perf_counter() - started) / 60})

    steps, elapsed = timed_loop("teacher mlm", cfg.mlm_minutes, cfg.mlm_lr, optimizer, step, cfg.log,
                                start_step=start_step, start_elapsed=start_elapsed, checkpoint=save_checkpoint,
                                checkpoint_every=cfg.checkpoint_minutes * 60)
    save_checkpoint(steps, elapsed)
    model.mlm.bert.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save(model.label_head.state_dict(), path / "label_head.pt")
    stats = {"steps": steps, "minutes": elapsed / 60, "done": True,
             "masked_accuracy_last100": float(np.mean(accuracy[-100:])) if accuracy else None}
    (path / "stage.json").write_text(json.dumps(stats))
    _record(cfg, "mlm", stats)
    shutil.rmtree(cfg.out / "cross", ignore_errors=True)  # new pretraining makes the fine-tuning stale
    (cfg.out / "cross_checkpoint.pt").unlink(missing_ok=True)
    return path


SNAPSHOT_WEIGHTS = "mlm-snapshot.safetensors"
CROSS_SNAPSHOT = "cross-snapshot.safetensors"


def save_snapshot(cfg: TeacherConfig, target: Path) -> dict:
    """The latest stage's weights in FP16 (about 32 MB for 8 x 384) with its step and minutes, for the
    repository: what survives a move to a machine that lacks ``cfg.out``.

    During pretraining: the pretraining checkpoint (``mlm-snapshot.*``). Once fine-tuning has started: its
    best weights so far on the round-2 calibration pairs (``cross-snapshot.*``; a run resumed from it goes
    on from that point); the pretraining snapshot is then removed (the two would pass the 60 MB kept for
    the teacher, and fine-tuning no longer needs it)."""
    from safetensors.torch import save_file

    cross_ckpt, best_path = cfg.out / "cross_checkpoint.pt", cfg.out / "cross_best.pt"
    target.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(cfg, k) for k in ("hidden", "layers", "heads", "intermediate")}
    if cross_ckpt.exists():
        state = torch.load(cross_ckpt, weights_only=False, map_location="cpu")
        best = state.get("best", {})
        if best_path.exists() and "step" in best:  # the best weights, at the step they were evaluated
            weights, info = torch.load(best_path, map_location="cpu"), {"step": best["step"], "elapsed": best["minutes"] * 60, "best": best}
        else:  # not evaluated yet: the latest weights
            weights, info = state["model"], {"step": state["step"], "elapsed": state["elapsed"], "best": {}}
        weights = {k: v.detach().to(torch.float16).contiguous() for k, v in weights.items()}
        replace_atomic(target / CROSS_SNAPSHOT, lambda tmp: save_file(weights, tmp))
        write_json_atomic(target / "cross-snapshot.json", info | {"stage": "cross", "config": config})
        for name in (SNAPSHOT_WEIGHTS, "mlm-snapshot.json"):
            (target / name).unlink(missing_ok=True)
        return info | {"stage": "cross", "megabytes": (target / CROSS_SNAPSHOT).stat().st_size / 2**20}
    state = torch.load(cfg.out / "mlm_checkpoint.pt", weights_only=False, map_location="cpu")
    weights = {k: v.detach().to(torch.float16).contiguous() for k, v in state["model"].items()}
    # tied weights (the MLM decoder shares the word embeddings) are stored once
    weights.pop("mlm.cls.predictions.decoder.weight", None)
    replace_atomic(target / SNAPSHOT_WEIGHTS, lambda tmp: save_file(weights, tmp))
    info = {"step": state["step"], "elapsed": state["elapsed"], "config": config}
    write_json_atomic(target / "mlm-snapshot.json", info)
    return info | {"stage": "mlm", "megabytes": (target / SNAPSHOT_WEIGHTS).stat().st_size / 2**20}


def load_snapshot(model: torch.nn.Module, source: Path) -> tuple[int, float]:
    from safetensors.torch import load_file

    weights = {k: v.float() for k, v in load_file(source / SNAPSHOT_WEIGHTS).items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"mlm.cls.predictions.decoder.weight"}:
        raise ValueError(f"{source}: the snapshot does not fit this teacher (missing {missing}, unexpected {unexpected})")
    model.mlm.tie_weights()
    info = json.loads((source / "mlm-snapshot.json").read_text())
    return int(info["step"]), float(info["elapsed"])


def _cross_snapshot(cfg: TeacherConfig) -> Path | None:
    """The snapshot directory when it holds a fine-tuning snapshot and ``cfg.out`` has no checkpoint of its own."""
    if cfg.snapshot is None or not (cfg.snapshot / CROSS_SNAPSHOT).exists():
        return None
    if (cfg.out / "cross_checkpoint.pt").exists() or (cfg.out / "cross" / "stage.json").exists():
        return None
    return cfg.snapshot


def fine_tuning_data(cfg: TeacherConfig):
    pairs = data.all_pairs(cfg.data_dir)
    train = [(normalize(p.a), normalize(p.b), LABELS.index(p.label), SOURCE_WEIGHTS.get(p.source, 1.0))
             for p in pairs if split_of(p.group) == "train"]
    # the choice is made on the round-2 part of the calibration split (the held-out data is round 2)
    calib = [(normalize(p.a), normalize(p.b), LABELS.index(p.label)) for p in data.ccks_pairs(cfg.data_dir)
             if split_of(p.group) == "calib" and p.source == "round2_train"]
    return [t for t in train if t[0] and t[1]], calib


def _pooled_logits(model: BertForSequenceClassification, inputs: dict, samples: int) -> torch.Tensor:
    """Multi-sample dropout: the classifier on ``samples`` dropout masks of the pooled output, averaged
    logits (at inference, dropout is off and this is the plain sequence classifier)."""
    pooled = model.bert(**inputs).pooler_output
    if not model.training or samples <= 1:
        return model.classifier(model.dropout(pooled))
    return torch.stack([model.classifier(model.dropout(pooled)) for _ in range(samples)]).mean(0)


class FGM:
    """Fast gradient method on the word embeddings: add ε·g/‖g‖, backpropagate again, restore."""

    def __init__(self, model: BertForSequenceClassification, epsilon: float):
        self.weight = model.bert.embeddings.word_embeddings.weight
        self.epsilon = epsilon
        self.backup: torch.Tensor | None = None

    def attack(self) -> bool:
        grad = self.weight.grad
        if grad is None or self.epsilon <= 0:
            return False
        norm = torch.linalg.vector_norm(grad)
        if not torch.isfinite(norm) or norm == 0:
            return False
        self.backup = self.weight.data.clone()
        self.weight.data.add_(self.epsilon * grad / norm)
        return True

    def restore(self) -> None:
        self.weight.data.copy_(self.backup)
        self.backup = None


def _cross_model(cfg: TeacherConfig, tokenizer, mlm_path: Path | None, snapshot: Path | None):
    """The cross-encoder training starts from: a snapshot's weights (a new machine), else pretraining's (with its
    pair-label head as the classifier), else fresh (a checkpoint's weights replace them, :func:`_cross_resumed`)."""
    if snapshot is not None or mlm_path is None:
        from safetensors.torch import load_file

        model = BertForSequenceClassification(bert_config(cfg, tokenizer)).train()
        if snapshot is not None:
            model.load_state_dict({k: v.float() for k, v in load_file(snapshot / CROSS_SNAPSHOT).items()})
        return model
    model = BertForSequenceClassification.from_pretrained(mlm_path, config=bert_config(cfg, tokenizer)).train()
    head = mlm_path / "label_head.pt"
    if head.exists():  # the pair-label head of pretraining starts the classifier
        model.classifier.load_state_dict(torch.load(head, map_location="cpu"))
    return model


def _cross_resumed(cfg: TeacherConfig, ckpt: Path, snapshot: Path | None, model, optimizer, rng,
                   best_path: Path) -> tuple[int, float, dict]:
    """(step, elapsed seconds, best so far) training goes on from: a checkpoint's (restored into ``model``,
    ``optimizer`` and ``rng``), else a snapshot's (its best weights kept as the best so far), else the start."""
    if ckpt.exists():
        state = restore_checkpoint(ckpt, model, optimizer, rng)
        cfg.log(f"[teacher cross] resuming at step {state['step']} ({state['elapsed'] / 60:.1f} min done, "
                f"best {state['best']})")
        return state["step"], state["elapsed"], state["best"]
    if snapshot is None:
        return 0, 0.0, {"loss": math.inf}
    info = json.loads((snapshot / "cross-snapshot.json").read_text())
    start_step, start_elapsed, best = int(info["step"]), float(info["elapsed"]), info["best"] or {"loss": math.inf}
    if "step" in best:
        save_atomic(model.state_dict(), best_path)
    cfg.log(f"[teacher cross] no checkpoint in {cfg.out}: starting from the snapshot in {snapshot} (step {start_step}, "
            f"{start_elapsed / 60:.1f} min done, best {best}; optimizer state starts afresh)")
    return start_step, start_elapsed, best


def stage_cross(cfg: TeacherConfig, tokenizer, mlm_path: Path | None) -> Path:
    path, ckpt, best_path = cfg.out / "cross", cfg.out / "cross_checkpoint.pt", cfg.out / "cross_best.pt"
    if (path / "stage.json").exists():
        stats = json.loads((path / "stage.json").read_text())
        if stats["minutes"] >= cfg.cross_minutes - 1e-9:
            return path
    rng = random.Random(cfg.seed + 2)
    torch.manual_seed(cfg.seed + 2)
    snapshot = _cross_snapshot(cfg)
    model = _cross_model(cfg, tokenizer, mlm_path, snapshot)
    device = _device(cfg)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.cross_lr, weight_decay=0.01)
    train, calib = fine_tuning_data(cfg)
    weights = class_weights([label for _, _, label, _ in train]).to(device)
    cfg.log(f"[teacher cross] {len(train)} training pairs {dict(Counter(l for _, _, l, _ in train))}, "
            f"{len(calib)} round-2 calibration pairs")
    start_step, start_elapsed, best = _cross_resumed(cfg, ckpt, snapshot, model, optimizer, rng, best_path)
    batches = shuffled_batches(train, cfg.cross_batch, rng)
    fgm = FGM(model, cfg.fgm_epsilon)

    def loss_of(enc, labels, sample_weights):
        with _autocast(cfg):
            logits = _pooled_logits(model, enc, cfg.dropout_samples)
        per_pair = F.cross_entropy(logits.float(), labels, weight=weights, reduction="none")
        return (per_pair * sample_weights).sum() / sample_weights.sum()

    def step():
        batch = next(batches)
        firsts, seconds = zip(*[(a, b) if rng.random() < 0.8 else (b, a) for a, b, _, _ in batch])
        enc = {k: v.to(device, non_blocking=True) for k, v in tokenizer(
            list(firsts), list(seconds), padding=True, truncation=True, max_length=cfg.max_length, return_tensors="pt").items()}
        labels = torch.tensor([label for _, _, label, _ in batch]).to(device)
        sample_weights = torch.tensor([w for *_, w in batch], dtype=torch.float32).to(device)
        loss = loss_of(enc, labels, sample_weights)
        if cfg.fgm_epsilon > 0:
            # the adversarial pass's gradient is added to the clean one's (the loop steps after this)
            loss.backward()
            if fgm.attack():
                loss_of(enc, labels, sample_weights).backward()
                fgm.restore()
            return _Backpropagated(loss)
        return loss

    last_eval = {"elapsed": start_elapsed}
    started = time.perf_counter()

    def checkpoint(steps: int, elapsed: float) -> None:
        if elapsed - last_eval["elapsed"] >= cfg.eval_minutes * 60 or elapsed >= cfg.cross_minutes * 60:
            last_eval["elapsed"] = elapsed
            loss = calib_loss(model, tokenizer, calib, weights, cfg.max_length, device)
            cfg.log(f"[teacher cross] step {steps} round-2 calib loss {loss:.4f} (best {best['loss']:.4f})")
            if loss < best["loss"]:
                best.update(loss=loss, step=steps, minutes=elapsed / 60)
                save_atomic(model.state_dict(), best_path)
            model.train()
        save_atomic(checkpoint_of(model, optimizer, rng, steps, elapsed, best=best), ckpt)
        _record(cfg, "cross", {"steps": steps, "minutes": elapsed / 60, "done": False, "best": best,
                               "session_minutes": (time.perf_counter() - started) / 60})

    steps, elapsed = timed_loop("teacher cross", cfg.cross_minutes, cfg.cross_lr, optimizer, step, cfg.log,
                                start_step=start_step, start_elapsed=start_elapsed, checkpoint=checkpoint,
                                checkpoint_every=cfg.checkpoint_minutes * 60)
    last_eval["elapsed"] = -math.inf
    checkpoint(steps, elapsed)
    model.load_state_dict(torch.load(best_path, map_location=device))
    CrossEncoder(model.eval(), tokenizer, max_length=cfg.max_length).save(path, half=False)
    stats = {"steps": steps, "minutes": elapsed / 60, "done": True, "train_pairs": len(train),
             "kept_step": best["step"], "kept_minutes": best["minutes"], "round2_calib_loss": best["loss"]}
    (path / "stage.json").write_text(json.dumps(stats))
    _record(cfg, "cross", stats)
    return path


class _Backpropagated:
    """A loss whose gradients are already accumulated (FGM's two passes): the loop's backward is a no-op."""

    def __init__(self, loss: torch.Tensor):
        self.loss = loss.detach()

    def backward(self) -> None:
        pass

    def item(self) -> float:
        return float(self.loss)


def calib_loss(model, tokenizer, examples, weights: torch.Tensor, max_length: int, device: str = "cpu") -> float:
    from mgeo_index.query import labelling

    model.eval()
    cross = CrossEncoder(model, tokenizer, max_length=max_length)
    probs = labelling.score_pairs(cross, [a for a, _, _ in examples], [b for _, b, _ in examples], device=device)
    gold = torch.tensor([g for *_, g in examples])
    return float(F.nll_loss(torch.log(torch.tensor(probs).clamp_min(1e-12)), gold, weight=weights.cpu()))


def load_teacher(path: str | Path) -> CrossEncoder:
    """The teacher network (no feature head, temperature 1) from a checkpoint or snapshot: ``cross_best.pt``,
    ``cross_checkpoint.pt`` or ``teacher/cross-snapshot.safetensors``, of whatever depth and width the weights
    have; an exported folder loads as any cross-encoder does (``load_cross_encoder``)."""
    path = Path(path).expanduser()
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(path)
    else:
        state = torch.load(path, weights_only=False, map_location="cpu")
        state = state.get("model", state)
    cfg = TeacherConfig(data_dir=Path("."), **architecture_of(state))
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
    model = BertForSequenceClassification(bert_config(cfg, tokenizer))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return CrossEncoder(model.eval(), tokenizer, max_length=cfg.max_length)


def architecture_of(state: dict) -> dict:
    """A teacher's depth and widths read off its weights (heads of 64 dimensions, as every teacher here has)."""
    layers = {int(k.split(".")[3]) for k in state if k.startswith("bert.encoder.layer.")}
    hidden = state["bert.embeddings.word_embeddings.weight"].shape[1]
    return {"layers": len(layers), "hidden": hidden, "heads": hidden // 64,
            "intermediate": state["bert.encoder.layer.0.intermediate.dense.weight"].shape[0]}


def stage_export(cfg: TeacherConfig, cross: CrossEncoder | Path, target: Path) -> dict:
    """FP16 copy of the teacher (a loaded network, or the folder of one) with its temperature and decision offsets
    (network alone) in ``target``."""
    from mgeo_index.query import labelling
    from mgeo_index.model.cross_encoder import load_cross_encoder

    if not isinstance(cross, CrossEncoder):
        cross = load_cross_encoder(cross)
    examples = [(normalize(p.a), normalize(p.b), LABELS.index(p.label)) for p in data.ccks_pairs(cfg.data_dir)
                if split_of(p.group) == "calib"]
    cross.temperature = 1.0
    probs = labelling.score_pairs(cross, [a for a, _, _ in examples], [b for _, b, _ in examples], device="cpu")
    gold = np.array([g for *_, g in examples])
    cross.temperature = fit_temperature(np.log(np.clip(probs, 1e-12, None)), gold)
    probs = labelling.score_pairs(cross, [a for a, _, _ in examples], [b for _, b, _ in examples], device="cpu")
    cross.decision_offsets = fit_decision_offsets(probs, gold, cross.labels)
    cross.save(target, half=True)
    stats = {"temperature": cross.temperature, "decision_offsets": cross.decision_offsets,
             "megabytes": sum(f.stat().st_size for f in target.iterdir()) / 2**20}
    _record(cfg, "export", stats)
    return stats


def export_weights(cfg: TeacherConfig, weights: Path, target: Path) -> dict:
    """:func:`stage_export` of given weights (a snapshot or checkpoint :func:`load_teacher` reads), e.g. the
    repository's ``teacher/cross-snapshot.safetensors`` on a machine that never trained the teacher."""
    cfg.out.mkdir(parents=True, exist_ok=True)  # where the export's record goes
    return stage_export(cfg, load_teacher(weights), target)


def export_tower(weights: Path, layers: int, target: Path) -> Path:
    """A bi-encoder directory whose tower is the teacher's embeddings and its first ``layers`` layers, mean pooled:
    a start for retrieval training that has seen the teacher's pretraining
    (``python -m mgeo_index.training.bi_distil --bi-model target --pool-bi-model mgeo_index/model/default/bi``)."""
    from transformers import BertModel

    from mgeo_index.model.bi_encoder import BiEncoder

    teacher = load_teacher(weights)
    config = teacher.model.config
    if not 0 < layers <= config.num_hidden_layers:
        raise ValueError(f"--tower-layers must be 1 to {config.num_hidden_layers} (the teacher's depth), not {layers}")
    config = BertConfig(**{**config.to_dict(), "num_hidden_layers": layers})
    tower, bert = BertModel(config, add_pooling_layer=False), teacher.model.bert
    tower.embeddings.load_state_dict(bert.embeddings.state_dict())
    for mine, theirs in zip(tower.encoder.layer, bert.encoder.layer):  # the first ``layers``
        mine.load_state_dict(theirs.state_dict())
    BiEncoder(tower.eval(), teacher.tokenizer, max_length=64).save(target)
    return target


def train_teacher(cfg: TeacherConfig, export_to: Path | None = None) -> dict:
    quiet_transformers()
    cfg.out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
    # fine-tuning begun here (its checkpoint) or elsewhere (a fine-tuning snapshot) means the pretraining was
    # finished, maybe on another machine whose pretraining checkpoints this one never had: not redone
    tuning = (_cross_snapshot(cfg) is not None or (cfg.out / "cross_checkpoint.pt").exists()
              or (cfg.out / "cross" / "stage.json").exists())
    mlm_path = None if tuning and not (cfg.out / "mlm" / "stage.json").exists() else stage_mlm(cfg, tokenizer)
    cross_path = stage_cross(cfg, tokenizer, mlm_path)
    if export_to is not None:
        stage_export(cfg, cross_path, export_to)
    return json.loads((cfg.out / "teacher.json").read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data directory")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoints (outside the work tree)")
    parser.add_argument("--export", type=Path, default=None, help="write the FP16 teacher here when done (teacher/)")
    for name in ("hidden", "layers", "heads", "intermediate", "mlm_batch", "cross_batch", "workers", "seed"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(TeacherConfig, name))
    for name in ("mlm_minutes", "cross_minutes", "mlm_lr", "cross_lr", "fgm_epsilon", "checkpoint_minutes", "eval_minutes"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(TeacherConfig, name))
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--device", default="auto", help="cuda or cpu (auto: cuda where PyTorch sees a GPU)")
    parser.add_argument("--snapshot", type=Path, default=None,
                        help="start from the FP16 pretraining snapshot here when --out has no checkpoint (teacher/)")
    parser.add_argument("--save-snapshot", type=Path, default=None,
                        help="only write the latest stage's FP16 snapshot here (teacher/) and exit")
    parser.add_argument("--export-from", type=Path, default=None,
                        help="only export these weights (a fine-tuning snapshot or checkpoint, e.g. "
                             "teacher/cross-snapshot.safetensors) to --export, without training, and exit")
    parser.add_argument("--tower-layers", type=int, default=None,
                        help="with --export-from: export the teacher's embeddings and first K layers as a "
                             "bi-encoder (a retrieval tower to train) instead of the cross-encoder")
    args = vars(parser.parse_args(argv))
    export, save_to, export_from = args.pop("export"), args.pop("save_snapshot"), args.pop("export_from")
    tower_layers = args.pop("tower_layers")
    if tower_layers is not None and export_from is None:
        parser.error("--tower-layers needs --export-from SNAPSHOT (the teacher whose layers make the tower)")
    cfg = TeacherConfig(data_dir=args.pop("data"), log=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True), **args)
    if save_to is not None:
        print(json.dumps(save_snapshot(cfg, save_to), indent=2))
        return
    if export_from is not None:
        if export is None:
            parser.error("--export-from needs --export DIR (where the exported teacher goes)")
        if tower_layers is not None:
            try:
                print(export_tower(export_from, tower_layers, export))
            except ValueError as err:
                parser.error(str(err))
            return
        print(json.dumps(export_weights(cfg, export_from, export), indent=2))
        return
    print(json.dumps(train_teacher(cfg, export), indent=2, default=str))


if __name__ == "__main__":
    main()
