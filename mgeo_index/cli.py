"""mgeo-index command line: thin commands that open the library objects and call one function."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mgeo_index import settings

app = typer.Typer(
    name="mgeo-index",
    help="Chinese address entity resolution: build a catalog index, resolve messy addresses, score pairs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()
err = Console(stderr=True)

# Options shared by several commands, declared once.
IndexDir = Annotated[Path, typer.Option("--index-dir", "-i", help="Index directory (FAISS file, index.json, SQLite database).")]
Db = Annotated[str | None, typer.Option("--db", help="SQLAlchemy URL of the store [env MGEO_INDEX_DB; default: SQLite in the index dir].")]
Model = Annotated[Path | None, typer.Option("--model", help="Bi-encoder directory [env MGEO_INDEX_MODEL; default: the bundled model].")]
CrossModel = Annotated[Path | None, typer.Option("--cross-model", help="Cross-encoder directory [env MGEO_INDEX_CROSS_MODEL; default: bundled].")]
Device = Annotated[str | None, typer.Option("--device", help="cpu, cuda, cuda:1 … [env MGEO_INDEX_DEVICE; default: cuda when available].")]


@app.callback()
def main() -> None:
    """Chinese address entity resolution: build a catalog index, resolve messy addresses, score pairs."""


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Known failures become one red line naming what to fix, and exit code 1."""
    from mgeo_index.catalog import CatalogError
    from mgeo_index.model.manifest import ModelError
    from mgeo_index.resolver import ModelMismatch

    try:
        yield
    except (CatalogError, ModelError, ModelMismatch, FileNotFoundError, ValueError) as exc:
        err.print(f"[bold red]Error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None


class RateColumn(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} {self.unit}/s" if speed else f"– {self.unit}/s", style="progress.data.speed")


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn("rows"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


@app.command()
def build(
    catalog: Annotated[Path, typer.Argument(help="CSV or TSV file of addresses (UTF-8, UTF-8 with BOM or GB18030).")],
    index_dir: IndexDir = Path("mgeo-index"),
    address_column: Annotated[str | None, typer.Option(help="Column holding the address [default: detected].")] = None,
    id_column: Annotated[str | None, typer.Option(help="Column holding the catalog's own id (kept in results).")] = None,
    index: Annotated[str, typer.Option("--index", help="FAISS factory string: Flat, HNSW32, IVF4096,PQ32 …")] = settings.DEFAULT_INDEX_FACTORY,
    catalog_name: Annotated[str, typer.Option("--catalog", help="Catalog name in the store.")] = settings.DEFAULT_CATALOG,
    db: Db = None,
    model: Model = None,
    device: Device = None,
) -> None:
    """Validate, store and index a catalog. Re-running adds only new rows.

    Rejected rows go to rejects.tsv in the index directory with their line number and reason.

    Example: mgeo-index build catalog.csv --index-dir idx --id-column poi_id
    """
    from mgeo_index.build import build as run_build

    with friendly_errors(), _progress() as bar:
        tasks: dict[str, int] = {}

        def on_progress(stage: str, advance: int, total: int | None) -> None:
            if stage not in tasks:
                label = "Reading rows" if stage == "read" else "Encoding entries"
                tasks[stage] = bar.add_task(label, total=total)
            bar.update(tasks[stage], advance=advance, total=total)

        result = run_build(
            catalog, index_dir, db=db, catalog=catalog_name, address_column=address_column, id_column=id_column,
            factory=index, model=model, device=device, on_progress=on_progress,
        )
    table = Table(title=f"Build {result.build_id} of catalog '{result.catalog}'", show_header=False)
    for name, value in (
        ("rows read", result.rows_read),
        ("new entries", result.rows_inserted),
        ("already stored", result.rows_skipped),
        ("rejected", result.rows_rejected),
        ("entries in store", result.entries_total),
        ("vectors in index", result.vectors_total),
        ("vectors added", result.vectors_added),
        ("index", f"{result.index_factory} → {result.index_path}"),
        ("seconds", ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items())),
    ):
        table.add_row(name, str(value))
    if result.rejects_path:
        table.add_row("rejects file", result.rejects_path, style="yellow")
    console.print(table)


def _read_queries(queries: list[str], file: Path | None) -> list[str]:
    items = list(queries)
    if file is not None:
        items += [line.strip() for line in file.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    if not items and not sys.stdin.isatty():
        items = [line.strip() for line in sys.stdin if line.strip()]
    if not items:
        raise typer.BadParameter("give one or more queries, --file FILE, or lines on stdin")
    return items


@app.command()
def resolve(
    queries: Annotated[list[str] | None, typer.Argument(help="Addresses to resolve.")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="File with one address per line.")] = None,
    index_dir: IndexDir = Path("mgeo-index"),
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=1000, help="Candidates to retrieve and rerank.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per query per line.")] = False,
    no_rerank: Annotated[bool, typer.Option("--no-rerank", help="Retrieval only (no cross-encoder).")] = False,
    batch_size: Annotated[int, typer.Option(help="Queries per batch.")] = 256,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
) -> None:
    """Find the catalog entries a messy address refers to, reranked and labeled.

    Example: mgeo-index resolve "北京朝阳建国路88号" --index-dir idx --json
    """
    from mgeo_index.resolver import open_resolver

    items = _read_queries(queries or [], file)
    with friendly_errors():
        resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device, rerank=not no_rerank)
        for start in range(0, len(items), batch_size):
            batch = items[start : start + batch_size]
            for query, matches in zip(batch, resolver.resolve(batch, top_k=top_k, rerank=not no_rerank)):
                if as_json:
                    print(json.dumps({"query": query, "matches": matches}, ensure_ascii=False), flush=False)
                else:
                    console.print(_matches_table(query, matches))
        sys.stdout.flush()


