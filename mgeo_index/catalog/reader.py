"""Reading catalog files (CSV / TSV of addresses) safely and in bounded-size chunks.

A catalog file has a header line and one record per row.  :func:`read_catalog`
resolves the encoding, delimiter and columns up front (raising :class:`CatalogError`
for problems with the file as a whole) and returns a :class:`CatalogReader` whose
:meth:`~CatalogReader.chunks` streams ``(rows, rejects)`` tuples.  Every bad record
becomes a :class:`Reject` with its physical line number and a reason a person can act
on; it never aborts the read.
"""
from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mgeo_index.catalog.coordinates import coordinate, coordinate_names
from mgeo_index.settings import MAX_QUERY_CHARS
from mgeo_index.text.normalize import normalize, visible, with_name

__all__ = [
    "CatalogError",
    "CatalogReader",
    "Reject",
    "Row",
    "ADDRESS_COLUMN_NAMES",
    "DEFAULT_MAX_CHARS",
    "address_likeness",
    "choose_address_column",
    "choose_id_column",
    "detect_address_column",
    "detect_encoding",
    "read_catalog",
    "sniff_delimiter",
    "write_rejects",
]

#: Fallback limit on address length (the one limit, settings.MAX_QUERY_CHARS); callers pass the model's real limit.
DEFAULT_MAX_CHARS = MAX_QUERY_CHARS
#: Header names taken as the address column, in order of preference (case-insensitive).
ADDRESS_COLUMN_NAMES = (
    "address",
    "full_address",
    "addr",
    "地址",
    "详细地址",
    "text",
    "query",
    "candidate",
    "name",
    "poi",
    "名称",
)
_SAMPLE_BYTES = 1 << 20  # encoding detection reads at most this much
_SAMPLE_ROWS = 200  # records used to guess the address column
MAX_RAW = 1000  # characters of a rejected record kept as its raw text
_UNDECODABLE = "undecodable bytes in row; re-save the file as UTF-8"
_SURROGATES = re.compile("[\udc80-\udcff]")  # what errors='surrogateescape' makes of bad bytes
_WHITESPACE = re.compile(r"\s+")


class CatalogError(Exception):
    """The catalog file as a whole cannot be read (missing column, empty file, ...)."""


@dataclass(frozen=True, slots=True)
class Row:
    line: int  # 1-based physical line where the record starts (the header is line 1)
    address: str  # stripped
    source_id: str | None  # value of the id column, stripped; None without an id column
    extra: dict[str, str] = field(default_factory=dict)  # every other column (the name column too)
    name: str | None = None  # value of the name column, stripped; None without one or when empty

    @property
    def text(self) -> str:
        """What the row's place is matched by: the address, with its name after it (:func:`with_name`)."""
        return with_name(self.address, self.name)


@dataclass(frozen=True, slots=True)
class Reject:
    line: int
    reason: str
    raw: str  # the record's text, undecodable bytes shown as \xNN


# --------------------------------------------------------------------------- detection


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FFFF or 0xF900 <= o <= 0xFAFF


def _decodes(data: bytes, encoding: str, final: bool) -> bool:
    # Incremental decoding tolerates a multi-byte character cut off by the sample's end.
    try:
        codecs.getincrementaldecoder(encoding)(errors="strict").decode(data, final=final)
    except UnicodeDecodeError:
        return False
    return True


_GZIP_MAGIC = b"\x1f\x8b"


def open_binary(path: str | Path):  # noqa: ANN201 - a binary file object
    """The file's bytes, gunzipped on the fly when it is gzip-compressed (by content, not name)."""
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == _GZIP_MAGIC
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def open_text(path: str | Path, encoding: str, errors: str = "strict"):  # noqa: ANN201 - a text file object
    """Text view of a plain or gzipped file, universal newlines left to the csv module."""
    return io.TextIOWrapper(open_binary(path), encoding=encoding, errors=errors, newline="")


