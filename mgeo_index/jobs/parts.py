"""A normalize job's output: one *part file* per chunk, each written atomically
(:func:`mgeo_index.files.replace_atomic`: aside, fsynced, renamed) before it is recorded as a
checkpoint, and the parts merged into the output file (atomically too) when every record is done.

Formats (:data:`FORMATS`, from the output's suffix): CSV and TSV (in the job's encoding: UTF-8, UTF-8 with a BOM
as Excel on Windows reads it, or GB18030), JSON Lines (UTF-8), Parquet, and Excel workbooks (``.xlsx``, through
openpyxl: ``pip install 'mgeo-index[xlsx]'``; its parts are CSV, made one workbook at the end).
"""
from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path
from typing import Any

from mgeo_index.files import replace_atomic
from mgeo_index.tables import TableWriter
from mgeo_index.jobs.inputs import Chunk, as_text, require, require_pyarrow
from mgeo_index.jobs.policy import JobError, result_columns

RESULT_PREFIX = "mgeo_"  # added to the result columns when the input already has a column of that name
FORMATS = {".csv": "csv", ".tsv": "csv", ".tab": "csv", ".jsonl": "jsonl", ".parquet": "parquet", ".pq": "parquet",
           ".xlsx": "xlsx"}
ENCODINGS = ("utf-8", "utf-8-sig", "gb18030")  # of CSV / TSV outputs
NUMBERS = ("probability", "lon", "lat")  # result columns written as numbers where the format has them


def output_format(out: Path, given: str | None = None) -> str:
    """The format of a job's output: ``given`` (``--format``), else its suffix's (:data:`FORMATS`); an unknown
    suffix or format is refused (nothing would open the file as named)."""
    if given is not None:
        if given not in set(FORMATS.values()):
            raise JobError(f"--format must be one of {', '.join(sorted(set(FORMATS.values())))}, not {given!r}")
        return given
    found = FORMATS.get(out.suffix.lower())
    if found is None:
        raise JobError(f"--out {out}: no known format for the suffix {out.suffix or '(none)'!r}; name it "
                       f"{', '.join(FORMATS)} (or give --format)")
    return found


def output_encoding(given: str | None, input_encoding: str) -> str:
    """A CSV / TSV output's encoding: ``given`` (``--encoding``), else the input's when it is one of
    :data:`ENCODINGS` (a GB18030 or BOM input comes back the same, for the same spreadsheet), else UTF-8."""
    if given is not None:
        if given not in ENCODINGS:
            raise JobError(f"--encoding must be one of {', '.join(ENCODINGS)}, not {given!r}")
        return given
    return input_encoding if input_encoding in ENCODINGS else "utf-8"




