"""Options shared by several commands, declared once, and the defaults the commands take from the library.

Help texts go through rich markup (typer's rich help), so a literal ``[`` is written ``\\[``: without it
``[env …; default: …]`` vanished from the help.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mgeo_index import settings
from mgeo_index.runtime.plan import ONE_SHOT_QUERIES

IndexDir = Annotated[Path, typer.Option("--index-dir", "-i", help="Index directory (FAISS file, index.json, SQLite database).")]
Db = Annotated[str | None, typer.Option("--db", help="SQLAlchemy URL of the store \\[env MGEO_INDEX_DB; default: SQLite in the index dir].")]
Model = Annotated[Path | None, typer.Option("--model", help="Bi-encoder directory \\[env MGEO_INDEX_MODEL; default: the bundled model].")]
CrossModel = Annotated[Path | None, typer.Option("--cross-model", help="Cross-encoder directory \\[env MGEO_INDEX_CROSS_MODEL; default: bundled].")]
Device = Annotated[str | None, typer.Option("--device", help="cpu, cuda, cuda:1 … \\[env MGEO_INDEX_DEVICE; default: cuda when available].")]
Backend = Annotated[str | None, typer.Option("--backend", help=(
    f"CPU inference backend: {', '.join(settings.BACKENDS[:-1])} or {settings.BACKENDS[-1]} "
    "\\[env MGEO_INDEX_BACKEND; default: bf16 on CPUs with AMX, int8 with VNNI, else torch; torch on CUDA; "
    "numpy computes without torch (a one-shot resolve starts in 1.7 s, not 2.6 s; answers agree to near-ties): "
    f"a resolve of up to {ONE_SHOT_QUERIES} addresses uses it where the default is torch, whose answers it gives; "
    "mgeo-index bench compares them on this machine]."))]
Retrieval = Annotated[str, typer.Option("--retrieval", help="hybrid (dense + character n-grams, fused), dense or sparse.")]
AdminFilter = Annotated[bool, typer.Option("--admin-filter", help="Drop candidates in another city or district than the query's (when both are known).")]
RerankDepth = Annotated[int | None, typer.Option("--rerank-depth", min=1, help="Candidates of the pool reranked after the feature prescreen (at least --top-k); the cross-encoder network judges the first 4 of them within 0.3 of the best, the rest keep the feature head's probabilities \\[default: 10].")]
Profile = Annotated[str | None, typer.Option("--profile", help=(
    "default (the small cross-encoder) or accurate (the 12 x 384 network: better labels and ranking, about 2-3x "
    "the CPU time) \\[env MGEO_INDEX_PROFILE; default: the index's (build --profile), else accurate on a CUDA "
    "device, else default]."))]
Numbers = Annotated[str | None, typer.Option("--numbers", help=(
    "strict: two addresses writing different road / house / building / floor / unit / room numbers are never "
    "exact_match; loose: the scorer alone, for catalogs whose numbers are unreliable (POI lists) "
    "\\[env MGEO_INDEX_NUMBERS; default: the index's (build --numbers), else strict]."))]
RawValues = Annotated[bool, typer.Option("--raw-values", help=(
    "Write every cell as it is. By default a cell that would start a spreadsheet formula (=, +, -, @) is written "
    "with a leading ' so that a spreadsheet shows it as text."))]
Split = Annotated[str, typer.Option(help=(
    "Keep rows of this split of the shared data: dev (where choices are made), holdout (never used for a choice), "
    "calib, train, or all; several, comma-separated (dev,holdout), are measured side by side."))]
Pairwise = Annotated[bool, typer.Option("--pairwise", help=(
    "Label every pair alone; by default consecutive rows sharing their first address are one query's candidates, "
    "labelled together by the model's group head."))]
AddressColumn = Annotated[str | None, typer.Option(help="Column holding the address \\[default: detected].")]
QueriesFile = Annotated[Path | None, typer.Option("--file", "-f", help="File with one address per line.")]
# the runner that parses and embeds for build and add (mgeo_index.compute)
RunnerName = Annotated[str, typer.Option("--runner", "--engine", help="Where entries are parsed and embedded: local (this process) or ray (Ray Data actor pools; the store, the files and the generation switch stay here).")]
RayAddress = Annotated[str | None, typer.Option("--ray-address", help="Ray cluster to join with --runner ray: HOST:PORT of its head, ray://HOST:10001 or auto \\[default: a local Ray on this machine].")]
Workers = Annotated[int | None, typer.Option("--workers", min=1, help="Worker processes (local, CPU) or Ray actors (--runner ray) per step, each loading the model once \\[default: this process locally; with Ray, the CPU count locally, 1 on a cluster].")]
GpusPerWorker = Annotated[float, typer.Option("--gpus-per-worker", min=0.0, help="GPUs per embedding actor with --runner ray (0: CPU actors; 0.5 packs two a GPU).")]
DEFAULT_INDEX_DIR = Path("mgeo-index")  # README: the index directory is ./mgeo-index unless told
SHARED_DATA = Path("../shared/data")  # the shared data folder beside a checkout (train, bench --data)


class LibraryDefault:
    """An option default that is a library constant, read when first needed — a run without the option, or
    the command's ``--help`` — so that defining the command imports nothing. (The normalize defaults live in
    :mod:`mgeo_index.jobs`, whose import loads the store, SQLAlchemy and Alembic: a second on every
    ``mgeo-index --help``; gc's in :mod:`mgeo_index.catalog.generations`, which loads FAISS.) Click calls a callable
    default; typer's help shows its ``str``.
    """

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self):
        import importlib

        return getattr(importlib.import_module(self.module), self.name)

    def __str__(self) -> str:
        return str(self())

    def __repr__(self) -> str:
        return f"LibraryDefault({self.module!r}, {self.name!r})"