def data_suffix(path: str | Path) -> str:
    """``.tsv`` for ``x.tsv`` and ``x.tsv.gz``: the suffix that says what the data is."""
    suffixes = Path(path).suffixes
    return suffixes[-2] if len(suffixes) >= 2 and suffixes[-1].lower() == ".gz" else (suffixes[-1] if suffixes else "")


def detect_encoding(path: str | Path) -> str:
    """``'utf-8-sig'``, ``'utf-16'`` (BOMs), ``'utf-8'`` or ``'gb18030'``; else charset-normalizer's guess.

    A sample that is mostly valid UTF-8 with a few bad bytes still counts as UTF-8:
    those rows are rejected one by one, which beats reading the whole file as
    GB18030 mojibake (UTF-8 Chinese text often happens to decode as GB18030).
    """
    with open_binary(path) as fh:
        data = fh.read(_SAMPLE_BYTES)
        final = not fh.read(1)
    if data.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and _decodes(data, "utf-16", final):
        return "utf-16"  # (bytes that merely start like a UTF-16 BOM, e.g. b"\xff\xfe" + UTF-8, are not)
    if _decodes(data, "utf-8", final):
        return "utf-8"
    text = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape").decode(data, final=final)
    bad_bytes = len(_SURROGATES.findall(text))
    cjk_chars = sum(1 for ch in text if _is_cjk(ch))
    if cjk_chars >= bad_bytes:
        return "utf-8"
    if _decodes(data, "gb18030", final):
        return "gb18030"
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None or not best.encoding:
        return "utf-8"  # nothing fits: read as UTF-8 and reject the rows that are not
    return codecs.lookup(best.encoding).name


def sniff_delimiter(first_line: str, suffix: str = "") -> str:
    """Tab for ``.tsv``/``.tab`` files or a header containing a tab, comma for a header
    containing a comma.  A single-column header (neither) also gets tab, so that commas
    inside addresses of a one-column file stay part of the address."""
    if suffix.lower() in (".tsv", ".tab") or "\t" in first_line:
        return "\t"
    if "," in first_line:
        return ","
    return "\t"


def _resolve_column(name: str, columns: Sequence[str], what: str) -> str:
    if name in columns:
        return name
    folded = [c for c in columns if c.strip().casefold() == name.strip().casefold()]
    if len(folded) == 1:
        return folded[0]
    raise CatalogError(f"{what} column {name!r} not found; available columns: {', '.join(map(repr, columns))}")


# Names that say "address" (ADDRESS_COLUMN_NAMES less the names of places: name, poi, 名称).
_ADDRESS_NAMES = tuple(n for n in ADDRESS_COLUMN_NAMES if n not in ("name", "poi", "名称"))
# What an address writes and a shop name or a code rarely does: admin suffixes, roads, numbers, buildings.
_ADDRESS_MARKS = re.compile(r"省|市|区|县|旗|镇|乡|街道|大道|路|街|巷|弄|胡同|号|栋|幢|座|楼|层|室|单元|村|社区|小区|大厦|广场|"
                            r"花园|公寓|园|苑|工业区|开发区")
#: a column counts as holding addresses when its values score at least this (0: never, 1: every value has 3 marks)
ADDRESS_LIKE = 0.3
_ID_NAME = re.compile(r"(?:.*[_\s-])?id|编号|序号|uid|key", re.IGNORECASE)


def address_likeness(values: Iterable[str]) -> float:
    """How much a column's values look like Chinese addresses, 0–1: per value, its address marks (admin suffixes,
    roads, numbers, buildings; up to 3) over 3 when it has at least two CJK characters, else 0; averaged."""
    scores = []
    for value in values:
        cjk = sum(1 for ch in value if _is_cjk(ch))
        scores.append(min(len(_ADDRESS_MARKS.findall(value)), 3) / 3 if cjk >= 2 else 0.0)
    return sum(scores) / len(scores) if scores else 0.0


