"""The settings of `mgeo-index train` (no torch import: the CLI reads the defaults from here)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


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
    # more labelled pairs for the cross-encoder and its calibration: files such as `mgeo-index labels export`
    # writes (a, b, label; or query, candidate, label; or addr1, addr2, 0/1), split by query like the rest
    extra_pairs: tuple[Path, ...] = ()
    log: Callable[[str], None] = field(default=print, repr=False)
