"""`mgeo-index match`: score a file of address pairs (columns ``a`` and ``b``) with the cross-encoder."""
from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mgeo_index import files
from mgeo_index.compare import conflicts, features
from mgeo_index.query.labelling import label_pairs, runs_of
from mgeo_index.catalog.reader import CatalogError, data_suffix, detect_encoding, open_text, sniff_delimiter
from mgeo_index.model import numbers as number_policy
from mgeo_index.model.cross_encoder import CrossEncoder
from mgeo_index.tables import TableWriter
from mgeo_index.text import has_content, model_text, printable

PAIR_COLUMNS = ("a", "b")


def score_sides(cross: CrossEncoder, a: list[str], b: list[str], *, device: str | None = None, explain: bool = False,
                grouped: bool = False, numbers: str | None = None, calibrated: bool = False):
    """(probabilities, decided label indices, per pair :func:`features.explain_parsed` or None) for pairs
    of :func:`mgeo_index.text.model_text` texts. Both sides are parsed once, in one batch, for the stacked scorer's features
    and for the explanations alike, so an explanation describes the text that was scored. ``grouped``: the
    consecutive pairs sharing their first side are a query's candidates, judged together by the model's group
    head (:mod:`mgeo_index.model.group_head`; without one, each pair alone). ``numbers``: the number policy
    (:mod:`mgeo_index.model.numbers`; strict by default). The probabilities are those an answer shows (the label
    the most probable: :func:`mgeo_index.model.numbers.answer`); ``calibrated``: the calibrated ones instead, with
    the policy applied, for fitting."""
    n = len(a)
    stacked = cross.feature_head is not None
    strict = number_policy.check_mode(numbers) == "strict"
    parsed = features.parse_distinct(a + b) if n and (explain or stacked or strict) else None
    found = conflicts.number_conflicts_batch(parsed[:n], parsed[n:]) if parsed and (stacked or strict) else None
    pair_features = features.pair_features_batch(a, b, parsed[:n], parsed[n:], found) if parsed and stacked else None
    labelled = label_pairs(cross, a, b, parsed[:n] if parsed else None, parsed[n:] if parsed else None,
                           numbers=numbers, device=device, features=pair_features, group_head=grouped,
                           runs=runs_of(a) if grouped and not calibrated else None, found=found)
    explained = [features.explain_parsed(parsed[i], parsed[n + i]) for i in range(n)] if explain and n else None
    return (labelled.calibrated if calibrated else labelled.shown), labelled.decided, explained


@dataclass
class MatchFileReport:
    """What :func:`match_file` did with a file of pairs (one :class:`mgeo_index.query.results.MatchResult` a pair is
    the API's)."""

    rows: int = 0
    scored: int = 0
    invalid: list[str] = field(default_factory=list)  # "line N: reason"
    label_counts: dict[str, int] = field(default_factory=dict)


def match_file(
    pairs_path: str | Path,
    out_path: str | Path,
    cross: CrossEncoder,
    *,
    device: str | None = None,
    chunk_size: int = 20000,
    explain: bool = False,
    grouped: bool = True,
    on_progress: Callable[[int], None] | None = None,
    numbers: str | None = None,
    raw: bool = False,
) -> MatchFileReport:
    """Write ``out_path`` = the input rows + label + one probability column per label, in input order.

    ``explain`` adds a JSON column {element: {"state", "query", "candidate", "text"}} (state agree | differ |
    only_a | only_b; the text as ``room differs: 1201室 vs 01``), the explanation the API and ``resolve --json``
    give. ``grouped`` (default): the consecutive rows sharing column ``a`` are a query's candidates, labelled together (:func:`score_sides`); a
    chunk never splits such a run unless the run alone is longer than ``chunk_size``. ``numbers``: the number
    policy (:mod:`mgeo_index.model.numbers`, strict by default). The output goes through the one table writer
    (:class:`mgeo_index.tables.TableWriter`): cells that would start a spreadsheet formula are neutralised unless
    ``raw``.

    Rows with an empty side keep their place with empty label/probabilities and are reported.
    The output is written to a temporary file and moved into place when complete.
    """
    pairs_path, out_path = Path(pairs_path), Path(out_path)
    _check_out(pairs_path, out_path)
    encoding = detect_encoding(pairs_path)
    result = MatchFileReport(label_counts={label: 0 for label in cross.labels})
    _last_line = 1

    def write(tmp: str) -> None:
        nonlocal _last_line
        # undecodable bytes are kept as surrogates and reported on their own row (a strict decoder fails on a
        # read-ahead buffer, lines after the last row read)
        with open_text(pairs_path, encoding, errors="surrogateescape") as src, \
                open(tmp, "w", encoding="utf-8", newline="") as dst:
            reader = _pairs_reader(src, pairs_path, encoding)
            columns = list(reader.fieldnames)
            out_columns = columns + ["label"] + [f"p_{label}" for label in cross.labels] + (["explain"] if explain else [])
            writer = TableWriter(dst, "\t", raw=raw)
            writer.writerow(out_columns)
            scoring = _Scoring(cross, device, explain, grouped, numbers, writer, out_columns, result, on_progress)
            chunk: list[tuple[int, dict]] = []
            for row in reader:
                line = _last_line = reader.line_num
                result.rows += 1
                _read_row(row, line, len(columns), encoding, result)
                chunk.append((line, row))
                if len(chunk) >= chunk_size:
                    chunk = scoring.flush(chunk, keep_last_run=True)
            scoring.flush(chunk)
    try:
        files.replace_atomic(out_path, write)
    except csv.Error as exc:
        raise CatalogError(f"{pairs_path}: line {_last_line + 1}: {exc} (an unclosed quote?); fix the quoting") from None
    return result