def choose_address_column(header: Sequence[str], sample_rows: Iterable[Sequence[str]]) -> tuple[str, str]:
    """(the address column, why it was chosen), from names and content together.

    A column named like an address (``address``, ``地址``, ``text`` …) is taken when its values look like
    addresses (:func:`address_likeness` at least ADDRESS_LIKE) or no other column's do; otherwise the column whose
    values look most like addresses, when it is clearly ahead of the next; a column named like a place
    (``name``, ``名称``) only when no other column looks more like addresses. Unsure: :class:`CatalogError` naming
    ``--address-column`` and what each column holds."""
    rows = [list(r) for r in sample_rows]
    values = [[r[i] for r in rows if i < len(r) and r[i].strip()] for i in range(len(header))]
    scores = [address_likeness(v) for v in values]
    by_name = {h.strip().casefold(): i for i, h in reversed(list(enumerate(header)))}  # first occurrence wins
    ranked = sorted(range(len(header)), key=lambda i: (-scores[i], i))
    best = ranked[0] if ranked else None
    second = scores[ranked[1]] if len(ranked) > 1 else 0.0

    def share(i: int) -> str:
        return f"{scores[i]:.2f} address-likeness over {len(values[i])} sampled values"

    for names, kind in ((_ADDRESS_NAMES, "an address"), (("name", "poi", "名称"), "a place")):
        named = next((by_name[n] for n in names if n in by_name), None)
        if named is None:
            continue
        if scores[named] >= ADDRESS_LIKE and scores[named] >= scores[best] - 0.2:
            return header[named], f"named like {kind} and its values look like addresses ({share(named)})"
        if scores[best] < ADDRESS_LIKE and kind == "an address" and any(_is_cjk(c) for v in values[named] for c in v):
            return header[named], f"named like an address; no column's values look more like addresses ({share(named)})"
    if best is not None and scores[best] >= ADDRESS_LIKE and second <= 0.7 * scores[best]:
        others = ", ".join(f"{header[i]!r} {scores[i]:.2f}" for i in ranked[1:4])
        return header[best], f"its values look most like addresses ({share(best)}; {others or 'no other column'})"
    described = "; ".join(f"{h!r} ({scores[i]:.2f}, e.g. {values[i][0][:20]!r})" if values[i] else f"{h!r} (empty)"
                          for i, h in enumerate(header))
    raise CatalogError(
        "cannot tell which column holds the addresses; name it with --address-column (and the id column with "
        f"--id-column). Available columns, with how much their values look like addresses: {described}"
    )


def detect_address_column(header: Sequence[str], sample_rows: Iterable[Sequence[str]]) -> str:
    """The address column (:func:`choose_address_column`, without the reason)."""
    return choose_address_column(header, sample_rows)[0]


def choose_id_column(header: Sequence[str], sample_rows: Iterable[Sequence[str]], address_column: str
                     ) -> tuple[str | None, str]:
    """(a column named like an id — ``id``, ``poi_id``, ``编号`` … — whose sampled values are all given and
    distinct, or None; why)."""
    rows = [list(r) for r in sample_rows]
    for i, name in enumerate(header):
        if name == address_column or not _ID_NAME.fullmatch(name.strip()):
            continue
        values = [r[i].strip() if i < len(r) else "" for r in rows]
        empty, repeated = sum(1 for v in values if not v), len(values) - len(set(values))
        if not empty and not repeated:
            return name, f"named like an id, its {len(values)} sampled values all given and distinct"
        return None, (f"{name!r} is named like an id but {empty or repeated} of {len(values)} sampled values are "
                      f"{'empty' if empty else 'repeated'}: rows are keyed by their address (--id-column to choose one)")
    return None, "no column named like an id: rows are keyed by their address (--id-column to choose one)"


def _clean_header(fields: list[str]) -> list[str]:
    """Strip names, name blank ones ``column_N`` and suffix repeats (``name.2``)."""
    out: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(fields, start=1):
        name = raw.strip() or f"column_{i}"
        base, n = name, 1
        while name in seen:
            n += 1
            name = f"{base}.{n}"
        seen.add(name)
        out.append(name)
    return out


