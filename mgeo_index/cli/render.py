"""What the commands print: rich tables of results and reports, progress bars.

Text that comes from the user or the library (addresses, paths, column and catalog names, problems) is
escaped or wrapped in :class:`~rich.text.Text`, so brackets in it are printed, not read as markup, and its control
characters shown as escapes (:func:`escape`).
"""
from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.measure import Measurement
from rich.markup import escape as escape_markup
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mgeo_index.text import visible

console = Console()
err = Console(stderr=True)


def escape(text: str) -> str:
    """User or library text for rich markup: its brackets escaped (not markup) and its control characters shown as
    escapes (:func:`~mgeo_index.text.visible`: an escape sequence in an address must not drive the terminal)."""
    return escape_markup(visible(text))


def log(line: str) -> None:
    """A progress line of a long run (training), on stderr, printed as written."""
    err.print(line, markup=False)


# --- progress bars -------------------------------------------------------------------------------


class RateColumn(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} {self.unit}/s" if speed else f"– {self.unit}/s", style="progress.data.speed")


def progress() -> Progress:
    """A progress bar on stderr; off when stderr is not a terminal (a log file gets no bar)."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn("rows"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal,
    )


def stage_progress(bar: Progress, labels: dict[str, str] | None = None, other: str = "Encoding entries"):
    """An ``on_progress(stage, advance, total)`` callback: one bar per stage, labeled from ``labels`` (else ``other``)."""
    labels = {"read": "Reading rows", **(labels or {})}
    tasks: dict[str, int] = {}

    def on_progress(stage: str, advance: int, total: int | None) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(labels.get(stage, other), total=total)
        bar.update(tasks[stage], advance=advance, total=total)

    return on_progress


# --- catalog lifecycle ---------------------------------------------------------------------------


def _facts(title: str, rows, rejects_path: str | None = None) -> Table:
    table = Table(title=escape(title), show_header=False)
    for name, value in rows:
        table.add_row(name, escape(str(value)))
    if rejects_path:
        table.add_row("rejects file", escape(str(rejects_path)), style="yellow")
    return table


def build_table(result) -> Table:
    return _facts(f"Build {result.build_id} of catalog '{result.catalog}'", (
        ("columns", f"address {result.address_column!r}, id "
                    + (repr(result.id_column) if result.id_column else "none (rows keyed by their address)")
                    + (f", name {result.name_column!r}" if getattr(result, "name_column", None) else "")),
        *((("chosen", result.columns_reason),) if getattr(result, "columns_reason", "") else ()),
        *((("other columns", f"{', '.join(result.other_columns)}: kept with each entry (answers' fields, normalize "
                             "--catalog-columns)"),) if getattr(result, "other_columns", None) else ()),
        ("rows read", result.rows_read),
        ("new entries", result.rows_inserted),
        ("updated entries", result.rows_updated),
        ("already stored", result.rows_skipped),
        ("rejected", result.rows_rejected),
        *((("blank lines skipped", result.blank_lines),) if getattr(result, "blank_lines", 0) else ()),
        ("entries in store", result.entries_total),
        ("vectors in index", result.vectors_total),
        ("vectors added", result.vectors_added),
        ("entries parsed", result.entries_parsed),
        ("index", f"{result.index_factory} → {result.index_path}"),
        *((("plan", result.plan),) if getattr(result, "plan", "") else ()),  # how the vectors were computed
        *result.answers.items(),  # the profile and number policy of its answers, and where each comes from
        ("seconds", ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items())),
    ), result.rejects_path)


def add_table(result) -> Table:
    return _facts(f"Generation {result.generation_id} of catalog '{result.catalog}' (build {result.build_id})", (
        ("rows read", result.rows_read), ("new entries", result.rows_inserted), ("updated entries", result.rows_updated),
        ("unchanged", result.rows_skipped), ("rejected", result.rows_rejected), ("vectors added", result.vectors_added),
        ("vectors removed", result.vectors_removed), ("vectors in index", result.vectors_total),
        ("seconds", ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items())),
    ), result.rejects_path)


def check_table(report, title: str) -> Table:
    table = Table(title=escape(f"{title}: catalog '{report.catalog}', generation {report.generation_id}"), show_header=False)
    for name, value in report.facts.items():
        table.add_row(escape(str(name)), escape(str(value)))
    for problem in report.problems:
        table.add_row("[red]problem[/]", escape(str(problem)))
    for note in report.notes:
        table.add_row("[yellow]note[/]", escape(str(note)))
    table.add_row("verdict", "[green]clean[/]" if report.clean else "[red]inconsistent[/]")
    return table


def check_json(report, stage: str) -> dict:
    return {"stage": stage, "clean": report.clean, "catalog": report.catalog, "generation": report.generation_id,
            "facts": report.facts, "problems": report.problems, "notes": report.notes}


# --- resolve, parse ------------------------------------------------------------------------------

def parse_table(result: dict) -> Table:
    """One row per element; admin elements show the standard name and code, inferred levels first."""
    from mgeo_index.compare.elements import ADMIN_LEVEL_NAMES, PARSED_ELEMENTS
    from mgeo_index.text.parser import ADMIN_LEVELS

    admin_of_label = {label: PARSED_ELEMENTS[label] for label in ADMIN_LEVELS}  # prov → province, …
    admin = result["admin"]
    table = Table(title=escape(result["text"]), title_justify="left")
    for column in ("element", "text", "standard", "code"):
        table.add_column(column)
    written = {admin_of_label[e["label"]] for e in result["elements"] if e["label"] in admin_of_label}
    for key in ADMIN_LEVEL_NAMES:
        if admin[key] and key not in written:
            table.add_row(key, "", escape(f"{admin[key]} (inferred)"), admin[f"{key}_code"], style="dim")
    for e in result["elements"]:
        key = admin_of_label.get(e["label"])
        table.add_row(key or e["label"], escape(e.get("display") or e["text"]), escape((admin[key] or "") if key else ""),
                      (admin[f"{key}_code"] or "") if key else "")
    if admin.get("coordinates_level"):
        table.add_row("coordinates", "", f"{admin['lon']:.4f}, {admin['lat']:.4f} (the {admin['coordinates_level']}'s centre)",
                      "", style="dim")
    if admin["ambiguous"]:
        table.add_row("ambiguous", "", escape(" / ".join(admin["ambiguous"])), "", style="yellow")
    return table


_STATE_MARK = {"agree": "[green]✓[/]", "differ": "[red]✗[/]", "only_a": "[dim]−[/]", "only_b": "[dim]+[/]"}
EXPLAIN_LEGEND = "elements: ✓ agree  ✗ differ  − query only  + candidate only"


def _explain_line(explain: dict) -> Text:
    """Compact element comparison: ✓ agree, ✗ differ, − only in the query, + only in the candidate."""
    return Text.from_markup(" ".join(f"{_STATE_MARK[e['state']]}{escape(name)}" for name, e in explain.items()))


def matches_table(query: str, matches: list[dict], footer: str | None = None) -> Table:
    """A query's matches, best first. Only the address (and under it, with ``--explain``, the element comparison)
    wraps: ranks, ids, scores, labels and confidences are never broken, so the table reads at 80 columns.
    ``confidence`` is the probability of the label shown (every class's probability: ``--json``). ``footer``: what
    the answers were made with (the profile and number policy), under the table."""
    table = Table(title=Text(visible(query)), title_justify="left")  # Text: brackets in an address are not markup
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("id", justify="right", overflow="fold")
    table.add_column("address", overflow="fold", ratio=1)  # addresses are shown whole, wrapped
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("label", no_wrap=True)
    table.add_column("confidence", justify="right", no_wrap=True)
    colors = {"exact_match": "green", "partial_match": "yellow", "not_match": "red"}
    for rank, m in enumerate(matches, 1):
        label = m.get("label", "")
        address = Text(visible(m["address"]))
        if m.get("name"):  # an index built with --name-column: the entry's name beside its address
            address.append(f" · {visible(m['name'])}", style="bold")
        if "explain" in m:
            address.append("\n").append_text(_explain_line(m["explain"]))
        table.add_row(
            str(rank),
            Text(visible(str(m["source_id"])) if m.get("source_id") else str(m["id"])),
            address,
            f"{m['score']:.3f}" if m['score'] is not None else "–",
            Text(label, style=colors.get(label, "")),
            f"{m['probability']:.3f}" if "probability" in m else "",
        )
    captions = [EXPLAIN_LEGEND] if matches and "explain" in matches[0] else []
    table.caption = "\n".join(captions + ([footer] if footer else [])) or None
    return table


# --- evaluation ----------------------------------------------------------------------------------


def report_table(title: str, report: dict) -> Table:
    table = Table(title=escape(title))
    for name in ("label", "precision", "recall", "F1", "support"):
        table.add_column(name, justify="left" if name == "label" else "right")
    for label, r in report["per_class"].items():
        table.add_row(label, f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['f1']:.3f}", str(r["support"]))
    table.add_row("macro", "", "", f"{report['macro_f1']:.3f}", str(report["n"]), style="bold")
    table.caption = f"accuracy {report['accuracy']:.3f} · expected calibration error {report['ece']:.3f}"
    return table


def variants_table(title: str, report: dict) -> Table:
    """:func:`mgeo_index.measure.evaluate.evaluate_variants`: the shares labelled exact_match and read as a conflict
    (of numbers or names), by kind of pair."""
    table = Table(title=escape(title))
    for name in ("pairs", "kind", "count", "exact_match", "conflict"):
        table.add_column(name, justify="left" if name in ("pairs", "kind") else "right")
    wants = {"changed": "another place", "controls": "the same place", "holds": "a range and its number"}
    for part, r in report.items():
        if not r["pairs"]:
            continue
        table.add_row(f"{part} ({wants.get(part, part)})", "all", str(r["pairs"]), f"{r['exact_match']:.4f}",
                      f"{r['conflict']:.4f}", style="bold")
        for kind, k in r["by_kind"].items():
            table.add_row("", kind, str(k["pairs"]), f"{k['exact_match']:.4f}", f"{k['conflict']:.4f}")
    return table


def figures_table(title: str, reports: dict[str, dict]) -> Table:
    """The figures of one labelled file under each profile or on each split, side by side (a column each)."""
    table = Table(title=escape(title))
    table.add_column("figure")
    for name in reports:
        table.add_column(name, justify="right")
    first = next(iter(reports.values()))
    rows = [("macro-F1", lambda r: r["macro_f1"])] + [
        (f"{label} F1", lambda r, label=label: r["per_class"][label]["f1"]) for label in first["per_class"]] + [
        ("accuracy", lambda r: r["accuracy"]), ("calibration error", lambda r: r["ece"])]
    for name, value in rows:
        table.add_row(name, *(f"{value(r):.4f}" for r in reports.values()))
    return table


def confusion_table(report: dict) -> Table:
    table = Table(title="Confusion (rows: gold, columns: predicted)")
    table.add_column("gold \\ predicted")
    for label in report["labels"]:
        table.add_column(label, justify="right")
    for label, row in zip(report["labels"], report["confusion"]):
        table.add_row(label, *map(str, row))
    return table


def retrieval_table(reports: dict[str, dict], retrieval: str) -> Table:
    """Recall and MRR before and after reranking; several splits (``{split: report}``) side by side, a pair of rows
    each."""
    found = [f"{r['gold_in_catalog']} of {r['queries']} queries" + (f" ({name})" if len(reports) > 1 else "")
             for name, r in reports.items()]
    table = Table(title=escape(f"Retrieval ({retrieval}): {', '.join(found)} have their gold entry in the catalog"))
    table.add_column("stage" if len(reports) == 1 else "split · stage")
    for name in ("recall@1", "recall@5", "recall@10", "mrr@10"):
        table.add_column(name, justify="right")
    for split, report in reports.items():
        for stage in ("retrieval", "reranked"):
            r = report[stage]
            table.add_row(stage if len(reports) == 1 else f"{split} · {stage}",
                          *(f"{r[k]:.3f}" for k in ("recall@1", "recall@5", "recall@10", "mrr@10")))
    called = [f"{r['top1_exact']:.3f}" + (f", {r['top1_exact_wrong']:.3f} of them not gold" if r["top1_exact_wrong"]
                                          is not None else "") + (f" ({split})" if len(reports) > 1 else "")
              for split, report in reports.items() if "top1_exact" in (r := report["reranked"])]
    if called:
        table.caption = "first answer exact_match: " + "; ".join(called)
    return table


def print_rows(title: str, columns: tuple[str, ...], rows: list[tuple], caption: str | None = None) -> None:
    """A table of ``rows`` under ``columns`` (the first column names each row), printed whole: as one table where
    it fits the terminal, else one block of ``column  value`` lines a row, so that no number is ever cut."""
    table = Table(title=escape(title), caption=caption)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width:
        console.print(table)
        return
    blocks = Table(title=escape(title), caption=caption, show_header=False, box=box.SIMPLE_HEAD)
    blocks.add_column(no_wrap=True)
    blocks.add_column(overflow="fold")
    for row in rows:
        blocks.add_row(Text(str(row[0]), style="bold"), "")
        for name, value in zip(columns[1:], row[1:]):
            blocks.add_row(f"  {name}", value)
    console.print(blocks)


def print_bench(report: dict) -> None:
    rows = []
    for what, r in (("encode addresses/s", report["encode"]), ("score pairs/s (network)", report["score_pairs"])):
        share, ceiling = r.get("linear_share"), r.get("ceiling_ratio")
        rows.append((what, f"{r['batched_per_s']:,.0f}", f"{r['naive_per_s']:,.0f}", f"{r['ratio']:.1f}×",
                     f"{share:.0%}" if share else "–", f"{ceiling:.1f}×" if ceiling else "–"))
    print_rows(f"mgeo-index bench ({report['torch_threads']} threads, backend {report['backend']}, same inputs, one run)",
               ("what", "batched", "naive (1 item, pad 64, FP32 torch)", "ratio", "time in Linear GEMMs", "ceiling ratio"),
               rows, caption="ceiling: the ratio if everything but the Linear layers' GEMMs took no time")
    timed = [r for r in report.get("backends") or () if "skipped" not in r]
    if timed:
        print_rows("CPU backends, same inputs, interleaved rounds (best of 3)",
                   ("backend", "addresses/s", "× torch", "pairs/s", "× torch", "min cosine vs torch", "dev macro-F1",
                    "Δ F1", "setup s"),
                   [(r["backend"], f"{r['encode_per_s']:,.0f}", f"{r.get('encode_vs_torch', float('nan')):.2f}×",
                     f"{r['pairs_per_s']:,.0f}", f"{r.get('pairs_vs_torch', float('nan')):.2f}×",
                     f"{r['embedding_cosine_min']:.5f}" if "embedding_cosine_min" in r else "–",
                     f"{r['macro_f1']:.4f}" if "macro_f1" in r else "–",
                     f"{r['macro_f1_delta']:+.4f}" if "macro_f1_delta" in r else "–", f"{r['setup_s']:.1f}")
                    for r in timed])
    for r in report.get("backends") or ():
        if "skipped" in r:
            err.print(f"[yellow]backend {escape(r['backend'])} skipped:[/] {escape(r['skipped'])}", highlight=False,
                      soft_wrap=True)
    for name, r in report.get("resolve", {}).items():
        console.print(f"resolve ({name}), warm, one query per call, top-{r['top_k']} + rerank over {r['catalog_size']:,} "
                      f"entries: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms ({r['queries']} queries)")
    if report.get("build"):
        rows = []
        for r in report["build"]:
            resolve = r.get("resolve") or {}
            recall = r.get("recall_at_10_vs_flat")
            rows.append((
                f"{r['rows']:,}", f"{r['seconds']:.1f}", f"{r['rows_per_s']:,.0f}", f"{r.get('rows_per_cpu_s', 0):,.0f}",
                f"{r['peak_rss_mib']:,.0f}", r.get("structure", "–") + (f" nprobe {r['nprobe']}" if r.get("nprobe") else ""),
                "–" if recall is None else f"{recall:.3f}",
                *(f"{r.get(k, 0):,.0f}" for k in ("vectors_mib", "ngrams_mib", "store_mib")),
                f"{resolve['p50_ms']:.1f} / {resolve['p99_ms']:.1f}" if resolve else "–",
                f"{resolve['resolver_rss_mib']:,.0f} ({resolve.get('resolver_anon_mib', 0):,.0f})" if resolve else "–",
            ))
        print_rows("mgeo-index build of synthesized catalogs (fresh index, child process)",
                   ("rows", "seconds", "rows/s", "rows per CPU s", "peak RSS MiB", "structure", "recall@10 vs Flat",
                    "vectors MiB", "n-grams MiB", "store MiB", "resolve p50 / p99 ms", "resolver RSS (own) MiB"), rows)


# --- normalize jobs ------------------------------------------------------------------------------


def normalize_table(result) -> Table:
    """A job's counts; the output path is printed under the table as a plain line (:func:`print_normalize`), so
    that a narrow terminal wraps it without breaking it."""
    table = Table(title=escape(f"Job {result.job_id}"), show_header=False)
    rows = [("rows", f"{result.rows:,}")]
    if result.resumed_from:
        rows.append(("resumed at row", f"{result.resumed_from:,}"))
    rows += [(status, f"{n:,}") for status, n in result.counts.items()]
    rows += [("profile", result.profile), ("numbers", result.numbers), ("runner", result.runner),
             ("format", result.output_format),
             ("seconds", f"{result.seconds:.1f}"), ("rows/s", f"{result.rows_per_second:,.0f}")]
    for name, value in rows:
        table.add_row(name, escape(str(value)), style="yellow" if name == "rejected" and result.counts["rejected"] else None)
    return table


def print_normalize(result) -> None:
    console.print(normalize_table(result))
    console.print(Text(visible(f"output: {result.output}")), soft_wrap=True)


_JOB_COLORS = {"complete": "green", "running": "cyan", "stale": "yellow", "interrupted": "yellow", "failed": "red"}


def jobs_table(found: list[dict], where: str, statuses) -> Group:
    """The jobs of a store: a table of counts that fits 80 columns (numbers never cut or wrapped), then each job's
    input and output, one line a job, wrapped whole."""
    table = Table(title=escape(f"Jobs in the store of {where}"), title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)  # no vertical rules: the columns fit 80 characters whole
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("rows", justify="right", no_wrap=True)
    for name in statuses:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("updated UTC", no_wrap=True)
    files = []
    for job in found:
        total, done = job["rows_total"], job["rows_done"]
        share = f" {min(done / total, 1):.0%}" if total and job["state"] != "complete" else ""  # of the estimate
        table.add_row(
            str(job["id"]), Text(job["state"] + share, style=_JOB_COLORS.get(job["state"], "")), f"{done:,}",
            *(f"{job[s]:,}" for s in statuses), f"{job['updated_at']:%m-%d %H:%M}",
        )
        files.append(Text(visible(f"{job['id']:>4}  {job['input_path']} → {job['output_path']}")))
    return Group(table, *files)
