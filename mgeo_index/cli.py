"""mgeo-index command line: thin commands that call one library function each."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    name="mgeo-index",
    help="Chinese address entity resolution: build a catalog index, resolve messy addresses, score pairs.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


@app.callback()
def main() -> None:
    """Chinese address entity resolution: build a catalog index, resolve messy addresses, score pairs."""


@app.command()
def train(
    data: Annotated[Path, typer.Option(help="The shared data folder (pairs/, catalog/, admin/).")] = Path("../shared/data"),
    out: Annotated[Path, typer.Option(help="Output folder: bi/, cross/, metrics.json, work/ (stage checkpoints).")] = Path("runs/train"),
    mlm_minutes: Annotated[float, typer.Option(help="Masked-LM pretraining budget.")] = 12.0,
    bi_minutes: Annotated[float, typer.Option(help="Bi-encoder contrastive training budget.")] = 10.0,
    cross_minutes: Annotated[float, typer.Option(help="Cross-encoder training budget.")] = 18.0,
    seed: int = 0,
) -> None:
    """Train the tokenizer, bi-encoder and cross-encoder from the shared data.

    Finished stages are skipped when the command is re-run, so an interrupted run resumes.

    Example: mgeo-index train --data ../shared/data --out runs/train
    """
    from mgeo_index.training.train import TrainConfig, train as run_training

    if not (data / "pairs").is_dir():
        raise typer.BadParameter(f"{data} has no pairs/ folder; point --data at the shared data folder.")
    metrics = run_training(
        TrainConfig(data_dir=data, out=out, mlm_minutes=mlm_minutes, bi_minutes=bi_minutes,
                    cross_minutes=cross_minutes, seed=seed, log=err_console.print)
    )
    console.print_json(data={k: metrics[k] for k in ("ccks_dev", "shenzhen_dev", "ccks_dev_retrieval", "minutes")})


if __name__ == "__main__":
    app()
