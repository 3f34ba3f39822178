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
BACKENDS = ("torch", "bf16", "compile", "int8", "onnx")  # backends.BACKENDS, without importing torch for --help
Backend = Annotated[str | None, typer.Option("--backend", help="CPU inference backend: torch, bf16, compile, int8 or onnx [env MGEO_INDEX_BACKEND; default: settings.DEFAULT_CPU_BACKEND, torch on CUDA].")]
Retrieval = Annotated[str, typer.Option("--retrieval", help="hybrid (dense + character n-grams, fused), dense or sparse.")]
AdminFilter = Annotated[bool, typer.Option("--admin-filter", help="Drop candidates in another city or district than the query's (when both are known).")]
RerankDepth = Annotated[int | None, typer.Option("--rerank-depth", min=1, help="Candidates of the pool the cross-encoder network scores, after the feature prescreen (at least --top-k) [default: 10].")]


@app.callback()
def main() -> None:
    """Chinese address entity resolution: build a catalog index, resolve messy addresses, score pairs."""


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Known failures become one red line naming what to fix, and exit code 1."""
    from mgeo_index.catalog import CatalogError
    from mgeo_index.locking import Locked
    from mgeo_index.model.manifest import ModelError
    from mgeo_index.resolver import ModelMismatch
    from mgeo_index.store import GenerationConflict

    from alembic.util.exc import CommandError
    from sqlalchemy.exc import ArgumentError, DBAPIError

    try:
        yield
    except (CatalogError, ModelError, ModelMismatch, Locked, GenerationConflict, FileNotFoundError, NotADirectoryError,
            ValueError, ImportError) as exc:
        err.print(f"[bold red]Error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    except CommandError as exc:  # a revision this version does not know (a newer release migrated the store)
        err.print(f"[bold red]Database error:[/] {exc}. The store may have been migrated by a newer mgeo-index; "
                  "use that version, or `mgeo-index db current` to see its revision.", highlight=False)
        raise typer.Exit(1) from None
    except DBAPIError as exc:  # cannot connect, no such database or role, …: the driver's own words
        words = str(exc.orig if exc.orig is not None else exc).strip().splitlines()
        reason = words[0] if words else type(exc.orig or exc).__name__
        err.print(f"[bold red]Database error:[/] {reason}. Check --db / {settings.ENV_PREFIX}DB (URL, server, "
                  "database, user) and that the server is running.", highlight=False)
        raise typer.Exit(1) from None
    except ArgumentError as exc:  # a URL SQLAlchemy cannot parse, an unknown dialect or driver
        err.print(f"[bold red]Error:[/] invalid --db URL: {exc}. Expected e.g. postgresql://user@host:5432/db or "
                  "sqlite:////path/to/file.db", highlight=False)
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
    backend: Backend = None,
) -> None:
    """Validate, store and index a catalog. Re-running adds new rows and re-embeds only changed ones.

    Rejected rows go to rejects.tsv in the index directory with their line number and reason.

    Example: mgeo-index build catalog.csv --index-dir idx --id-column poi_id
    """
    from mgeo_index.build import build as run_build

    with friendly_errors(), _progress() as bar:
        tasks: dict[str, int] = {}

        def on_progress(stage: str, advance: int, total: int | None) -> None:
            if stage not in tasks:
                label = {"read": "Reading rows", "parse": "Parsing entries"}.get(stage, "Encoding entries")
                tasks[stage] = bar.add_task(label, total=total)
            bar.update(tasks[stage], advance=advance, total=total)

        result = run_build(
            catalog, index_dir, db=db, catalog=catalog_name, address_column=address_column, id_column=id_column,
            factory=index, model=model, device=device, backend=backend, on_progress=on_progress,
        )
    table = Table(title=f"Build {result.build_id} of catalog '{result.catalog}'", show_header=False)
    for name, value in (
        ("columns", f"address {result.address_column!r}, id "
                    + (repr(result.id_column) if result.id_column else "none (rows keyed by their address)")),
        ("rows read", result.rows_read),
        ("new entries", result.rows_inserted),
        ("updated entries", result.rows_updated),
        ("already stored", result.rows_skipped),
        ("rejected", result.rows_rejected),
        ("entries in store", result.entries_total),
        ("vectors in index", result.vectors_total),
        ("vectors added", result.vectors_added),
        ("entries parsed", result.entries_parsed),
        ("index", f"{result.index_factory} → {result.index_path}"),
        ("seconds", ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items())),
    ):
        table.add_row(name, str(value))
    if result.rejects_path:
        table.add_row("rejects file", result.rejects_path, style="yellow")
    console.print(table)


def _encode_progress(bar: Progress):
    tasks: dict[str, int] = {}

    def on_progress(stage: str, advance: int, total: int | None) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task("Reading rows" if stage == "read" else "Encoding entries", total=total)
        bar.update(tasks[stage], advance=advance, total=total)

    return on_progress


@app.command()
def add(
    delta: Annotated[Path, typer.Argument(help="CSV/TSV of new or changed rows, with the catalog's columns.")],
    index_dir: IndexDir = Path("mgeo-index"),
    db: Db = None,
    model: Model = None,
    device: Device = None,
) -> None:
    """Add new rows and update changed ones (same catalog id, new address) without re-embedding the rest.

    The result is a new index generation; readers switch to it in one transaction.

    Example: mgeo-index add delta.csv --index-dir idx
    """
    from mgeo_index.update import add as run_add

    with friendly_errors(), _progress() as bar:
        result = run_add(delta, index_dir, db=db, model=model, device=device, on_progress=_encode_progress(bar))
    table = Table(title=f"Generation {result.generation_id} of catalog '{result.catalog}' (build {result.build_id})", show_header=False)
    for name, value in (
        ("rows read", result.rows_read), ("new entries", result.rows_inserted), ("updated entries", result.rows_updated),
        ("unchanged", result.rows_skipped), ("rejected", result.rows_rejected), ("vectors added", result.vectors_added),
        ("vectors removed", result.vectors_removed), ("vectors in index", result.vectors_total),
        ("seconds", ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items())),
    ):
        table.add_row(name, str(value))
    if result.rejects_path:
        table.add_row("rejects file", result.rejects_path, style="yellow")
    console.print(table)


@app.command()
def remove(
    ids: Annotated[list[str] | None, typer.Option("--ids", help="Catalog ids to remove (repeat the option or list them).")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="File with one catalog id per line.")] = None,
    index_dir: IndexDir = Path("mgeo-index"),
    db: Db = None,
    model: Model = None,
    device: Device = None,
) -> None:
    """Remove catalog entries by their catalog id; the new generation no longer returns them.

    Ids not in the catalog are listed, not an error, so an interrupted removal can be re-run.

    Example: mgeo-index remove --ids P0001 --ids P0002 --index-dir idx
    """
    from mgeo_index.update import read_ids_file, remove as run_remove

    with friendly_errors():
        wanted = list(ids or []) + (read_ids_file(file) if file is not None else [])
        if not wanted:
            raise ValueError(f"{file} holds no ids (one catalog id a line)" if file is not None
                             else "give --ids ID ... or --file IDS")
        result = run_remove(wanted, index_dir, db=db, model=model, device=device)
    console.print(f"removed {result.removed} entries; generation {result.generation_id} holds {result.vectors_total} vectors "
                  f"({result.seconds:.1f} s)")
    if result.not_found:
        err.print(f"[yellow]{len(result.not_found)} ids not in the catalog (already removed?):[/] "
                  + ", ".join(result.not_found[:20]) + (" …" if len(result.not_found) > 20 else ""), highlight=False)


@app.command()
def gc(
    index_dir: IndexDir = Path("mgeo-index"),
    keep: Annotated[int, typer.Option("--keep", min=1, help="Generations to keep, the current one included.")] = 2,
    db: Db = None,
) -> None:
    """Delete old index generations (files and rows), files of interrupted writes and retired entries no kept generation returns.

    Example: mgeo-index gc --index-dir idx --keep 3
    """
    from mgeo_index.update import gc as run_gc

    with friendly_errors():
        result = run_gc(index_dir, db=db, keep=keep)
    console.print(f"kept generations {result.generations_kept}; removed generations {result.generations_removed}, "
                  f"{len(result.files_removed)} files, {result.entries_purged} retired entries", highlight=False)


@app.command()
def check(
    index_dir: IndexDir = Path("mgeo-index"),
    repair: Annotated[bool, typer.Option("--repair", help="Rebuild what is wrong from the store, as a new generation.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    db: Db = None,
    model: Model = None,
    device: Device = None,
) -> None:
    """Verify that store and index agree: counts, ids, model fingerprint, file checksums. Exit code 1 when not.

    Example: mgeo-index check --index-dir idx --repair
    """
    from mgeo_index import update

    with friendly_errors():
        before = update.check(index_dir, db=db)
        after = update.repair(index_dir, db=db, model=model, device=device) if repair and not before.clean else None
    for report, title in ((before, "check"), (after, "after repair")):
        if report is None:
            continue
        if as_json:
            print(json.dumps({"stage": title, "clean": report.clean, "catalog": report.catalog, "generation": report.generation_id,
                              "facts": report.facts, "problems": report.problems, "notes": report.notes}, ensure_ascii=False))
            continue
        table = Table(title=f"{title}: catalog '{report.catalog}', generation {report.generation_id}", show_header=False)
        for name, value in report.facts.items():
            table.add_row(name, str(value))
        for problem in report.problems:
            table.add_row("[red]problem[/]", problem)
        for note in report.notes:
            table.add_row("[yellow]note[/]", note)
        table.add_row("verdict", "[green]clean[/]" if report.clean else "[red]inconsistent[/]")
        console.print(table)
    final = after or before
    if not final.clean:
        if not repair:
            err.print("run `mgeo-index check --repair` to rebuild what can be rebuilt from the store", highlight=False)
        raise typer.Exit(1)


def _read_queries(queries: list[str], file: Path | None) -> list[str]:
    items = list(queries)
    if file is not None:
        if not file.is_file():
            raise FileNotFoundError(f"--file {file} does not exist or is not a file")
        try:
            text = file.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            line = file.read_bytes()[: exc.start].count(b"\n") + 1
            raise ValueError(f"{file}: line {line} is not UTF-8 ({exc.reason}); re-save the file as UTF-8") from None
        items += [line.strip() for line in text.splitlines() if line.strip()]
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
    explain: Annotated[bool, typer.Option("--explain", help="Show which address elements agree or differ.")] = False,
    retrieval: Retrieval = "hybrid",
    admin_filter: AdminFilter = False,
    rerank_depth: RerankDepth = None,
    batch_size: Annotated[int, typer.Option(help="Queries per batch.")] = 256,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
) -> None:
    """Find the catalog entries a messy address refers to, reranked and labeled.

    Example: mgeo-index resolve "北京朝阳建国路88号" --index-dir idx --json
    """
    from mgeo_index.resolver import open_resolver
    from mgeo_index.text import printable

    with friendly_errors():
        items = _read_queries(queries or [], file)
        resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device, rerank=not no_rerank,
                                 backend=backend)
        for start in range(0, len(items), batch_size):
            batch = items[start : start + batch_size]
            for query, matches in zip(batch, resolver.resolve(batch, top_k=top_k, rerank=not no_rerank, explain=explain, retrieval=retrieval,
                                                                     admin_filter=admin_filter, rerank_depth=rerank_depth)):
                query = printable(query)  # undecodable command-line bytes arrive as lone surrogates
                if as_json:
                    print(json.dumps({"query": query, "matches": matches}, ensure_ascii=False), flush=False)
                else:
                    console.print(_matches_table(query, matches))
        sys.stdout.flush()


@app.command()
def parse(
    texts: Annotated[list[str] | None, typer.Argument(help="Addresses to parse.")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="File with one address per line.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per address per line.")] = False,
    batch_size: Annotated[int, typer.Option(help="Addresses per batch.", min=1)] = 4096,
) -> None:
    """Split addresses into elements (province … room) and standardize province / city / district / town with official codes.

    The text is normalized first (full-width, traditional characters, numerals, phone numbers, notes);
    element spans index into that normalized text. Needs no index.

    Example: mgeo-index parse "北京朝阳建国路八十八号三单元" --json
    """
    from mgeo_index.text.parser import parse as parse_addresses

    with friendly_errors():
        items = _read_queries(texts or [], file)
        for start in range(0, len(items), batch_size):
            for result in parse_addresses(items[start : start + batch_size]):
                if as_json:
                    print(json.dumps(result, ensure_ascii=False), flush=False)
                else:
                    console.print(_parse_table(result))
        sys.stdout.flush()


_ADMIN_OF_LABEL = {"prov": "province", "city": "city", "district": "district", "town": "town"}


def _parse_table(result: dict) -> Table:
    """One row per element; admin elements show the standard name and code, inferred levels first."""
    admin = result["admin"]
    table = Table(title=result["text"], title_justify="left")
    for column in ("element", "text", "standard", "code"):
        table.add_column(column)
    written = {_ADMIN_OF_LABEL[e["label"]] for e in result["elements"] if e["label"] in _ADMIN_OF_LABEL}
    for key in ("province", "city", "district", "town"):
        if admin[key] and key not in written:
            table.add_row(key, "", f"{admin[key]} (inferred)", admin[f"{key}_code"], style="dim")
    for e in result["elements"]:
        key = _ADMIN_OF_LABEL.get(e["label"])
        table.add_row(e["label"], e["text"], (admin[key] or "") if key else "", (admin[f"{key}_code"] or "") if key else "")
    if admin["ambiguous"]:
        table.add_row("ambiguous", "", " / ".join(admin["ambiguous"]), "", style="yellow")
    return table


_STATE_MARK = {"agree": "[green]✓[/]", "differ": "[red]✗[/]", "only_a": "[dim]−[/]", "only_b": "[dim]+[/]"}


def _explain_cell(explain: dict) -> str:
    """Compact element comparison: ✓ agree, ✗ differ, − only in the query, + only in the candidate."""
    return " ".join(f"{_STATE_MARK[e['state']]}{name}" for name, e in explain.items())


def _matches_table(query: str, matches: list[dict]) -> Table:
    table = Table(title=Text(query), title_justify="left")  # Text: brackets in an address are not markup
    columns = [("rank", "right"), ("id", "right"), ("address", "left"), ("score", "right"), ("label", "left"), ("probability", "right")]
    if matches and "explain" in matches[0]:
        columns.append(("elements: ✓ agree ✗ differ − query only + candidate only", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")  # addresses are shown whole
    colors = {"exact_match": "green", "partial_match": "yellow", "not_match": "red"}
    for rank, m in enumerate(matches, 1):
        label = m.get("label", "")
        cells = [
            str(rank),
            Text(str(m["id"]) + (f" ({m['source_id']})" if m.get("source_id") else "")),
            Text(m["address"]),
            f"{m['score']:.3f}" if m['score'] is not None else "–",
            Text(label, style=colors.get(label, "")),
            f"{m['probability']:.3f}" if "probability" in m else "",
        ]
        if "explain" in m:
            cells.append(_explain_cell(m["explain"]))
        table.add_row(*cells)
    return table


@app.command()
def match(
    file: Annotated[Path, typer.Option("--file", "-f", help="TSV/CSV with header columns a and b.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output TSV: input columns + label + p_<label>.")],
    explain: Annotated[bool, typer.Option("--explain", help="Add a JSON column: which elements agree or differ.")] = False,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
) -> None:
    """Score address pairs: exact_match / partial_match / not_match with probabilities.

    Example: mgeo-index match --file pairs.tsv --out scored.tsv
    """
    from mgeo_index import backends
    from mgeo_index.match import match_file
    from mgeo_index.model.cross_encoder import load_cross_encoder

    with friendly_errors():
        if not file.is_file():
            raise FileNotFoundError(f"pairs file {file} does not exist")
        dev = settings.device(device)
        cross = backends.apply(load_cross_encoder(settings.cross_model_path(cross_model)).to(dev), backend, device=dev)
        with _progress() as bar:
            task = bar.add_task("Scoring pairs", total=None)
            result = match_file(file, out, cross, device=dev, explain=explain,
                                on_progress=lambda n: bar.update(task, advance=n))
    for problem in result.invalid[:20]:
        err.print(f"[yellow]skipped[/] {problem}", highlight=False)
    if len(result.invalid) > 20:
        err.print(f"[yellow]… and {len(result.invalid) - 20} more rows with an empty address[/]")
    counts = ", ".join(f"{k} {v}" for k, v in result.label_counts.items())
    err.print(f"{result.scored} of {result.rows} pairs scored → {out} ({counts})")


eval_app = typer.Typer(help="Measure match quality: pair classification and retrieval.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
Split = Annotated[str, typer.Option(help="Keep rows of this split of the shared data (dev, calib, train) or all.")]


def _report_table(title: str, report: dict) -> Table:
    table = Table(title=title)
    for name in ("label", "precision", "recall", "F1", "support"):
        table.add_column(name, justify="left" if name == "label" else "right")
    for label, r in report["per_class"].items():
        table.add_row(label, f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['f1']:.3f}", str(r["support"]))
    table.add_row("macro", "", "", f"{report['macro_f1']:.3f}", str(report["n"]), style="bold")
    table.caption = f"accuracy {report['accuracy']:.3f} · expected calibration error {report['ece']:.3f}"
    return table


def _confusion_table(report: dict) -> Table:
    table = Table(title="Confusion (rows: gold, columns: predicted)")
    table.add_column("gold \\ predicted")
    for label in report["labels"]:
        table.add_column(label, justify="right")
    for label, row in zip(report["labels"], report["confusion"]):
        table.add_row(label, *map(str, row))
    return table


@eval_app.command("pairs")
def eval_pairs(
    file: Annotated[Path, typer.Argument(help="Labeled pairs: query,candidate,label (CCKS) or addr1,addr2,label (0/1).")],
    split: Split = "all",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write a reliability diagram (PNG) here.")] = None,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
) -> None:
    """Macro-F1, per-class precision/recall/F1, accuracy, confusion matrix and calibration error.

    Example: mgeo-index eval pairs ../shared/data/pairs/ccks2021_train.tsv.gz --split dev --plot reliability.png
    """
    from mgeo_index import backends
    from mgeo_index.evaluate import evaluate_pairs, read_labeled_pairs, reliability_diagram
    from mgeo_index.model.cross_encoder import load_cross_encoder

    with friendly_errors():
        a, b, gold = read_labeled_pairs(file, split)
        dev = settings.device(device)
        cross = backends.apply(load_cross_encoder(settings.cross_model_path(cross_model)).to(dev), backend, device=dev)
        report = evaluate_pairs(cross, a, b, gold, device=dev)
        probs = report.pop("_probs")
        if plot is not None:
            reliability_diagram(probs, gold, plot)
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
        return
    console.print(_report_table(f"{file.name} ({split}, {len(gold)} pairs)", report))
    console.print(_confusion_table(report))
    if plot is not None:
        console.print(f"reliability diagram → {plot}")


@eval_app.command("retrieval")
def eval_retrieval(
    queries: Annotated[Path, typer.Argument(help="TSV with query and gold columns, or a CCKS pairs file (exact_match rows).")],
    index_dir: IndexDir = Path("mgeo-index"),
    split: Split = "all",
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=10, help="Candidates retrieved and reranked.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    retrieval: Retrieval = "hybrid",
    admin_filter: AdminFilter = False,
    rerank_depth: RerankDepth = None,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
) -> None:
    """Recall@1/5/10 and MRR@10 of retrieval alone and after reranking, against gold catalog addresses.

    Example: mgeo-index eval retrieval ../shared/data/pairs/ccks2021_train.tsv.gz --split dev --index-dir ccks-index
    """
    from mgeo_index.evaluate import evaluate_retrieval, read_gold_queries
    from mgeo_index.resolver import open_resolver

    with friendly_errors():
        texts, gold = read_gold_queries(queries, split)
        resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device, backend=backend)
        report = evaluate_retrieval(resolver, texts, gold, top_k=top_k, retrieval=retrieval, admin_filter=admin_filter,
                                    rerank_depth=rerank_depth)
    if as_json:
        print(json.dumps(report))
        return
    table = Table(title=f"Retrieval ({retrieval}): {report['gold_in_catalog']} of {report['queries']} queries have their gold entry in the catalog")
    table.add_column("stage")
    for name in ("recall@1", "recall@5", "recall@10", "mrr@10"):
        table.add_column(name, justify="right")
    for stage in ("retrieval", "reranked"):
        r = report[stage]
        table.add_row(stage, *(f"{r[k]:.3f}" for k in ("recall@1", "recall@5", "recall@10", "mrr@10")))
    console.print(table)


@app.command()
def bench(
    addresses: Annotated[Path, typer.Option(help="Catalog file whose addresses are encoded (default: the bundled sample).")] = settings.SAMPLE_CATALOG,
    limit: Annotated[int, typer.Option(help="Addresses (and pairs) to time through the engine.")] = 2000,
    naive: Annotated[int, typer.Option(help="Items timed through the naive per-item loop.")] = 200,
    index_dir: Annotated[Path | None, typer.Option("--index-dir", "-i", help="Also time single-query resolve on this index.")] = None,
    queries: Annotated[int, typer.Option(help="Single queries timed for resolve latency.")] = 200,
    backend_list: Annotated[str, typer.Option("--backends", help="Comma-separated backends to compare side by side ('' for none; add compile to include torch.compile, which compiles for minutes on a small CPU).")] = ",".join(b for b in BACKENDS if b != "compile"),
    pairs: Annotated[Path | None, typer.Option(help="Labeled pairs (e.g. ccks2021_train.tsv.gz): each backend's dev macro-F1.")] = None,
    split: Split = "dev",
    build_rows: Annotated[str, typer.Option(help="Comma-separated catalog sizes to build (e.g. 50000,200000): throughput and peak RSS.")] = "",
    data: Annotated[Path, typer.Option(help="The shared data folder the build catalogs are synthesized from.")] = Path("../shared/data"),
    work_dir: Annotated[Path, typer.Option(help="Where the synthesized catalogs and their indexes go.")] = Path("bench-work"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    model: Model = None,
    cross_model: CrossModel = None,
    backend: Backend = None,
) -> None:
    """Engine vs naive per-item encoding and pair scoring, backends side by side, resolve p50/p99, build RSS.

    Example: mgeo-index bench --addresses ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --index-dir ccks-index --pairs ../shared/data/pairs/ccks2021_train.tsv.gz --build-rows 50000,200000
    """
    import random

    from mgeo_index import backends, bench as bench_mod
    from mgeo_index.catalog import read_catalog
    from mgeo_index.evaluate import read_labeled_pairs
    from mgeo_index.model.bi_encoder import load_bi_encoder
    from mgeo_index.model.cross_encoder import load_cross_encoder

    names = [b.strip() for b in backend_list.split(",") if b.strip()]
    sizes = [int(n) for n in build_rows.replace("_", "").split(",") if n.strip()]
    with friendly_errors():
        for name in names + ([backend] if backend else []):
            backends.check(name)
        texts: list[str] = []
        for rows, _ in read_catalog(addresses, chunk_size=5000).chunks():
            texts += [r.address for r in rows]
            if len(texts) >= limit:
                break
        texts = texts[:limit]
        rng = random.Random(0)
        shuffled = rng.sample(texts, len(texts))
        chosen = settings.backend(backend)
        bi = backends.apply(load_bi_encoder(settings.bi_model_path(model)), chosen)
        cross = backends.apply(load_cross_encoder(settings.cross_model_path(cross_model)), chosen)
        report = {
            "torch_threads": __import__("torch").get_num_threads(),
            "backend": chosen,
            "encode": bench_mod.bench_encode(bi, texts, naive),
            "score_pairs": bench_mod.bench_score(cross, texts, shuffled, naive),
        }
        if names:
            labeled = read_labeled_pairs(pairs, split) if pairs is not None else None
            report["backends"] = bench_mod.bench_backends(names, texts, shuffled, model=model, cross_model=cross_model,
                                                          pairs=labeled)
        if index_dir is not None:
            from mgeo_index.resolver import open_resolver

            sample = [t[2:] for t in rng.sample(texts, min(queries, len(texts)))]
            report["resolve"] = {}
            for name in dict.fromkeys(["torch", chosen]):  # the plain reference, then the chosen backend
                resolver = open_resolver(index_dir, model=model, cross_model=cross_model, device="cpu", backend=name)
                report["resolve"][name] = bench_mod.bench_resolve(resolver, sample)
        if sizes:
            work_dir.mkdir(parents=True, exist_ok=True)
            report["build"] = []
            for n in sizes:
                catalog = bench_mod.synthesize_catalog(data, n, work_dir / f"catalog-{n}.tsv")
                report["build"].append(bench_mod.bench_build(catalog, work_dir / f"index-{n}", backend=chosen))
    if as_json:
        print(json.dumps(report))
        return
    _print_bench(report)


def _print_bench(report: dict) -> None:
    table = Table(title=f"mgeo-index bench ({report['torch_threads']} threads, backend {report['backend']}, same inputs, one run)")
    for name in ("what", "engine", "naive (1 item, pad 64, FP32 torch)", "ratio", "time in Linear GEMMs", "ceiling ratio"):
        table.add_column(name, justify="left" if name == "what" else "right")
    for what, r in (("encode addresses/s", report["encode"]), ("score pairs/s (network)", report["score_pairs"])):
        share, ceiling = r.get("linear_share"), r.get("ceiling_ratio")
        table.add_row(what, f"{r['engine_per_s']:,.0f}", f"{r['naive_per_s']:,.0f}", f"{r['ratio']:.1f}×",
                      f"{share:.0%}" if share else "–", f"{ceiling:.1f}×" if ceiling else "–")
    table.caption = "ceiling: the ratio if everything but the Linear layers' GEMMs took no time"
    console.print(table)
    if report.get("backends"):
        table = Table(title="CPU backends, same inputs, interleaved rounds (best of 3)")
        columns = ("backend", "addresses/s", "× torch", "pairs/s", "× torch", "min cosine vs torch", "dev macro-F1", "Δ F1", "setup s")
        for name in columns:
            table.add_column(name, justify="left" if name == "backend" else "right")
        for r in report["backends"]:
            table.add_row(
                r["backend"], f"{r['encode_per_s']:,.0f}", f"{r.get('encode_vs_torch', float('nan')):.2f}×",
                f"{r['pairs_per_s']:,.0f}", f"{r.get('pairs_vs_torch', float('nan')):.2f}×",
                f"{r['embedding_cosine_min']:.5f}" if "embedding_cosine_min" in r else "–",
                f"{r['macro_f1']:.4f}" if "macro_f1" in r else "–",
                f"{r['macro_f1_delta']:+.4f}" if "macro_f1_delta" in r else "–", f"{r['setup_s']:.1f}",
            )
        console.print(table)
    for name, r in report.get("resolve", {}).items():
        console.print(f"resolve ({name}), warm, one query per call, top-{r['top_k']} + rerank over {r['catalog_size']:,} "
                      f"entries: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms ({r['queries']} queries)")
    if report.get("build"):
        table = Table(title="mgeo-index build of synthesized catalogs (fresh index, child process)")
        for name in ("rows", "seconds", "rows/s", "peak RSS MiB"):
            table.add_column(name, justify="right")
        for r in report["build"]:
            table.add_row(f"{r['rows']:,}", f"{r['seconds']:.1f}", f"{r['rows_per_s']:,.0f}", f"{r['peak_rss_mib']:,.0f}")
        console.print(table)


@app.command()
def serve(
    index_dir: IndexDir = Path("mgeo-index"),
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback exposes the service.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    max_batch: Annotated[int, typer.Option(min=1, help="Most queries (or pairs) run together in one batch.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(min=0.0, help="Longest a request waits for others to share its batch.")] = 3.0,
    max_queue: Annotated[int, typer.Option(min=1, help="Queued items per lane (interactive, bulk) before 429.")] = 1024,
    timeout_ms: Annotated[float, typer.Option(min=1.0, help="Per-request deadline (504 after it); X-Timeout-Ms may shorten it.")] = 10000.0,
    max_items: Annotated[int, typer.Option(min=1, help="Most queries or pairs in one request (413 above).")] = 256,
    max_chars: Annotated[int, typer.Option(min=1, help="Longest address accepted (422 above).")] = 256,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body (413 above).")] = 1 << 20,
    max_top_k: Annotated[int, typer.Option(min=1, help="Largest top_k a request may ask for.")] = 100,
    cache_size: Annotated[int, typer.Option(min=0, help="In-process LRU entries (0: no cache).")] = 10000,
    cache: Annotated[str | None, typer.Option("--cache", help="Redis URL for a shared cache, e.g. redis://127.0.0.1:6379/0.")] = None,
    cache_ttl: Annotated[int, typer.Option("--cache-ttl", min=0, help="Seconds a Redis cache entry lives (0: until the index changes).")] = 0,
    api_key: Annotated[str | None, typer.Option(envvar="MGEO_INDEX_API_KEY", show_envvar=True,
                                                help="Require this key (X-API-Key or Authorization: Bearer) on all but /healthz and /readyz.")] = None,
    watch: Annotated[float, typer.Option(min=0.0, help="Check the index directory for a new build every N seconds (0: only on SIGHUP or POST /v1/admin/reload).")] = 0.0,
    log_level: Annotated[str, typer.Option(help="critical, error, warning, info or debug (debug logs request texts).")] = "info",
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
) -> None:
    """Serve resolve and match over HTTP: dynamic batching, cache, limits, Prometheus metrics.

    POST /v1/resolve, POST /v1/match, GET /healthz, /readyz, /metrics, OpenAPI docs at /docs.
    A new build of the index directory is swapped in on SIGHUP or POST /v1/admin/reload.

    Example: mgeo-index serve --index-dir idx --port 8000 --cache redis://127.0.0.1:6379/0
    """
    import logging

    try:
        import uvicorn

        from mgeo_index.service.app import ServeConfig, create_app
    except ImportError as exc:
        err.print(f"[bold red]Error:[/] {exc}; install the service with pip install 'mgeo-index[serve]'", highlight=False)
        raise typer.Exit(1) from None
    if log_level not in ("critical", "error", "warning", "info", "debug"):
        raise typer.BadParameter("--log-level must be critical, error, warning, info or debug")
    with friendly_errors():
        from mgeo_index.build import read_manifest

        read_manifest(index_dir)  # no index: say how to build one before starting anything
        _check_port_free(host, port)
        config = ServeConfig(
            index_dir=index_dir, db=db, model=model, cross_model=cross_model, device=device, max_batch=max_batch,
            max_wait_ms=max_wait_ms, max_queue=max_queue, timeout_ms=timeout_ms, max_items=max_items,
            max_chars=max_chars, max_body_bytes=max_body_bytes, max_top_k=max_top_k, cache_size=cache_size,
            cache_url=cache, cache_ttl_s=cache_ttl, api_key=api_key or None, watch_s=watch, reload_signal=True,
        )
        application = create_app(config)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        err.print(f"[yellow]Warning:[/] serving on {host} without --api-key: anyone who can reach it can use it.")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(application, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30)


def _check_port_free(host: str, port: int) -> None:
    """Say so before loading anything when the port is taken (uvicorn would fail after the models load)."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is in use by another program; choose another with --port") from None
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


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

    with friendly_errors():
        if index_dir is not None and not (db or settings.env("DB")):
            index_dir.mkdir(parents=True, exist_ok=True)  # its SQLite store is created here
        url = _db_url(index_dir, db)
        if url.startswith("sqlite:///"):  # a SQLite file named by --db: its folder may be new too
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        store.upgrade(url, revision)
        console.print(f"database at revision {store.current_revision(url) or 'base (no migrations applied)'}")


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

    with friendly_errors():
        url = _db_url(index_dir, db)
        store.downgrade(url, revision)
        console.print(f"database at revision {store.current_revision(url) or 'base (no migrations applied)'}")