def _check_out(pairs_path: Path, out_path: Path) -> None:
    if out_path.resolve() == pairs_path.resolve():
        raise ValueError("--out must not be the input file: write the scores to a new file")
    if out_path.is_dir():
        raise IsADirectoryError(f"--out {out_path} is a directory: name a file to write the scores to")
    if not out_path.resolve().parent.is_dir():
        raise FileNotFoundError(f"--out {out_path}: the folder {out_path.parent} does not exist")


def _pairs_reader(src, pairs_path: Path, encoding: str) -> csv.DictReader:
    """The pairs file's rows as dicts, once its header is known to name columns ``a`` and ``b`` in readable bytes."""
    delimiter = sniff_delimiter(src.readline(), data_suffix(pairs_path))
    src.seek(0)
    reader = csv.DictReader(src, delimiter=delimiter)
    columns = list(reader.fieldnames or [])
    if any(c != printable(c) for c in columns):
        raise CatalogError(f"{pairs_path}: the header line has undecodable bytes (read as {encoding}); "
                           "re-save the file as UTF-8")
    missing = [c for c in PAIR_COLUMNS if c not in columns]
    if missing:
        raise CatalogError(
            f"{pairs_path}: missing column(s) {missing}; the header must name the two addresses "
            f"'a' and 'b' (found: {columns})"
        )
    return reader


def _read_row(row: dict, line: int, n_columns: int, encoding: str, result: MatchFileReport) -> None:
    """``row`` with its two sides normalized (``_sides``) and whether it can be scored (``_ok``); why not is
    reported by line."""
    undecodable = [c for c, v in row.items() if isinstance(v, str) and v != printable(v)]
    for c in undecodable:
        row[c] = printable(row[c])  # written back as U+FFFD
    row["_sides"] = tuple(model_text(row.get(c) or "") for c in PAIR_COLUMNS)  # normalized once, scored in flush
    empty = [c for c, text in zip(PAIR_COLUMNS, row["_sides"]) if not has_content(text)]
    extra = row.pop(None, None)  # fields beyond the header's
    row["_ok"] = not empty and not extra and not undecodable
    if undecodable:
        result.invalid.append(f"line {line}: undecodable bytes in column {', '.join(map(repr, undecodable))} "
                              f"(read as {encoding}); re-save the file as UTF-8")
    elif extra:
        result.invalid.append(f"line {line}: {n_columns + len(extra)} fields, the header has {n_columns}")
    elif empty:
        result.invalid.append(f"line {line}: no letter or digit in column {', '.join(repr(c) for c in empty)}")


@dataclass
class _Scoring:
    """Scoring a chunk of rows read and writing them, in input order."""

    cross: CrossEncoder
    device: str | None
    explain: bool
    grouped: bool
    numbers: str | None
    writer: TableWriter
    out_columns: list[str]
    result: MatchFileReport
    on_progress: Callable[[int], None] | None

    def flush(self, chunk: list[tuple[int, dict]], keep_last_run: bool = False) -> list[tuple[int, dict]]:
        """Score and write ``chunk``'s rows; with ``keep_last_run`` (grouped), the last query's candidates, which may
        go on in the next rows, are held back and returned (else nothing)."""
        held: list[tuple[int, dict]] = []
        if keep_last_run and self.grouped:
            last = len(chunk)
            while last > 0 and chunk[last - 1][1]["_sides"][0] == chunk[-1][1]["_sides"][0]:
                last -= 1
            if last > 0:
                chunk, held = chunk[:last], chunk[last:]
        valid = [(line, row) for line, row in chunk if row["_ok"]]
        probs, decided, explanations = score_sides(
            self.cross, [r["_sides"][0] for _, r in valid], [r["_sides"][1] for _, r in valid], device=self.device,
            explain=self.explain, grouped=self.grouped, numbers=self.numbers,
        )
        by_line = {line: (p, d) for (line, _), p, d in zip(valid, probs, decided)}
        explained = {line: e for (line, _), e in zip(valid, explanations or [])}
        labels = self.cross.labels
        for line, row in chunk:
            p, d = by_line.get(line, (None, None))
            if p is not None:
                label = labels[int(d)]
                row["label"] = label
                self.result.label_counts[label] += 1
                row.update({f"p_{lab}": f"{float(v):.6f}" for lab, v in zip(labels, p)})
                if self.explain:  # as the API and resolve --json give it: state, both values, the sentence
                    row["explain"] = json.dumps(explained[line], ensure_ascii=False)
            self.writer.writerow([row.get(c, "") for c in self.out_columns])
        self.result.scored += len(valid)
        if self.on_progress:
            self.on_progress(len(chunk))
        return held
