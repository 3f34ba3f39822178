"""What the training recipes share (`mgeo-index train` and the teacher): precision, the wall-clock
budgeted loop and its learning-rate schedule, endless shuffled batches, class weights and span masking.
"""
from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from mgeo_index import settings
from mgeo_index.model.tokenizer import SPECIAL_TOKENS
from mgeo_index.settings import LABELS


def cpu_has_fast_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX)."""
    return bool({"avx512_bf16", "amx_bf16"} & settings.cpu_flags())


def resolve_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() or cpu_has_fast_bf16() else "fp32"


def lr_at(elapsed: float, budget: float, peak: float, warmup: float = 0.05) -> float:
    """Linear warm-up over the first ``warmup`` of the budget, then linear decay to 10%."""
    frac = min(elapsed / budget, 1.0)
    if frac < warmup:
        return peak * max(frac / warmup, 0.01)
    return peak * (1.0 - 0.9 * (frac - warmup) / (1.0 - warmup))


def timed_loop(
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


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` through the one atomic writer (:func:`mgeo_index.files.replace_atomic`)."""
    from mgeo_index.files import replace_atomic

    replace_atomic(path, lambda tmp: torch.save(obj, tmp))


def checkpoint_of(model, optimizer, rng: random.Random, steps: int, elapsed: float, **extra) -> dict:
    """What a resumable stage's checkpoint holds: weights, optimizer, both random states, progress (+ ``extra``)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(), "step": steps, "elapsed": elapsed, **extra}


def restore_checkpoint(path: Path, model, optimizer, rng: random.Random) -> dict:
    """Load a :func:`checkpoint_of` into ``model``, ``optimizer`` and the random states; returns it."""
    state = torch.load(path, weights_only=False, map_location="cpu")  # written on a GPU or not
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng.setstate(state["rng"])
    torch.set_rng_state(state["torch_rng"])
    return state


def record_stage(path: Path, cfg, stage: str, stats: dict) -> None:
    """Merge a stage's figures into a recipe's JSON record at ``path`` (its settings ``cfg``, a dataclass with a
    ``log`` callable, are written the first time)."""
    from mgeo_index.files import write_json_atomic

    record = json.loads(path.read_text()) if path.exists() else {}
    record.setdefault("config", {k: str(v) for k, v in asdict(cfg).items() if k != "log"})
    record[stage] = stats
    write_json_atomic(path, record)


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