class PartWriter:
    """Writes one chunk's output rows as a part file and merges parts into the output."""

    def __init__(self, fmt: str, out: Path, input_columns: list[str], *, raw: bool = False,
                 columns: tuple[str, ...] = result_columns(), encoding: str = "utf-8") -> None:
        self.fmt, self.out, self.raw = fmt, out, raw  # raw: CSV cells as they are (formulas not neutralised)
        self.encoding = encoding  # a CSV / TSV output's (output_encoding); parts carry no BOM
        self.input_columns = input_columns
        self.columns = columns  # the result fields written, in order (jobs.policy.result_columns)
        prefix = RESULT_PREFIX if set(self.columns) & set(input_columns) else ""
        self.result_columns = [prefix + c for c in self.columns]
        self.delimiter = "\t" if out.suffix.lower() in (".tsv", ".tab") else ","
        if fmt == "parquet":
            require_pyarrow()
        if fmt == "xlsx":
            require("openpyxl", "xlsx", "an .xlsx output")

    def header(self) -> list[str]:
        return self.input_columns + self.result_columns

    def write_part(self, path: Path, chunk: Chunk, results: list[dict]) -> int:
        """Write the part (atomically); its size in bytes."""
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            table = self._parquet_table(chunk, results)

            def write(tmp: str) -> None:
                pq.write_table(table, tmp)
        elif self.fmt == "jsonl":
            def write(tmp: str) -> None:
                with open(tmp, "w", encoding="utf-8", newline="") as fh:
                    for record, res in zip(chunk.records, results):
                        values = as_text(record.values) + [_number(res.get(c)) if c in NUMBERS else res.get(c, "")
                                                           for c in self.columns]
                        fh.write(json.dumps(dict(zip(self.header(), values)), ensure_ascii=False) + "\n")
        else:  # CSV / TSV, and an xlsx output's parts
            part_encoding = "utf-8" if self.encoding == "utf-8-sig" else self.encoding

            def write(tmp: str) -> None:
                with open(tmp, "w", encoding=part_encoding, newline="") as fh:
                    writer = TableWriter(fh, self.delimiter, raw=self.raw)
                    for record, res in zip(chunk.records, results):
                        writer.writerow(as_text(record.values) + [res.get(c, "") for c in self.columns])

        replace_atomic(path, write)
        return path.stat().st_size

    def _result_arrays(self, results: list[dict]):
        import pyarrow as pa

        arrays = []
        for c in self.columns:
            values = [r.get(c) for r in results]
            if c in NUMBERS:
                arrays.append(pa.array([_number(v) for v in values], type=pa.float64()))
            else:
                arrays.append(pa.array([v or "" for v in values], type=pa.string()))
        return arrays

    def _parquet_table(self, chunk: Chunk, results: list[dict]):
        import pyarrow as pa

        if chunk.table is not None:
            inputs = list(chunk.table.columns)
        else:
            inputs = [pa.array([_text(r.values[i]) for r in chunk.records], type=pa.string())
                      for i in range(len(self.input_columns))]
        return pa.Table.from_arrays(inputs + self._result_arrays(results), names=self.header())

    def merge(self, parts: list[Path]) -> None:
        """Concatenate the parts into the output (atomically)."""
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            def write(tmp: str) -> None:
                writer = None
                try:
                    for part in parts:
                        pf = pq.ParquetFile(part)
                        if writer is None:
                            writer = pq.ParquetWriter(tmp, pf.schema_arrow)
                        for i in range(pf.num_row_groups):
                            writer.write_table(pf.read_row_group(i))
                finally:
                    if writer is not None:
                        writer.close()
        elif self.fmt == "xlsx":
            def write(tmp: str) -> None:
                from openpyxl import Workbook

                book = Workbook(write_only=True)
                sheet = book.create_sheet("normalized")
                sheet.append(self.header())
                numeric = [len(self.input_columns) + i for i, c in enumerate(self.columns) if c in NUMBERS]
                for part in parts:
                    with open(part, encoding="utf-8", newline="") as src:
                        for row in csv.reader(src, delimiter=self.delimiter):
                            for at in numeric:  # numbers in the sheet; cells starting = + - @ were neutralised
                                row[at] = float(row[at]) if row[at] else None
                            sheet.append(row)
                book.save(tmp)
        else:  # CSV / TSV in the output's encoding (a BOM first for utf-8-sig), JSON Lines: the parts as they are
            def write(tmp: str) -> None:
                with open(tmp, "wb") as dst:
                    if self.fmt == "csv":
                        header = io.StringIO()
                        TableWriter(header, self.delimiter, raw=self.raw).writerow(self.header())
                        dst.write(header.getvalue().encode(self.encoding))  # utf-8-sig: the BOM, then the header
                    for part in parts:
                        with open(part, "rb") as src:
                            shutil.copyfileobj(src, dst, 1 << 20)

        replace_atomic(self.out, write)


def _number(v: Any) -> float | None:
    return None if v is None or v == "" else float(v)


def _text(v: Any) -> str:
    return "" if v is None else v if isinstance(v, str) else str(v)


def parts_dir(out: Path, job_id: int) -> Path:
    return out.parent / f".{out.name}.job{job_id}.parts"


def part_name(seq: int, fmt: str) -> str:
    return f"part-{seq:06d}.{fmt if fmt in ('parquet', 'jsonl') else 'csv'}"
