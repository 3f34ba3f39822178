"""Measurements: eval pairs, eval retrieval, bench."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mgeo_index import settings
from mgeo_index.cli.errors import friendly_errors
from mgeo_index.cli.options import (
    DEFAULT_INDEX_DIR, SHARED_DATA, AdminFilter, Backend, CrossModel, Db, Device, IndexDir, Model, Numbers, Pairwise, Profile,
    RerankDepth, Retrieval, Split,
)
from mgeo_index.cli.render import (
    confusion_table, console, escape, figures_table, print_bench, report_table, retrieval_table, variants_table,
)


def eval_pairs(
    file: Annotated[Path, typer.Argument(help="Labeled pairs: query,candidate,label (CCKS) or addr1,addr2,label (0/1).")],
    split: Split = "all",
    source: Annotated[str | None, typer.Option(help="Keep rows whose split_source column is this (CCKS: round2_train, round1_train_fold0, round1_train_tail).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write a reliability diagram (PNG) here.")] = None,
    pairwise: Pairwise = False,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
    numbers: Numbers = None,
    profile: Profile = None,
    both: Annotated[bool, typer.Option("--both-profiles", help="Measure the default and the accurate profile side by side (one table of their figures; --json: one report per profile).")] = False,
) -> None:
    """Macro-F1, per-class precision/recall/F1, accuracy, confusion matrix and calibration error.

    Example: mgeo-index eval pairs ../shared/data/pairs/ccks2021_train.tsv.gz --split dev --plot reliability.png

    Both profiles: mgeo-index eval pairs ../shared/data/pairs/shenzhen_val.tsv.gz --split dev --both-profiles

    Beside the holdout: mgeo-index eval pairs ../shared/data/pairs/ccks2021_train.tsv.gz --split dev,holdout --source round2_train
    """
    from mgeo_index.measure.evaluate import evaluate_pairs, read_labeled_pairs, reliability_diagram, split_names
    from mgeo_index.model.loading import load_cross

    with friendly_errors():
        splits = split_names(split)
        read = {name: read_labeled_pairs(file, name, source) for name in splits}
        for name, (_, _, gold) in read.items():
            if not gold:
                raise ValueError(f"{file}: no pairs in split {name!r}" + (f" with split_source {source!r}" if source else ""))
        dev = settings.device(device)
        if both and (cross_model is not None or profile is not None):
            raise ValueError("--both-profiles measures the two bundled profiles: leave out --profile and --cross-model")
        if plot is not None and (both or len(splits) > 1):
            raise ValueError("--plot draws one profile on one split: leave out --both-profiles or give one --split")
        chosen = settings.PROFILES if both else (settings.profile(profile)[0],)
        reports: dict[str, dict[str, dict]] = {}
        for name in chosen:
            cross = load_cross(cross_model, device=dev, backend=backend, profile=name)
            reports[name] = {part: evaluate_pairs(cross, a, b, gold, device=dev, grouped=not pairwise,
                                                  numbers=settings.numbers(numbers))
                             for part, (a, b, gold) in read.items()}
        probs = [r.pop("_probs") for by_split in reports.values() for r in by_split.values()]
        if plot is not None:
            reliability_diagram(probs[0], read[splits[0]][2], plot)
    def title(part: str) -> str:
        return f"{file.name} ({part}{', ' + source if source else ''}, {len(read[part][2])} pairs)"

    if len(chosen) == 1 and len(splits) == 1:
        report = reports[chosen[0]][splits[0]]
        if as_json:
            print(json.dumps(report, ensure_ascii=False))
            return
        console.print(report_table(title(splits[0]), report))
        console.print(confusion_table(report))
        if plot is not None:
            console.print(f"reliability diagram → {escape(str(plot))}")
        return
    if as_json:  # {profile: report} for one split, {split: report} for one profile, else {profile: {split: report}}
        out = ({p: r[splits[0]] for p, r in reports.items()} if len(splits) == 1
               else reports[chosen[0]] if len(chosen) == 1 else reports)
        print(json.dumps(out, ensure_ascii=False))
        return
    columns = {(f"{p} · " if len(chosen) > 1 else "") + (f"{s} ({len(read[s][2])} pairs)" if len(splits) > 1 else p): r
               for p, by_split in reports.items() for s, r in by_split.items()}
    console.print(figures_table(title(splits[0]) if len(splits) == 1 else f"{file.name}{' (' + source + ')' if source else ''}",
                                columns))


def eval_numbers(
    data: Annotated[Path, typer.Option("--data", help="The shared data folder (its tagged address files).")] = SHARED_DATA,
    split: Annotated[str, typer.Option(help="Tagged addresses of this split (test: never used for a choice; dev).")] = "test",
    numbers: Numbers = None,
    profile: Profile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
) -> None:
    """The number test set: tagged addresses paired with themselves with one number changed or written as another
    number (another place: a building letter, a range against its merged digits, a basement, a room against
    another floor, 甲 / 乙, a group or lane in Chinese numerals), with the same place written otherwise (without
    province and city, in Chinese or full-width numerals, a room as floor + room, a basement or range written
    another way), and a range against one of its numbers.

    Example: mgeo-index eval numbers --data ../shared/data --numbers strict
    """
    from mgeo_index.measure.number_set import NUMBER_TEST_FILES, number_pairs
    from mgeo_index.training.tagger import load_examples

    def pairs():
        if split not in ("dev", "test"):
            raise ValueError(f"--split must be dev or test, not {split!r}")
        return number_pairs(load_examples(data, NUMBER_TEST_FILES)[split])

    _variants(f"number test set ({split}, ", pairs, numbers, profile, as_json, cross_model, device, backend)


def eval_names(
    data: Annotated[Path, typer.Option("--data", help="The shared data folder (its CCKS2021 catalog).")] = SHARED_DATA,
    numbers: Numbers = None,
    profile: Profile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    cross_model: CrossModel = None,
    device: Device = None,
    backend: Backend = None,
) -> None:
    """The name test set: pairs of catalog entries at one door whose names differ (another place: names that share
    nothing, names that share a brand), and entries with their name written otherwise (the same place: a branch in
    parentheses dropped or unbracketed, full-width letters, a middle dot dropped).

    Example: mgeo-index eval names --data ../shared/data --numbers strict
    """
    from mgeo_index.measure.name_set import name_pairs
    from mgeo_index.compare.features import parse_distinct
    from mgeo_index.training.data import ccks_catalog

    def pairs():
        entries = list(dict.fromkeys(ccks_catalog(data)))
        return name_pairs(entries, parse_distinct(entries))

    _variants("name test set (", pairs, numbers, profile, as_json, cross_model, device, backend)


def _variants(title: str, make_pairs, numbers, profile, as_json: bool, cross_model, device, backend) -> None:
    """A test set of addresses and their variants (``make_pairs()``), scored and reported as a table (titled
    ``title`` + the number policy) or JSON."""
    from mgeo_index.measure.evaluate import evaluate_variants
    from mgeo_index.model.loading import load_cross

    with friendly_errors():
        pairs = make_pairs()
        dev = settings.device(device)
        cross = load_cross(cross_model, device=dev, backend=backend, profile=settings.profile(profile)[0])
        report = evaluate_variants(cross, pairs, device=dev, numbers=settings.numbers(numbers))
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
        return
    console.print(variants_table(f"{title}numbers {settings.numbers(numbers)})", report))


def eval_retrieval(
    queries: Annotated[Path, typer.Argument(help="TSV with query and gold columns, or a CCKS pairs file (exact_match rows).")],
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
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
    numbers: Numbers = None,
    profile: Profile = None,
) -> None:
    """Recall@1/5/10 and MRR@10 of retrieval alone and after reranking, against gold catalog addresses.

    Example: mgeo-index eval retrieval ../shared/data/pairs/ccks2021_train.tsv.gz --split dev --index-dir ccks-index

    Beside the holdout: mgeo-index eval retrieval ../shared/data/pairs/ccks2021_train.tsv.gz --split dev,holdout --index-dir ccks-index
    """
    from mgeo_index.measure.evaluate import evaluate_retrieval, read_gold_queries, split_names
    from mgeo_index.query.resolver import open_resolver

    with friendly_errors():
        read = {name: read_gold_queries(queries, name) for name in split_names(split)}
        resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device, backend=backend,
                                 numbers=numbers, profile=profile)
        reports = {name: evaluate_retrieval(resolver, texts, gold, top_k=top_k, retrieval=retrieval,
                                            admin_filter=admin_filter, rerank_depth=rerank_depth)
                   for name, (texts, gold) in read.items()}
    if as_json:  # one split: its report; several: {split: report}
        print(json.dumps(next(iter(reports.values())) if len(reports) == 1 else reports))
        return
    console.print(retrieval_table(reports, retrieval))


def bench(
    addresses: Annotated[Path, typer.Option(help="Catalog file whose addresses are encoded \\[default: the bundled sample].", show_default=False)] = settings.SAMPLE_CATALOG,
    limit: Annotated[int, typer.Option(help="Addresses (and pairs) to time through the batcher.")] = 2000,
    naive: Annotated[int, typer.Option(help="Items timed through the naive per-item loop.")] = 200,
    index_dir: Annotated[Path | None, typer.Option("--index-dir", "-i", help="Also time single-query resolve on this index.")] = None,
    queries: Annotated[int, typer.Option(help="Single queries timed for resolve latency.")] = 200,
    backend_list: Annotated[str, typer.Option("--backends", help="Comma-separated backends to compare side by side ('' for none; add compile to include torch.compile, which compiles for minutes on a small CPU; numpy is for one-shot commands and is not timed here).")] = ",".join(b for b in settings.BACKENDS if b not in ("compile", "numpy")),
    pairs: Annotated[Path | None, typer.Option(help="Labeled pairs (e.g. ccks2021_train.tsv.gz): each backend's dev macro-F1.")] = None,
    split: Split = "dev",
    build_rows: Annotated[str, typer.Option(help="Comma-separated catalog sizes to build (e.g. 50000,200000): throughput and peak RSS.")] = "",
    data: Annotated[Path, typer.Option(help="The shared data folder the build catalogs are synthesized from.")] = SHARED_DATA,
    work_dir: Annotated[Path, typer.Option(help="Where the synthesized catalogs and their indexes go.")] = Path("bench-work"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    model: Model = None,
    cross_model: CrossModel = None,
    backend: Backend = None,
) -> None:
    """Batched vs naive per-item encoding and pair scoring, backends side by side, resolve p50/p99, build RSS.

    Backends whose optional extra is not installed (onnx without ONNX Runtime) are skipped, with a note, and so is numpy
    (it computes the models of one-shot commands).

    Example: mgeo-index bench --addresses ../shared/data/catalog/ccks2021_poi_candidates.tsv.gz --index-dir ccks-index --pairs ../shared/data/pairs/ccks2021_train.tsv.gz --build-rows 50000,200000
    """
    from mgeo_index.measure import bench as bench_mod
    from mgeo_index.runtime import backends
    from mgeo_index.runtime.plan import plan

    names = [b.strip() for b in backend_list.split(",") if b.strip()]
    sizes = [int(n) for n in build_rows.replace("_", "").split(",") if n.strip()]
    with friendly_errors():
        for name in names:
            backends.check(name)
        chosen = backends.require(plan(backend).backend)  # the backend asked for must be there; others are skipped
        report = bench_mod.run_bench(
            addresses, limit=limit, naive=naive, backend=chosen, model=model, cross_model=cross_model, names=names,
            pairs=pairs, split=split, index_dir=index_dir, queries=queries, build_sizes=sizes, data=data, work_dir=work_dir,
        )
    if as_json:
        print(json.dumps(report))
        return
    print_bench(report)
