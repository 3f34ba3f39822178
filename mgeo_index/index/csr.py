"""The compressed sparse rows the n-gram index keeps (:mod:`mgeo_index.index.sparse`), in NumPy alone.

Only what that index does with its matrix, with the arithmetic it always had: float32 products summed one after
another in a row's stored order (a CSR matrix-vector product), rows scaled to unit length with their squares
summed by ``np.add.reduceat``, a scaled row stored last column first. The same texts give the same bytes on disk
and the same scores to the last bit as when SciPy computed them (tested against SciPy where it is installed).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_INT32_MAX = np.iinfo(np.int32).max


def index_dtype(*sizes: int) -> type:
    """int32 where every index and count fits in it (SciPy's choice, so files keep their dtypes), else int64."""
    return np.int32 if max(sizes, default=0) <= _INT32_MAX else np.int64


@dataclass
class Csr:
    """Rows ``indptr[i]:indptr[i + 1]`` of ``indices`` (columns) and ``data`` (values), ``shape`` (rows, columns)."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def from_rows(cls, rows: np.ndarray, columns: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> Csr:
        """The matrix of (row, column, value) triples given in row order, each row's columns put in ascending order
        (no (row, column) twice). Sorted a block of rows at a time: a catalog's matrix is not copied whole."""
        dtype = index_dtype(len(values), *shape)
        indptr = np.zeros(shape[0] + 1, dtype=dtype)
        np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
        data, indices = np.empty(len(values), dtype=np.asarray(values).dtype), np.empty(len(values), dtype=dtype)
        for lo, hi, first, last in _row_blocks(indptr):
            block = rows[lo:hi]
            if len(block) and (block[0] < first or block[-1] >= last or (np.diff(block) < 0).any()):
                raise ValueError("Csr.from_rows: the triples are not in row order")  # each block holds its rows only
            order = np.lexsort((columns[lo:hi], block)) + lo
            data[lo:hi], indices[lo:hi] = values[order], columns[order]
        return cls(data, indices, indptr, tuple(shape))

    @property
    def nnz(self) -> int:
        return len(self.data)

    def lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(columns, values) of row ``i``, in stored order."""
        span = slice(self.indptr[i], self.indptr[i + 1])
        return self.indices[span], self.data[span]

    def _counts(self, rows: np.ndarray) -> np.ndarray:
        """How many values each of ``rows`` stores (without a pass over the whole matrix)."""
        return (self.indptr[rows + 1] - self.indptr[rows]).astype(np.int64)

    def _positions(self, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Positions in ``data`` of the stored values of ``rows`` (``counts`` of them each), row after row, each in
        stored order."""
        dtype = index_dtype(self.nnz)
        return np.repeat(self.indptr[rows].astype(dtype), counts) + _offsets(counts, dtype)

    def take_rows(self, rows: np.ndarray) -> Csr:
        """The matrix of ``rows`` (indices or a boolean mask), in that order."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=np.int64)
        counts = self._counts(rows)
        at = self._positions(rows, counts)
        indptr = np.zeros(len(rows) + 1, dtype=index_dtype(len(at), *self.shape))
        np.cumsum(counts, out=indptr[1:])
        return Csr(self.data[at], self.indices[at], indptr, (len(rows), self.shape[1]))

    def with_columns(self, columns: int) -> Csr:
        return Csr(self.data, self.indices, self.indptr, (self.shape[0], columns))

    def dot_rows(self, rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
        """``self[rows] @ vector`` in float32, each row's products summed one after another in stored order.

        A column the vector does not have adds nothing to a row's sum (a product of 0 leaves a sum of positive terms
        as it is), so only the columns it has are read and summed: a query shares a few dozen of the columns an
        entry stores."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return np.zeros(0, dtype=self.data.dtype)
        counts = self._counts(rows)
        at = self._positions(rows, counts)
        columns = np.take(self.indices, at, mode="clip")  # "clip": no bounds checks; positions are in range
        shared = np.take(vector != 0, columns, mode="clip")  # a table of bytes stays in cache, one of floats less
        kept = np.flatnonzero(shared)
        products = np.take(self.data, at[kept]) * vector[columns[kept]]
        # the row of each value kept, from where the rows end (a few thousand values, not the rows' whole length)
        row_of = np.searchsorted(np.cumsum(counts), kept, side="right")
        return sequential_sums(products, np.bincount(row_of, minlength=len(rows)))

    def transposed(self) -> Csr:
        """The transpose as rows (each column's entries, rows ascending). A block of rows at a time, each block's
        values placed after the earlier blocks' in their columns: no copy of the whole matrix besides the result."""
        dtype = index_dtype(self.nnz, *self.shape)
        indptr = np.zeros(self.shape[1] + 1, dtype=dtype)
        np.cumsum(np.bincount(self.indices, minlength=self.shape[1]), out=indptr[1:])
        data, indices = np.empty_like(self.data), np.empty(self.nnz, dtype=dtype)
        free = indptr[:-1].astype(np.int64)  # per column, where its next value goes
        for lo, hi, first, last in _row_blocks(self.indptr):
            if hi == lo:
                continue
            columns = self.indices[lo:hi]
            order = np.argsort(columns, kind="stable")
            by_column = columns[order]
            starts = np.flatnonzero(np.r_[True, by_column[1:] != by_column[:-1]])  # each column's run in the block
            runs = np.diff(np.r_[starts, len(order)])
            at = free[by_column] + _offsets(runs)
            rows = np.repeat(np.arange(first, last, dtype=dtype), np.diff(self.indptr[first : last + 1]))
            data[at], indices[at] = self.data[lo:hi][order], rows[order]
            free[by_column[starts]] += runs  # the block's columns, each once
        return Csr(data, indices, indptr, (self.shape[1], self.shape[0]))

    def unit_rows(self) -> Csr:
        """Each row divided by its L2 norm (a norm under 1e-12 counts as 1e-12; squares summed by
        ``np.add.reduceat`` in stored order), stored last column first: a diagonal matrix times this one, as a
        sparse product writes it. A block of rows at a time."""
        data, indices = np.empty(self.nnz, dtype=np.float32), np.empty_like(self.indices)
        for lo, hi, first, last in _row_blocks(self.indptr):
            starts = self.indptr[first:last].astype(np.int64) - lo
            counts = np.diff(self.indptr[first : last + 1]).astype(np.int64)
            values = self.data[lo:hi]
            norms = np.zeros(last - first, dtype=values.dtype)
            filled = np.flatnonzero(counts)
            if len(filled):
                norms[filled] = np.add.reduceat(values * values, starts[filled])
            scale = 1.0 / np.maximum(np.sqrt(norms), 1e-12)
            backwards = np.repeat(starts + counts - 1, counts) - _offsets(counts)  # each row's values last first
            data[lo:hi] = np.repeat(scale, counts) * values[backwards]
            indices[lo:hi] = self.indices[lo:hi][backwards]
        return Csr(data, indices, self.indptr.copy(), self.shape)

    def dense(self) -> np.ndarray:
        """The whole matrix as a dense array (small matrices: tests)."""
        out = np.zeros(self.shape, dtype=self.data.dtype)
        out[np.repeat(np.arange(self.shape[0]), self.lengths()), self.indices] = self.data
        return out


