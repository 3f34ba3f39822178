"""The one CSV / TSV writer: every table mgeo-index writes for people and spreadsheets (normalize and match
outputs, exported labels, rejected rows) goes through :class:`TableWriter`.

- **Values round-trip**: a cell with the delimiter, a quote or a line break is quoted (RFC 4180); a row holding a
  bare carriage return anywhere is written with every cell quoted (Python's writer would otherwise leave a lone
  ``\\r`` unquoted, and a reader would see a phantom row). ``plain`` tables (read back without quoting, as
  ``mgeo-index eval pairs`` and ``labels import`` read a labels file) fold each run of whitespace in a cell to one
  space and write quotes as they are.
- **Formulas are neutralised by default**: a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
  carriage return and is not a plain number is written with a leading ``'`` (OWASP's advice against CSV
  injection), so a spreadsheet shows the text instead of running it. ``raw=True`` (``--raw-values``) writes
  every value as it is.
"""
from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from typing import Any, TextIO

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_WHITESPACE = re.compile(r"\s+")


def neutralised(value: str) -> str:
    """``value`` as a spreadsheet shows it as text: a leading ``'`` when it would start a formula."""
    if value.startswith(FORMULA_START) and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


def cell(value: Any) -> str:
    """A value as a table cell: None empty, floats with six decimals, anything else as text."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}"
    return value if isinstance(value, str) else str(value)


class TableWriter:
    """Writes rows of values to ``fh`` (opened with ``newline=""``), ``delimiter``-separated, one ``\\n`` per row."""

    def __init__(self, fh: TextIO, delimiter: str = ",", *, raw: bool = False, plain: bool = False) -> None:
        self.raw, self.plain = raw, plain
        if plain:
            self._writer = csv.writer(fh, delimiter=delimiter, quoting=csv.QUOTE_NONE, quotechar=None,
                                      escapechar=None, lineterminator="\n")
        else:
            self._writer = csv.writer(fh, delimiter=delimiter, lineterminator="\n")
            self._quoted = csv.writer(fh, delimiter=delimiter, lineterminator="\n", quoting=csv.QUOTE_ALL)
        self.delimiter = delimiter

    def writerow(self, values: Iterable[Any]) -> None:
        cells = [cell(v) for v in values]
        if self.plain:
            cells = [_WHITESPACE.sub(" ", c).strip() for c in cells]
        if not self.raw:
            cells = [neutralised(c) for c in cells]
        if self.plain or not any("\r" in c for c in cells):
            self._writer.writerow(cells)
        else:
            self._quoted.writerow(cells)

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)