# --------------------------------------------------------------------------- reading


def check_input_file(path: Path, what: str = "file") -> None:
    """A clear :class:`CatalogError` unless ``path`` is a file that exists (a directory named by mistake says so)."""
    if path.is_dir():
        raise CatalogError(f"{str(path)!r} is a directory: name the {what} (CSV, TSV or TXT) to read")
    if not path.is_file():
        raise CatalogError(f"{what} {str(path)!r} does not exist")


class _LineTap:
    """Line iterator for ``csv.reader`` that remembers the physical lines of the
    current record: csv pulls lines only as it needs them, so after each record the
    tap holds exactly that record's text and knows where it started."""

    def __init__(self, lines: Iterable[str], lines_before: int = 0) -> None:
        self._lines = iter(lines)
        self.lines_read = lines_before  # the physical lines before the first one this tap gives
        self.buffer: list[str] = []

    def __iter__(self) -> _LineTap:
        return self

    def __next__(self) -> str:
        line = next(self._lines)
        self.lines_read += 1
        self.buffer.append(line)
        return line

    def reread(self, lines: list[str], first: int) -> _LineTap:
        """A tap that gives ``lines`` (physical lines ``first`` … of the file) again, then the rest of the file."""
        return _LineTap(itertools.chain(lines, self._lines), first - 1)

    def take(self) -> tuple[int, str]:
        """(first line number, text) of the lines read since the last call."""
        start = self.lines_read - len(self.buffer) + 1
        text = "".join(self.buffer)
        self.buffer = []
        return start, text


def _unclosed_quote(text: str, delimiter: str) -> bool:
    """Whether a record read over several lines (``text``) is an opened quote that never closes properly: the
    lines after it swallowed into one cell, read as no well-formed record. A quoted cell holding line breaks (as the
    table writer writes one) is well-formed, and reads as it is."""
    if len(text.splitlines()) < 2:
        return False
    try:
        return len(list(csv.reader(io.StringIO(text), delimiter=delimiter, strict=True))) != 1
    except csv.Error:
        return True


def _malformed(exc: csv.Error, max_chars: int) -> str:
    """The reason a record csv could not read is rejected for."""
    if m := re.search(r"field larger than field limit \(([0-9]+)\)", str(exc)):
        return (f"a field longer than {int(m[1]):,} characters (an address may have {max_chars:,}); shorten or split "
                "it")
    return f"malformed record: {exc}"


def _control_char(value: str) -> str | None:
    for ch in value:
        if unicodedata.category(ch) == "Cc":
            return f"U+{ord(ch):04X}"
    return None


