"""A normalize job's input: CSV/TSV (read by :mod:`mgeo_index.catalog.reader`) or Parquet, in chunks of
records, each record valid (its address) or rejected (the reason), and the input's fingerprint."""
from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgeo_index.catalog.reader import (
    CatalogError,
    CatalogReader,
    _resolve_column,
    check_input_file,
    detect_address_column,
    read_catalog,
)
from mgeo_index.jobs.policy import DEFAULT_CHUNK_SIZE, JobError
from mgeo_index.text import normalize as normalize_text, not_an_address

PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(slots=True)
class Record:
    line: int  # CSV: physical line (header = 1); Parquet: 1-based row number
    values: list[Any]  # the input columns, in order
    address: str | None  # set when the row is valid
    reason: str | None = None  # set when it is rejected
    name: str | None = None  # the place's name (a name column given), when the row has one


@dataclass
class Chunk:
    records: list[Record]
    table: Any = None  # Parquet input: the chunk's own Arrow table (keeps the input's column types)

    def valid_queries(self) -> tuple[list[str], list[str]]:
        """(addresses, names) of the valid rows, in order; a name is "" where a row has none (or no name column
        was given)."""
        valid = [r for r in self.records if r.reason is None]
        return [r.address for r in valid], [r.name or "" for r in valid]


def fingerprint_input(path: str | Path) -> tuple[str, int]:
    """(``sha256:<hex>`` of the whole file, number of newline bytes) in one pass."""
    digest, lines = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            lines += block.count(b"\n")
    return f"sha256:{digest.hexdigest()}", lines


def input_format(path: str | Path) -> str:
    return "parquet" if Path(path).suffix.lower() in PARQUET_SUFFIXES else "csv"


def require(module: str, extra: str, what: str) -> None:
    """A clear :class:`JobError` naming the extra to install when ``module`` (which ``what`` needs) is missing."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:  # pragma: no cover - depends on the environment
        raise JobError(f"{what} needs {module.split('.')[0]}: pip install 'mgeo-index[{extra}]'") from None


def require_pyarrow() -> None:
    require("pyarrow.parquet", "parquet", "Parquet")


class ParquetReader(CatalogReader):
    """Parquet input with the catalog reader's column detection and row validation (its
    ``_check``); values are validated as text, the output keeps the input's column types."""

    def __init__(self, path: str | Path, *, address_column: str | None = None, id_column: str | None = None,
                 max_chars: int = 256, chunk_size: int = DEFAULT_CHUNK_SIZE, name_column: str | None = None) -> None:  # noqa: D107
        require_pyarrow()
        import pyarrow.parquet as pq

        self.path = Path(path)
        check_input_file(self.path, "input file")
        self.max_chars, self.chunk_size, self.dedupe = max_chars, chunk_size, False
        self.coordinate_columns = []  # an input's columns pass through as they are (a catalog's are checked)
        self.encoding, self.delimiter = "utf-8", "\t"
        try:
            self.file = pq.ParquetFile(self.path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
            raise CatalogError(f"{self.path} is not a readable Parquet file: {exc}") from None
        self.schema = self.file.schema_arrow
        self.columns = list(self.schema.names)
        self.rows_total = self.file.metadata.num_rows
        if not self.rows_total:
            raise CatalogError(f"input file {str(self.path)!r} has no rows")
        first = next(self.file.iter_batches(batch_size=200))
        sample = list(zip(*(as_text(first.column(i).to_pylist()) for i in range(first.num_columns))))
        self.address_column = (
            _resolve_column(address_column, self.columns, "address") if address_column is not None
            else detect_address_column(self.columns, sample)
        )
        self.id_column = None if id_column is None else _resolve_column(id_column, self.columns, "id")
        self.name_column = None if name_column is None else _resolve_column(name_column, self.columns, "name")
        if self.name_column is not None and self.name_column in (self.address_column, self.id_column):
            raise CatalogError(f"the name column {self.name_column!r} is also the address or id column; "
                               "name the column that holds each place's name")

    def record_chunks(self) -> Iterator[Chunk]:
        import pyarrow as pa

        n = len(self.columns)
        addr_i = self.columns.index(self.address_column)
        id_i = None if self.id_column is None else self.columns.index(self.id_column)
        name_i = None if self.name_column is None else self.columns.index(self.name_column)
        extra = [(i, c) for i, c in enumerate(self.columns) if i not in (addr_i, id_i)]
        line = 0
        for batch in self.file.iter_batches(batch_size=self.chunk_size):
            texts = list(zip(*(as_text(batch.column(i).to_pylist()) for i in range(n))))
            records = []
            for fields in texts:
                line += 1
                fields = list(fields)
                outcome = self._check(fields, line, "\t".join(fields), n, addr_i, id_i, name_i, extra, {})
                records.append(_record(outcome, fields))
            yield Chunk(records, pa.Table.from_batches([batch], schema=self.schema))


def as_text(values: list) -> list[str]:
    return ["" if v is None else v if isinstance(v, str) else str(v) for v in values]


def _record(outcome, values: list) -> Record:
    if hasattr(outcome, "reason"):  # a Reject
        return Record(outcome.line, values, None, outcome.reason)
    if reason := not_an_address(normalize_text(outcome.address)):
        return Record(outcome.line, values, None, reason)
    return Record(outcome.line, values, outcome.address, name=outcome.name)


def _csv_chunks(reader: CatalogReader) -> Iterator[Chunk]:
    columns = reader.columns
    addr_i = columns.index(reader.address_column)
    id_i = None if reader.id_column is None else columns.index(reader.id_column)
    for rows, rejects in reader.chunks():
        records = []
        for row in rows:
            values = [row.extra.get(c, "") for c in columns]
            values[addr_i] = row.address
            if id_i is not None:
                values[id_i] = row.source_id or ""
            records.append(_record(row, values))
        for rej in rejects:
            records.append(Record(rej.line, _split_raw(rej.raw, reader.delimiter, len(columns)), None, rej.reason))
        records.sort(key=lambda r: r.line)
        yield Chunk(records)


def _split_raw(raw: str, delimiter: str, n: int) -> list[str]:
    """A rejected record's fields for the output's input columns (padded / cut to ``n``)."""
    try:
        fields = next(csv.reader(io.StringIO(raw), delimiter=delimiter), [])
    except csv.Error:
        fields = [raw]
    return (list(fields) + [""] * n)[:n]


def open_input(path: Path, *, address_column: str | None, id_column: str | None, max_chars: int, chunk_size: int,
               name_column: str | None = None):
    """(reader, chunk iterator factory, exact row count or None). ``name_column``: the column naming each row's
    place, if any (rows then resolve as name + address)."""
    if input_format(path) == "parquet":
        reader = ParquetReader(path, address_column=address_column, id_column=id_column, max_chars=max_chars,
                               chunk_size=chunk_size, name_column=name_column)
        return reader, reader.record_chunks, reader.rows_total
    reader = read_catalog(path, address_column=address_column, id_column=id_column, max_chars=max_chars,
                          chunk_size=chunk_size, dedupe=False, reject_blank=True,  # every line has its output row
                          name_column=name_column, what="input file")
    return reader, (lambda: _csv_chunks(reader)), None
