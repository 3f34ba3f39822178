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
        """The matrix of (row, column, value) triples, each row's columns in ascending order (no (row, column)
        twice)."""
        order = np.lexsort((columns, rows))
        dtype = index_dtype(len(values), *shape)
        indptr = np.zeros(shape[0] + 1, dtype=dtype)
        np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
        return cls(np.asarray(values)[order], np.asarray(columns, dtype=dtype)[order], indptr, tuple(shape))

    @property
    def nnz(self) -> int:
        return len(self.data)

    def lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(columns, values) of row ``i``, in stored order."""
        span = slice(self.indptr[i], self.indptr[i + 1])
        return self.indices[span], self.data[span]

    def _positions(self, rows: np.ndarray) -> np.ndarray:
        """Positions in ``data`` of the stored values of ``rows``, row after row, each in stored order."""
        counts = self.lengths()[rows]
        starts = np.repeat(self.indptr[rows].astype(np.int64) - np.cumsum(counts) + counts, counts)
        return starts + np.arange(int(counts.sum()), dtype=np.int64)

    def take_rows(self, rows: np.ndarray) -> Csr:
        """The matrix of ``rows`` (indices or a boolean mask), in that order."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=np.int64)
        counts = self.lengths()[rows]
        at = self._positions(rows)
        indptr = np.zeros(len(rows) + 1, dtype=index_dtype(len(at), *self.shape))
        np.cumsum(counts, out=indptr[1:])
        return Csr(self.data[at], self.indices[at], indptr, (len(rows), self.shape[1]))

    def with_columns(self, columns: int) -> Csr:
        return Csr(self.data, self.indices, self.indptr, (self.shape[0], columns))

    def dot_rows(self, rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
        """``self[rows] @ vector`` in float32, each row's products summed one after another in stored order."""
        at = self._positions(rows)
        products = self.data[at] * vector[self.indices[at]]
        # a zero product leaves a sum of positive terms as it is: only the columns the vector has are summed
        shared = products != 0
        counts = np.bincount(np.repeat(np.arange(len(rows)), self.lengths()[rows])[shared], minlength=len(rows))
        return sequential_sums(products[shared], counts)

    def transposed(self) -> Csr:
        """The transpose as rows (each column's entries, rows ascending)."""
        rows = np.repeat(np.arange(self.shape[0], dtype=np.int64), self.lengths())
        order = np.argsort(self.indices, kind="stable")
        dtype = index_dtype(self.nnz, *self.shape)
        indptr = np.zeros(self.shape[1] + 1, dtype=dtype)
        np.cumsum(np.bincount(self.indices, minlength=self.shape[1]), out=indptr[1:])
        return Csr(self.data[order], rows[order].astype(dtype), indptr, (self.shape[1], self.shape[0]))

    def unit_rows(self) -> Csr:
        """Each row divided by its L2 norm (a norm under 1e-12 counts as 1e-12), stored last column first: a
        diagonal matrix times this one, as a sparse product writes it."""
        squares = self.data * self.data
        norms = np.zeros(self.shape[0], dtype=squares.dtype)
        filled = np.flatnonzero(self.lengths())
        if len(filled):
            norms[filled] = np.add.reduceat(squares, self.indptr[filled])
        scale = 1.0 / np.maximum(np.sqrt(norms), 1e-12)
        reversed_at = self._reversed_positions()
        counts = self.lengths()
        data = np.repeat(scale, counts) * self.data[reversed_at]
        return Csr(data.astype(np.float32), self.indices[reversed_at], self.indptr.copy(), self.shape)

    def _reversed_positions(self) -> np.ndarray:
        counts = self.lengths().astype(np.int64)
        ends = np.repeat(self.indptr[1:].astype(np.int64), counts)
        within = np.arange(self.nnz, dtype=np.int64) - np.repeat(self.indptr[:-1].astype(np.int64), counts)
        return ends - 1 - within

    def dense(self) -> np.ndarray:
        """The whole matrix as a dense array (small matrices: tests)."""
        out = np.zeros(self.shape, dtype=self.data.dtype)
        out[np.repeat(np.arange(self.shape[0]), self.lengths()), self.indices] = self.data
        return out


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