def _matches_table(query: str, matches: list[dict]) -> Table:
    table = Table(title=query, title_justify="left")
    for name, justify in (("rank", "right"), ("id", "right"), ("address", "left"), ("score", "right"), ("label", "left"), ("probability", "right")):
        table.add_column(name, justify=justify)
    colors = {"exact_match": "green", "partial_match": "yellow", "not_match": "red"}
    for rank, m in enumerate(matches, 1):
        label = m.get("label", "")
        table.add_row(
            str(rank),
            str(m["id"]) + (f" ({m['source_id']})" if m.get("source_id") else ""),
            m["address"],
            f"{m['score']:.3f}",
            Text(label, style=colors.get(label, "")),
            f"{m['probability']:.3f}" if "probability" in m else "",
        )
    return table


@app.command()
def match(
    file: Annotated[Path, typer.Option("--file", "-f", help="TSV/CSV with header columns a and b.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output TSV: input columns + label + p_<label>.")],
    cross_model: CrossModel = None,
    device: Device = None,
) -> None:
    """Score address pairs: exact_match / partial_match / not_match with probabilities.

    Example: mgeo-index match --file pairs.tsv --out scored.tsv
    """
    from mgeo_index.match import match_file
    from mgeo_index.model.cross_encoder import load_cross_encoder

    with friendly_errors():
        if not file.is_file():
            raise FileNotFoundError(f"pairs file {file} does not exist")
        dev = settings.device(device)
        cross = load_cross_encoder(settings.cross_model_path(cross_model)).to(dev)
        with _progress() as bar:
            task = bar.add_task("Scoring pairs", total=None)
            result = match_file(file, out, cross, device=dev, on_progress=lambda n: bar.update(task, advance=n))
    for problem in result.invalid[:20]:
        err.print(f"[yellow]skipped[/] {problem}", highlight=False)
    if len(result.invalid) > 20:
        err.print(f"[yellow]… and {len(result.invalid) - 20} more rows with an empty address[/]")
    counts = ", ".join(f"{k} {v}" for k, v in result.label_counts.items())
    err.print(f"{result.scored} of {result.rows} pairs scored → {out} ({counts})")


def _db_url(index_dir: Path | None, db: str | None) -> str:
    if index_dir is None and not (db or settings.env("DB")):
        raise typer.BadParameter("give --index-dir or --db (or set MGEO_INDEX_DB)")
    return settings.database_url(index_dir or Path("."), db)


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    index_dir: Annotated[Path | None, typer.Option("--index-dir", "-i", help="Index directory (its SQLite store).")] = None,
    db: Db = None,
) -> None:
    """Apply pending migrations.

    Example: mgeo-index db upgrade --db postgresql://localhost/mgeo
    """
    from mgeo_index import store

    url = _db_url(index_dir, db)
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    store.upgrade(url, revision)
    console.print(f"database at revision {store.current_revision(url)}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, e.g. base or -1.")],
    index_dir: Annotated[Path | None, typer.Option("--index-dir", "-i")] = None,
    db: Db = None,
) -> None:
    """Revert migrations down to REVISION.

    Example: mgeo-index db downgrade base --index-dir idx
    """
    from mgeo_index import store

    url = _db_url(index_dir, db)
    store.downgrade(url, revision)
    console.print(f"database at revision {store.current_revision(url)}")


@db_app.command("current")
def db_current(
    index_dir: Annotated[Path | None, typer.Option("--index-dir", "-i")] = None,
    db: Db = None,
) -> None:
    """Print the database's migration revision.

    Example: mgeo-index db current --index-dir idx
    """
    from mgeo_index import store

    console.print(store.current_revision(_db_url(index_dir, db)) or "empty (no migrations applied)")


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
                    cross_minutes=cross_minutes, seed=seed, log=err.print)
    )
    console.print_json(data={k: metrics[k] for k in ("ccks_dev", "shenzhen_dev", "ccks_dev_retrieval", "minutes")})


if __name__ == "__main__":
    app()
