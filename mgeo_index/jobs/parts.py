"""A normalize job's output: one *part file* per chunk, each written atomically
(:func:`mgeo_index.files.replace_atomic`: aside, fsynced, renamed) before it is recorded as a
checkpoint, and the parts merged into the output file (atomically too) when every record is done."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mgeo_index.files import replace_atomic
from mgeo_index.tables import TableWriter
from mgeo_index.jobs.inputs import Chunk, as_text, require_pyarrow
from mgeo_index.jobs.policy import result_columns

RESULT_PREFIX = "mgeo_"  # added to the result columns when the input already has a column of that name


class PartWriter:
    """Writes one chunk's output rows as a part file and merges parts into the output."""

    def __init__(self, fmt: str, out: Path, input_columns: list[str], *, raw: bool = False,
                 columns: tuple[str, ...] = result_columns()) -> None:
        self.fmt, self.out, self.raw = fmt, out, raw  # raw: CSV cells as they are (formulas not neutralised)
        self.input_columns = input_columns
        self.columns = columns  # the result fields written, in order (jobs.policy.result_columns)
        prefix = RESULT_PREFIX if set(self.columns) & set(input_columns) else ""
        self.result_columns = [prefix + c for c in self.columns]
        self.delimiter = "\t" if out.suffix.lower() in (".tsv", ".tab") else ","
        if fmt == "parquet":
            require_pyarrow()

    def header(self) -> list[str]:
        return self.input_columns + self.result_columns

    def write_part(self, path: Path, chunk: Chunk, results: list[dict]) -> int:
        """Write the part (atomically); its size in bytes."""
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            table = self._parquet_table(chunk, results)

            def write(tmp: str) -> None:
                pq.write_table(table, tmp)
        else:
            def write(tmp: str) -> None:
                with open(tmp, "w", encoding="utf-8", newline="") as fh:
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
            if c == "probability":
                arrays.append(pa.array(values, type=pa.float64()))
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
        else:
            def write(tmp: str) -> None:
                with open(tmp, "w", encoding="utf-8", newline="") as dst:
                    TableWriter(dst, self.delimiter, raw=self.raw).writerow(self.header())
                    dst.flush()
                    for part in parts:
                        with open(part, encoding="utf-8", newline="") as src:
                            shutil.copyfileobj(src, dst, 1 << 20)

        replace_atomic(self.out, write)


def _text(v: Any) -> str:
    return "" if v is None else v if isinstance(v, str) else str(v)


def parts_dir(out: Path, job_id: int) -> Path:
    return out.parent / f".{out.name}.job{job_id}.parts"


def part_name(seq: int, fmt: str) -> str:
    return f"part-{seq:06d}.{'parquet' if fmt == 'parquet' else 'csv'}"