@db_app.command("current")
def db_current(
    index_dir: Annotated[Path | None, typer.Option("--index-dir", "-i")] = None,
    db: Db = None,
) -> None:
    """Print the database's migration revision.

    Example: mgeo-index db current --index-dir idx
    """
    from mgeo_index import store

    with friendly_errors():
        console.print(store.current_revision(_db_url(index_dir, db)) or "empty (no migrations applied)")


@app.command()
def train(
    data: Annotated[Path, typer.Option(help="The shared data folder (pairs/, catalog/, admin/).")] = Path("../shared/data"),
    out: Annotated[Path, typer.Option(help="Output folder: bi/, cross/, metrics.json, work/ (stage checkpoints).")] = Path("runs/train"),
    mlm_minutes: Annotated[float, typer.Option(help="Masked-LM pretraining budget.")] = 12.0,
    bi_minutes: Annotated[float, typer.Option(help="Bi-encoder contrastive training budget.")] = 10.0,
    cross_minutes: Annotated[float, typer.Option(help="Cross-encoder training budget.")] = 18.0,
    precision: Annotated[str, typer.Option(help="auto (bf16 on CUDA or AVX512-BF16/AMX CPUs, else fp32), fp32 or bf16.")] = "auto",
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
                    cross_minutes=cross_minutes, precision=precision, seed=seed, log=err.print)
    )
    console.print_json(data={k: metrics[k] for k in ("ccks_dev", "shenzhen_dev", "ccks_dev_retrieval", "minutes")})


