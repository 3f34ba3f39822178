"""Asking the models: resolve (against an index), parse (no index), match (address pairs)."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from mgeo_index import settings
from mgeo_index.cli.errors import friendly_errors
from mgeo_index.cli.options import (
    DEFAULT_INDEX_DIR, AdminFilter, Backend, CrossModel, Db, Device, IndexDir, Model, Numbers, Pairwise, Profile,
    QueriesFile, RawValues, RerankDepth, Retrieval,
)
from mgeo_index.cli.render import console, err, escape, matches_table, parse_table, progress


def read_queries(queries: list[str], file: Path | None) -> list[str]:
    """The command line's texts, then the file's lines, or else stdin's lines (blank lines skipped)."""
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


def resolve(
    queries: Annotated[list[str] | None, typer.Argument(help="Addresses to resolve.")] = None,
    file: QueriesFile = None,
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=1000, help="Candidates to retrieve and rerank.")] = settings.DEFAULT_TOP_K,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per query per line.")] = False,
    no_rerank: Annotated[bool, typer.Option("--no-rerank", help="Retrieval only (no cross-encoder).")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show which address elements agree or differ.")] = False,
    retrieval: Retrieval = "hybrid",
    admin_filter: AdminFilter = False,
    rerank_depth: RerankDepth = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Queries per batch.")] = 256,
    db: Db = None,
    model: Model = None,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
    numbers: Numbers = None,
    profile: Profile = None,
    names: Annotated[list[str] | None, typer.Option("--name", help="The place's name, for a query kept as name + address: matched with the address and compared with each entry's name (a shop at the same door under another name is not exact_match). Once per query, in order; for a file, normalize --name-column.")] = None,
) -> None:
    """Find the catalog entries a messy address refers to, reranked and labeled.

    Example: mgeo-index resolve "北京朝阳建国路88号" --index-dir idx --json

    A shop by name and address: mgeo-index resolve "民和路与飞虹路交叉口西100米" --name 名仕之家 --index-dir idx
    """
    from mgeo_index.api import AddressIndex
    from mgeo_index.runtime.plan import plan
    from mgeo_index.text import printable

    with friendly_errors():
        items = read_queries(queries or [], file)
        if names and (file is not None or len(names) != len(items)):
            raise typer.BadParameter(f"give --name once per query on the command line ({len(items)} queries, "
                                     f"{len(names)} names); for a file of names and addresses, use normalize "
                                     "--name-column", param_hint="--name")
        backend = plan(backend, device, queries=len(items)).backend  # a few: without torch where answers agree
        with AddressIndex.open(index_dir, db=db, model=model, cross_model=cross_model, device=device,
                               rerank=not no_rerank, backend=backend, numbers=numbers, profile=profile) as idx:
            if idx.resolver.profile_note:
                err.print(idx.resolver.profile_note, highlight=False)
            # what the answers are made with: the footer of each table, keys of each JSON line
            made_with = idx.resolver.made_with(not no_rerank)
            footer = " · ".join(f"{key} {value}" for key, value in made_with.items())
            # a bar for inputs longer than one batch (on stderr, above which the answers print; none off a terminal)
            with progress() if len(items) > batch_size else contextlib.nullcontext() as bar:
                task = bar.add_task("Resolving", total=len(items)) if bar is not None else None
                for start in range(0, len(items), batch_size):
                    batch = items[start : start + batch_size]
                    batch_names = names[start : start + batch_size] if names else [None] * len(batch)
                    answers = idx.resolve(batch, top_k=top_k, rerank=not no_rerank, explain=explain,
                                          retrieval=retrieval, admin_filter=admin_filter, rerank_depth=rerank_depth,
                                          batch_size=batch_size, names=batch_names if names else None)
                    for query, name, matches in zip(batch, batch_names, answers):
                        query = printable(query)  # undecodable command-line bytes arrive as lone surrogates
                        named = {"name": printable(name)} if name else {}
                        matches = [m.to_dict() for m in matches]
                        if as_json:
                            print(json.dumps({"query": query} | named | {"matches": matches} | made_with,
                                             ensure_ascii=False), flush=False)
                        else:
                            console.print(matches_table(f"{query} · {named['name']}" if named else query, matches,
                                                        footer))
                    if bar is not None:
                        bar.update(task, advance=len(batch))
        sys.stdout.flush()


def parse(
    texts: Annotated[list[str] | None, typer.Argument(help="Addresses to parse.")] = None,
    file: QueriesFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per address per line.")] = False,
    batch_size: Annotated[int, typer.Option(help="Addresses per batch.", min=1)] = 4096,
) -> None:
    """Split addresses into elements (province … room) and standardize province / city / district / town with official codes.

    The text is normalized first (full-width, traditional characters, numerals, phone numbers, notes);
    element spans index into that normalized text. Needs no index.

    Example: mgeo-index parse "北京朝阳建国路八十八号三单元" --json
    """
    from mgeo_index.api import parse as parse_addresses

    with friendly_errors():
        items = read_queries(texts or [], file)
        for start in range(0, len(items), batch_size):
            for result in (p.to_dict() for p in parse_addresses(items[start : start + batch_size])):
                if as_json:
                    print(json.dumps(result, ensure_ascii=False), flush=False)
                else:
                    console.print(parse_table(result))
        sys.stdout.flush()


def match(
    file: Annotated[Path, typer.Option("--file", "-f", help="TSV/CSV with header columns a and b.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output TSV: input columns + label + p_<label>.")],
    explain: Annotated[bool, typer.Option("--explain", help="Add a JSON column: per element, whether it agrees or "
                                          "differs, with both values (room differs: 1201室 vs 01).")] = False,
    pairwise: Pairwise = False,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
    numbers: Numbers = None,
    raw_values: RawValues = False,
    profile: Profile = None,
) -> None:
    """Score address pairs: exact_match / partial_match / not_match with probabilities.

    Consecutive rows with the same address in column a are one query's candidates and are labelled
    together (the best of the lot is clearer than each alone); --pairwise labels every row alone.

    Example: mgeo-index match --file pairs.tsv --out scored.tsv
    """
    from mgeo_index.query.match import match_file
    from mgeo_index.model.loading import load_cross

    with friendly_errors():
        if not file.is_file():
            raise FileNotFoundError(f"pairs file {file} does not exist")
        dev = settings.device(device)
        chosen, note = settings.profile(profile)
        if note:
            err.print(note, highlight=False)
        cross = load_cross(cross_model, device=dev, backend=backend, profile=chosen)
        with progress() as bar:
            task = bar.add_task("Scoring pairs", total=None)
            result = match_file(file, out, cross, device=dev, explain=explain, grouped=not pairwise,
                                numbers=settings.numbers(numbers), raw=raw_values,
                                on_progress=lambda n: bar.update(task, advance=n))
    for problem in result.invalid[:20]:
        err.print(f"[yellow]skipped[/] {escape(str(problem))}", highlight=False)
    if len(result.invalid) > 20:
        err.print(f"[yellow]… and {len(result.invalid) - 20} more rows with an empty address[/]")
    counts = ", ".join(f"{k} {v}" for k, v in result.label_counts.items())
    err.print(escape(f"{result.scored} of {result.rows} pairs scored → {out} ({counts})"))