def _offsets(counts: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """Each value's place in its run, runs of ``counts`` values one after another: 0 … counts[i] - 1 for each i."""
    return np.arange(int(counts.sum()), dtype=dtype) - np.repeat((np.cumsum(counts) - counts).astype(dtype), counts)


BLOCK = 1 << 20  # stored values a block of rows holds, about (a row is never split)


def _row_blocks(indptr: np.ndarray):
    """(first value, end value, first row, end row) of consecutive blocks of whole rows, about :data:`BLOCK` values
    each."""
    rows = len(indptr) - 1
    first = 0
    while first < rows:
        last = int(np.searchsorted(indptr, indptr[first] + BLOCK, side="right")) - 1
        last = min(max(last, first + 1), rows)
        yield int(indptr[first]), int(indptr[last]), first, last
        first = last


def stack(top: Csr, bottom: Csr) -> Csr:
    """``top``'s rows, then ``bottom``'s (the same columns)."""
    dtype = index_dtype(top.nnz + bottom.nnz, top.shape[0] + bottom.shape[0], top.shape[1])
    indptr = np.concatenate([top.indptr.astype(dtype), (bottom.indptr[1:] + top.nnz).astype(dtype)])
    return Csr(np.concatenate([top.data, bottom.data]).astype(np.float32),
               np.concatenate([top.indices, bottom.indices]).astype(dtype), indptr,
               (top.shape[0] + bottom.shape[0], top.shape[1]))


def sequential_sums(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per segment (``counts`` values each, one after another), its values summed left to right in their dtype:
    a CSR matrix-vector product's order, which ``np.add.reduceat`` (pairwise) does not keep."""
    out = np.zeros(len(counts), dtype=values.dtype)
    if not len(values):
        return out
    order = np.argsort(-counts, kind="stable")  # longest first: the rows still summing are a prefix
    starts = (np.cumsum(counts) - counts)[order]
    longer = -np.sort(-counts)
    still = np.searchsorted(-longer, -np.arange(int(longer[0])), side="left")  # per j: the rows with more than j values
    acc = np.zeros(len(counts), dtype=values.dtype)
    for j, n in enumerate(still.tolist()):
        acc[:n] += values[starts[:n] + j]
    out[order] = acc
    return out