class CatalogReader:
    """A catalog file with its encoding, delimiter and columns resolved.

    Iterate :meth:`chunks` (or the reader itself) for ``(rows, rejects)`` tuples; each
    chunk covers up to ``chunk_size`` records.  Memory stays bounded by the chunk,
    apart from one small hash per distinct key kept to report duplicates.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        address_column: str | None = None,
        id_column: str | None = None,
        max_chars: int = DEFAULT_MAX_CHARS,
        chunk_size: int = 5000,
        encoding: str | None = None,
        dedupe: bool = True,
        detect_id: bool = False,
        reject_blank: bool = False,
        name_column: str | None = None,
        what: str = "catalog file",
        check_coordinates: bool = False,
        coordinate_columns: tuple[str | None, str | None] = (None, None),
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self.path = Path(path)  # what: the file's name in messages (a job's "input file")
        check_input_file(self.path, what)
        self.max_chars = max_chars
        self.chunk_size = chunk_size
        self.dedupe = dedupe  # False: repeated ids / addresses are legitimate rows (normalize jobs)
        self.reject_blank = reject_blank  # True: a blank line is a reject ("blank line"), keeping its place
        self.blank_lines = 0  # blank lines skipped by the last pass (reject_blank False)
        self.encoding = encoding or detect_encoding(self.path)

        sample = self._read_header(what)
        self._choose_columns(sample, address_column, id_column, detect_id, name_column, coordinate_columns,
                             check_coordinates)

    def _read_header(self, what: str) -> list[list[str]]:
        """The header (``has_header``, ``delimiter``, ``columns``) and a sample of the first data records, which the
        columns are chosen by; a clear error for an empty file, a blank or undecodable header, no data rows."""
        with self._open() as fh:
            first = fh.readline()
            if not first.strip():
                if not first or not fh.read(4096).strip():
                    raise CatalogError(f"{what} {str(self.path)!r} is empty")
                raise CatalogError(f"first line of {str(self.path)!r} is blank; it must be the header")
            if _SURROGATES.search(first):
                raise CatalogError(f"header line of {str(self.path)!r} has undecodable bytes; re-save the file as UTF-8")
            # A single-column .txt file whose first line is not a column name is one address per
            # line with no header (like the Shenzhen catalog): its first line is data.
            self.has_header = not (
                data_suffix(self.path).lower() == ".txt"
                and "\t" not in first
                and first.strip().lower() not in ADDRESS_COLUMN_NAMES
            )
            self.delimiter = sniff_delimiter(first, data_suffix(self.path)) if self.has_header else "\t"
            fh.seek(0)
            reader = csv.reader(fh, delimiter=self.delimiter)
            self.columns: list[str] = _clean_header(next(reader)) if self.has_header else ["address"]
            sample: list[list[str]] = []
            for _ in range(4 * _SAMPLE_ROWS):  # a malformed record is skipped here; chunks() rejects it
                try:
                    record = next(reader)
                except StopIteration:
                    break
                except csv.Error:
                    continue
                if any(f.strip() for f in record):
                    sample.append(record)
                    if len(sample) >= _SAMPLE_ROWS:
                        break
        if not sample:
            raise CatalogError(f"{what} {str(self.path)!r} has a header but no data rows")
        return sample

    def _choose_columns(self, sample: list[list[str]], address_column: str | None, id_column: str | None,
                        detect_id: bool, name_column: str | None, coordinate_columns: tuple[str | None, str | None],
                        check_coordinates: bool) -> None:
        """The address, id, name and coordinate columns: as named (matched to the header), else detected from
        ``sample`` (each with the reason it was chosen)."""
        if address_column is not None:
            self.address_column = _resolve_column(address_column, self.columns, "address")
            self.address_reason = "given"
        else:
            self.address_column, self.address_reason = choose_address_column(self.columns, sample)
        if id_column is not None:
            self.id_column, self.id_reason = _resolve_column(id_column, self.columns, "id"), "given"
        elif detect_id and self.has_header:
            self.id_column, self.id_reason = choose_id_column(self.columns, sample, self.address_column)
        else:
            self.id_column, self.id_reason = None, "none given: rows are keyed by their address"
        self.name_column = None if name_column is None else _resolve_column(name_column, self.columns, "name")
        # a catalog's coordinate columns, as named or by name (catalog.coordinates): a value out of range is a reject
        if any(coordinate_columns) and not all(coordinate_columns):
            raise CatalogError("name both coordinate columns (--lon-column and --lat-column), or neither")
        named = tuple(_resolve_column(c, self.columns, role)
                      for c, role in zip(coordinate_columns, ("longitude", "latitude")) if c)
        self.coordinate_names = named or coordinate_names(self.columns)  # (longitude, latitude) columns, or None
        self.coordinate_columns = [(self.columns.index(c), c, bound) for c, bound in
                                   zip(self.coordinate_names, (180, 90)) if c] if check_coordinates else []
        if self.name_column is not None and self.name_column in (self.address_column, self.id_column):
            raise CatalogError(f"the name column {self.name_column!r} is also the address or id column; "
                               "name the column that holds each place's name")

    def _open(self):  # noqa: ANN202 - a text file object
        # surrogateescape keeps undecodable bytes visible per row instead of failing the file.
        return open_text(self.path, self.encoding, errors="surrogateescape")

    def __iter__(self) -> Iterator[tuple[list[Row], list[Reject]]]:
        return self.chunks()

    def _raw(self, text: str) -> str:
        """Record text without its line end, undecodable bytes as ``\\xNN`` escapes, cut to :data:`MAX_RAW`
        characters (a rejected 50 MB record is not kept, nor written to rejects.tsv, whole)."""
        text = text.rstrip("\r\n")
        total = len(text)
        text = text[:MAX_RAW]
        if _SURROGATES.search(text):
            text = text.encode(self.encoding, "surrogateescape").decode(self.encoding, "backslashreplace")
        return text if total <= MAX_RAW else f"{text}… ({total:,} characters in all)"

    def chunks(self) -> Iterator[tuple[list[Row], list[Reject]]]:
        """Stream the file as ``(rows, rejects)`` per ``chunk_size`` records.

        Blank lines are skipped and counted (``blank_lines``), or with ``reject_blank`` rejected as "blank line";
        every other record ends up in exactly one of the two lists.  Each call starts reading from the top again.
        """
        self.blank_lines = 0
        n_fields = len(self.columns)
        addr_i = self.columns.index(self.address_column)
        id_i = None if self.id_column is None else self.columns.index(self.id_column)
        name_i = None if self.name_column is None else self.columns.index(self.name_column)
        extra_cols = [(i, c) for i, c in enumerate(self.columns) if i not in (addr_i, id_i)]
        # hash(key) -> first line.  A 64-bit hash, not the key, bounds memory per row; a
        # false duplicate needs a hash collision (~n²/2⁶⁴, negligible).
        seen: dict[int, int] = {}

        rows: list[Row] = []
        rejects: list[Reject] = []
        with self._open() as fh:
            tap = _LineTap(fh)
            reader = csv.reader(tap, delimiter=self.delimiter)
            if self.has_header:
                next(reader)
                tap.take()
            while True:
                try:
                    fields = next(reader)
                except StopIteration:
                    break
                except csv.Error as exc:  # e.g. a field over csv.field_size_limit()
                    line, text = tap.take()
                    rejects.append(Reject(line, _malformed(exc, self.max_chars), self._raw(text)))
                else:
                    line, text = tap.take()
                    if _unclosed_quote(text, self.delimiter):  # reject its first line, read the lines it swallowed
                        first, *rest = text.splitlines(keepends=True)
                        rejects.append(Reject(line, f"a quote opened on line {line} does not close (the lines after "
                                                    "it would be one cell): close the quote or remove it", self._raw(first)))
                        tap = tap.reread(rest, line + 1)
                        reader = csv.reader(tap, delimiter=self.delimiter)
                    elif not text.strip():  # blank line (a row of empty fields is still checked)
                        if self.reject_blank:
                            rejects.append(Reject(line, "blank line (no fields)", self._raw(text)))
                        else:
                            self.blank_lines += 1
                    else:
                        outcome = self._check(fields, line, text, n_fields, addr_i, id_i, name_i, extra_cols, seen)
                        (rows if isinstance(outcome, Row) else rejects).append(outcome)
                if len(rows) + len(rejects) >= self.chunk_size:
                    yield rows, rejects
                    rows, rejects = [], []
        if rows or rejects:
            yield rows, rejects

    def _check(
        self,
        fields: list[str],
        line: int,
        text: str,
        n_fields: int,
        addr_i: int,
        id_i: int | None,
        name_i: int | None,
        extra_cols: list[tuple[int, str]],
        seen: dict[int, int],
    ) -> Row | Reject:
        """Validate one record; the first problem found is the reason given."""

        def reject(reason: str) -> Reject:
            return Reject(line, reason, self._raw(text))

        if _SURROGATES.search(text):
            return reject(_UNDECODABLE)
        if len(fields) != n_fields:
            return reject(
                f"expected {n_fields} fields, found {len(fields)}; "
                "quote values that contain the delimiter"
            )
        address = fields[addr_i].strip()
        if not address:
            return reject(f"empty address in column {self.address_column!r}")
        bad = _control_char(address)
        if bad:
            return reject(f"control character {bad} in column {self.address_column!r}")
        name = fields[name_i].strip() or None if name_i is not None else None
        if name is not None and (bad := _control_char(name)):
            return reject(f"control character {bad} in column {self.name_column!r}")
        if len(matched := with_name(address, name)) > self.max_chars:
            what = "address" if matched == address else "address with its name"
            return reject(
                f"{what} has {len(matched)} characters, longer than the model's limit of "
                f"{self.max_chars}; shorten or split it"
            )
        for i, column, bound in self.coordinate_columns:
            try:
                coordinate(fields[i], -bound, bound)
            except ValueError:
                return reject(f"{'longitude' if bound == 180 else 'latitude'} {fields[i].strip()[:30]!r} in column "
                              f"{column!r} is not a number from {-bound} to {bound}; fix it or leave it empty")
        source_id: str | None = None
        if id_i is not None:
            source_id = fields[id_i].strip()
            if not source_id:
                return reject(f"empty id in column {self.id_column!r}")
            bad = _control_char(source_id)
            if bad:
                return reject(f"control character {bad} in column {self.id_column!r}")
            key, what = source_id, f"same id {source_id!r}"
        else:  # the store's key: the normalized address (a full-width or spaced copy is the same entry)
            key, what = normalize(matched), "same address" if name is None else "same address and name"
        first = seen.setdefault(hash(key), line) if self.dedupe else line
        if first != line:
            return reject(f"duplicate of line {first} ({what})")
        return Row(line=line, address=address, source_id=source_id, extra={c: fields[i] for i, c in extra_cols},
                   name=name)


def read_catalog(
    path: str | Path,
    *,
    address_column: str | None = None,
    id_column: str | None = None,
    max_chars: int = DEFAULT_MAX_CHARS,
    chunk_size: int = 5000,
    encoding: str | None = None,
    dedupe: bool = True,
    detect_id: bool = False,
    reject_blank: bool = False,
    name_column: str | None = None,
    what: str = "catalog file",
    check_coordinates: bool = False,
    coordinate_columns: tuple[str | None, str | None] = (None, None),
) -> CatalogReader:
    """Open a catalog file; raises :class:`CatalogError` for file-level problems.

    ``address_column`` is auto-detected when not given (:func:`choose_address_column`), and with ``detect_id`` the
    id column too (:func:`choose_id_column`); the reader's ``address_reason`` / ``id_reason`` say why. ``encoding``
    is detected when not given.  ``dedupe=False`` accepts repeated ids / addresses (and keeps no per-row
    memory), for files whose rows are records to process rather than catalog entries. ``name_column``: the column
    holding each place's name (rows then match by their address with the name after it, :attr:`Row.text`).
    Iterate the result (or its ``chunks()``) for ``(rows, rejects)``.
    """
    return CatalogReader(
        path,
        address_column=address_column,
        id_column=id_column,
        max_chars=max_chars,
        chunk_size=chunk_size,
        encoding=encoding,
        dedupe=dedupe,
        detect_id=detect_id,
        reject_blank=reject_blank,
        name_column=name_column,
        what=what,
        check_coordinates=check_coordinates,
        coordinate_columns=coordinate_columns,
    )


# --------------------------------------------------------------------------- rejects

_REJECT_HEADER = "line\treason\traw\n"


def write_rejects(path: str | Path, rejects: Iterable[Reject]) -> int:
    """Append rejects to a UTF-8 TSV ``line, reason, raw`` (header written once); returns
    the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    from mgeo_index.tables import TableWriter

    n = 0
    with open(path, "a", encoding="utf-8", errors="backslashreplace", newline="") as fh:
        if new:
            fh.write(_REJECT_HEADER)
        writer = TableWriter(fh, "\t", plain=True)  # control characters shown as escapes, formulas neutralised
        for r in rejects:
            writer.writerow([r.line, visible(r.reason), visible(r.raw)])  # one TSV cell each
            n += 1
    return n
