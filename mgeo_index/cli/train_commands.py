"""train: the recipe. Its defaults are TrainConfig's (mgeo_index.training.config imports no torch)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mgeo_index.cli.errors import friendly_errors
from mgeo_index.cli.options import SHARED_DATA
from mgeo_index.cli.render import console, log
from mgeo_index.training.config import TrainConfig

DEFAULT_OUT = Path("runs/train")
_DEFAULT = TrainConfig(data_dir=SHARED_DATA, out=DEFAULT_OUT)  # the option defaults


def train(
    data: Annotated[Path, typer.Option(help="The shared data folder (pairs/, catalog/, admin/).")] = SHARED_DATA,
    out: Annotated[Path, typer.Option(help="Output folder: bi/, cross/, metrics.json, work/ (stage checkpoints).")] = DEFAULT_OUT,
    mlm_minutes: Annotated[float, typer.Option(help="Masked-LM pretraining budget.")] = _DEFAULT.mlm_minutes,
    bi_minutes: Annotated[float, typer.Option(help="Bi-encoder contrastive training budget.")] = _DEFAULT.bi_minutes,
    cross_minutes: Annotated[float, typer.Option(help="Cross-encoder training budget.")] = _DEFAULT.cross_minutes,
    precision: Annotated[str, typer.Option(help="auto (bf16 on CUDA or AVX512-BF16/AMX CPUs, else fp32), fp32 or bf16.")] = _DEFAULT.precision,
    seed: int = _DEFAULT.seed,
    pairs: Annotated[list[Path] | None, typer.Option("--pairs", help="More labelled pairs for the cross-encoder (repeatable): a, b, label files such as labels export writes.")] = None,
) -> None:
    """Train the tokenizer, bi-encoder and cross-encoder from the shared data.

    Finished stages are skipped when the command is re-run, so an interrupted run resumes.

    Example: mgeo-index train --data ../shared/data --out runs/train --pairs labels.tsv
    """
    with friendly_errors():  # training needs transformers: the train extra, named where it is missing
        from mgeo_index.training.train import train as run_training

    if not (data / "pairs").is_dir():
        raise typer.BadParameter(f"{data} has no pairs/ folder; point --data at the shared data folder.")
    for path in pairs or []:
        if not path.is_file():
            raise typer.BadParameter(f"--pairs {path} does not exist")
    metrics = run_training(
        TrainConfig(data_dir=data, out=out, mlm_minutes=mlm_minutes, bi_minutes=bi_minutes,
                    cross_minutes=cross_minutes, precision=precision, seed=seed, extra_pairs=tuple(pairs or ()), log=log)
    )
    console.print_json(data={k: metrics[k] for k in ("ccks_dev", "shenzhen_dev", "ccks_dev_retrieval", "minutes")})