@app.command()
def normalize(
    input: Annotated[Path, typer.Argument(help="CSV/TSV (UTF-8, UTF-8 with BOM or GB18030) or Parquet file of addresses.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file: input columns + status, match_id, match_address, label, probability, alternatives, reason.")],
    index_dir: IndexDir = Path("mgeo-index"),
    address_column: Annotated[str | None, typer.Option(help="Column holding the address [default: detected].")] = None,
    id_column: Annotated[str | None, typer.Option(help="Column holding the row's own id (must not be empty).")] = None,
    min_probability: Annotated[float, typer.Option(min=0.0, max=1.0, help="Least probability of the best candidate's label to call it matched.")] = 0.5,
    ambiguous_margin: Annotated[float, typer.Option(min=0.0, max=1.0, help="Ambiguous when the runner-up's P(exact)+½P(partial) is within this of the best's.")] = 0.1,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=1000, help="Candidates retrieved and reranked per row.")] = 10,
    output_format: Annotated[str | None, typer.Option("--format", help="csv or parquet [default: from the --out suffix].")] = None,
    chunk_size: Annotated[int, typer.Option(min=1, help="Rows per checkpoint (and per part file).")] = 8192,
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per resolver call.")] = 1024,
    engine: Annotated[str, typer.Option(help="local, or ray (Ray Data actor pool).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster address, e.g. ray://head:10001 [default: a local Ray].")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Ray actors (one model + index replica each) [default: CPU count locally].")] = None,
    gpus_per_worker: Annotated[float, typer.Option(min=0.0, help="GPUs per Ray actor (0: CPU actors).")] = 0.0,
    restart: Annotated[bool, typer.Option("--restart", help="Discard an unfinished job for this output and start over.")] = False,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
) -> None:
    """Tie every row of a file to the catalog: matched / ambiguous / unmatched / rejected.

    Runs as a job recorded in the store; if it is interrupted (Ctrl-C, kill -9), the same command resumes
    from the last checkpoint, and the output holds every input row exactly once, in input order.

    Example: mgeo-index normalize stores.csv --index-dir idx --out stores.matched.csv
    """
    from rich.progress import TimeRemainingColumn

    from mgeo_index.jobs import JobError, normalize_file

    if engine not in ("local", "ray"):
        raise typer.BadParameter("--engine must be local or ray")
    try:
        with friendly_errors(), _progress() as bar:
            bar.columns = (*bar.columns, TimeRemainingColumn())
            task = bar.add_task("Resolving rows", total=None)

            def on_job(job: dict) -> None:
                bar.update(task, description=f"Job {job['id']}")
                if job["rows_done"]:
                    err.print(f"Resuming job {job['id']} at row {job['rows_done']:,}", highlight=False)
                    bar.reset(task, completed=job["rows_done"], total=job["rows_total"])  # rate counts this run only

            result = normalize_file(
                input, out, index_dir, db=db, model=model, cross_model=cross_model, device=device, backend=backend,
                address_column=address_column, id_column=id_column, min_probability=min_probability,
                margin=ambiguous_margin, top_k=top_k, output_format=output_format, chunk_size=chunk_size,
                batch_size=batch_size, engine=engine, ray_address=ray_address, workers=workers,
                gpus_per_worker=gpus_per_worker, restart=restart, on_job=on_job,
                on_progress=lambda n, total: bar.update(task, advance=n, total=total),
            )
    except JobError as exc:
        err.print(f"[bold red]Error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    except ImportError as exc:
        err.print(f"[bold red]Error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err.print("[yellow]Interrupted.[/] Run the same command again to resume from the last checkpoint.")
        raise typer.Exit(130) from None
    table = Table(title=f"Job {result.job_id} → {result.output}", show_header=False)
    rows = [("rows", f"{result.rows:,}")]
    if result.resumed_from:
        rows.append(("resumed at row", f"{result.resumed_from:,}"))
    rows += [(status, f"{n:,}") for status, n in result.counts.items()]
    rows += [("engine", result.engine), ("format", result.output_format),
             ("seconds", f"{result.seconds:.1f}"), ("rows/s", f"{result.rows_per_second:,.0f}")]
    for name, value in rows:
        table.add_row(name, value, style="yellow" if name == "rejected" and result.counts["rejected"] else None)
    console.print(table)
    if result.already_complete:
        err.print(f"Job {result.job_id} had already finished; nothing was recomputed.")


@app.command()
def jobs(
    index_dir: IndexDir = Path("mgeo-index"),
    db: Db = None,
    limit: Annotated[int, typer.Option(min=1, help="Most recent jobs to show.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per job per line.")] = False,
) -> None:
    """List normalize jobs with their state, progress and counts (newest first).

    A job shown as 'stale' was killed while running: the same normalize command resumes it.

    Example: mgeo-index jobs --index-dir idx
    """
    from mgeo_index.jobs import STATUSES, list_jobs

    with friendly_errors():
        found = list_jobs(index_dir, db=db, limit=limit)
    if as_json:
        for job in found:
            print(json.dumps(job, ensure_ascii=False, default=str))
        return
    where = "MGEO_INDEX_DB" if not db and settings.env("DB") else ("--db" if db else str(index_dir))
    if not found:
        console.print(f"no jobs in the store of {where}")
        return
    table = Table(title=f"Jobs in the store of {where}", title_justify="left")
    table.add_column("id", justify="right")
    table.add_column("state", no_wrap=True)
    table.add_column("rows", justify="right", no_wrap=True)
    for name in STATUSES:
        table.add_column(name, justify="right")
    table.add_column("input → output", overflow="fold")
    table.add_column("updated (UTC)", no_wrap=True)
    colors = {"complete": "green", "running": "cyan", "stale": "yellow", "interrupted": "yellow", "failed": "red"}
    for job in found:
        total = job["rows_total"]
        done = f"{job['rows_done']:,}" + (f"/~{total:,}" if total and job["state"] != "complete" else "")
        table.add_row(
            str(job["id"]), Text(job["state"], style=colors.get(job["state"], "")), done,
            *(f"{job[s]:,}" for s in STATUSES), f"{Path(job['input_path']).name} → {job['output_path']}",
            f"{job['updated_at']:%m-%d %H:%M}",
        )
    console.print(table)


if __name__ == "__main__":
    app()
