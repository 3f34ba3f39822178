"""The n-gram index's sparse rows in NumPy (mgeo_index.index.csr): the same values, order and float32 arithmetic
as SciPy's CSR operations they replace, so built files and search scores stay the same to the last bit."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgeo_index.index import sparse
from mgeo_index.index.csr import Csr, sequential_sums, stack

triples = st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, 15),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 14), st.floats(0.125, 50, width=32)), max_size=60)))


def _matrix(case) -> tuple[Csr, np.ndarray]:
    n, columns, cells = case
    unique = dict(sorted({(r, c % columns): v for r, c, v in cells}.items(), key=lambda cell: cell[0][0]))  # row order
    rows = np.array([r for r, _ in unique], dtype=np.int64)
    cols = np.array([c for _, c in unique], dtype=np.int64)
    values = np.array(list(unique.values()), dtype=np.float32)
    dense = np.zeros((n, columns), dtype=np.float32)
    dense[rows, cols] = values
    return Csr.from_rows(rows, cols, values, (n, columns)), dense


@settings(max_examples=80, deadline=None)
@given(case=triples, picks=st.lists(st.integers(0, 11), max_size=8))
def test_rows_transpose_stack_and_dense_agree(case, picks):
    m, dense = _matrix(case)
    assert np.array_equal(m.dense(), dense)
    assert all((np.diff(m.row(i)[0]) > 0).all() for i in range(m.shape[0]))  # columns ascending within a row
    rows = np.array([p % m.shape[0] for p in picks], dtype=np.int64)
    assert np.array_equal(m.take_rows(rows).dense(), dense[rows])
    assert np.array_equal(m.take_rows(np.arange(m.shape[0]) % 2 == 0).dense(), dense[::2])
    t = m.transposed()
    assert np.array_equal(t.dense(), dense.T)
    assert all((np.diff(t.row(c)[0]) > 0).all() for c in range(t.shape[0]))
    assert np.array_equal(stack(m, m).dense(), np.vstack([dense, dense]))


def test_triples_out_of_row_order_are_refused_and_big_matrices_go_in_blocks(monkeypatch):
    from mgeo_index.index import csr

    with pytest.raises(ValueError, match="row order"):
        Csr.from_rows(np.array([1, 0]), np.array([0, 1]), np.array([1.0, 2.0], dtype=np.float32), (2, 2))
    monkeypatch.setattr(csr, "BLOCK", 1)  # out of order across blocks, each block in order by itself: refused too
    with pytest.raises(ValueError, match="row order"):
        Csr.from_rows(np.array([1, 0]), np.array([0, 1]), np.array([1.0, 2.0], dtype=np.float32), (2, 2))
    monkeypatch.setattr(csr, "BLOCK", 3)  # a block of rows every ~3 values: the same matrix as in one block
    rng = np.random.default_rng(4)
    dense = (rng.random((30, 9)) < 0.4) * rng.random((30, 9)).astype(np.float32)
    rows, cols = np.nonzero(dense)
    shuffled = np.concatenate([rng.permutation(np.flatnonzero(rows == r)) for r in range(30)])  # within rows only
    m = Csr.from_rows(rows[shuffled], cols[shuffled], dense[rows, cols][shuffled].astype(np.float32), (30, 9))
    assert np.array_equal(m.dense(), dense)
    monkeypatch.setattr(csr, "BLOCK", 1 << 20)
    whole = m.unit_rows()
    monkeypatch.setattr(csr, "BLOCK", 3)
    blocked = m.unit_rows()
    assert np.array_equal(blocked.data, whole.data) and np.array_equal(blocked.indices, whole.indices)
    t = m.transposed()  # in blocks of rows, each column's rows still ascending
    assert np.array_equal(t.dense(), dense.T)
    assert all((np.diff(t.row(c)[0]) > 0).all() for c in range(9))


@settings(max_examples=80, deadline=None)
@given(case=triples)
def test_unit_rows_store_each_row_last_column_first_at_unit_length(case):
    m, dense = _matrix(case)
    unit = m.unit_rows()
    norms = np.linalg.norm(dense.astype(np.float64), axis=1)
    expected = dense / np.maximum(norms, 1e-12)[:, None]
    np.testing.assert_allclose(unit.dense(), expected, rtol=1e-6)
    assert all((np.diff(unit.row(i)[0]) < 0).all() for i in range(m.shape[0]))


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.floats(0.0625, 1000, width=32), max_size=80), cuts=st.lists(st.integers(0, 80), max_size=6))
def test_sequential_sums_add_left_to_right_in_float32(values, cuts):
    values = np.asarray(values, dtype=np.float32)
    bounds = sorted({0, len(values), *[c for c in cuts if c <= len(values)]})
    counts = np.diff(bounds)
    expected = []
    for a, b in zip(bounds, bounds[1:]):
        total = np.float32(0)
        for v in values[a:b]:
            total = np.float32(total + v)
        expected.append(total)
    assert sequential_sums(values, counts).tolist() == expected


def test_the_same_bits_as_scipy():
    """What SciPy computed (the CSR arithmetic the index had): the built matrix's values, columns and dtypes, the
    cosines of a pruned and of a full search, to the last bit."""
    scipy_sparse = pytest.importorskip("scipy.sparse")
    texts = [f"浙江省杭州市西湖区文{i % 7}路{i}号{'大厦' * (i % 3)}" for i in range(80)] + ["浙江省杭州市上城区解放路1号", ""]
    index = sparse.build_sparse(texts, list(range(len(texts))))
    raw = scipy_sparse.csr_matrix((index.matrix.data, index.matrix.indices, index.matrix.indptr), shape=index.matrix.shape)
    assert index.matrix.indices.dtype == np.int32 and index.matrix.indptr.dtype == np.int32
    # SciPy's own normalization of the unnormalized rows gives the stored bits and order
    counts = [sparse.ngrams(t) for t in texts]
    rows_ = np.array([r for r, c in enumerate(counts) for _ in c], dtype=np.int32)
    cols_ = np.array([index.vocabulary[g] for c in counts for g in c], dtype=np.int32)
    tfs = np.array([1.0 + np.log(tf) for c in counts for tf in c.values()], dtype=np.float32)  # as build_sparse
    m = scipy_sparse.csr_matrix((tfs * index.idf[cols_], (rows_, cols_)), shape=(len(texts), len(index.idf)))
    norms = np.sqrt(np.asarray(m.multiply(m).sum(1)).ravel())
    expected = scipy_sparse.diags(1.0 / np.maximum(norms, 1e-12)).dot(m).tocsr().astype(np.float32)
    assert np.array_equal(expected.data, raw.data) and np.array_equal(expected.indices, raw.indices)
    assert np.array_equal(expected.indptr, raw.indptr)
    index._prepare()
    for query in ["杭州西湖文3路17号大厦", "浙江省杭州市", "上城解放路1号"]:
        q = index._vectorize([query])
        qs = scipy_sparse.csr_matrix((q.data, q.indices, q.indptr), shape=q.shape)
        full = qs.dot(raw.T.tocsr()).tocsr()
        entries, cosines = index._every_sharing(*q.row(0))
        assert entries.tolist() == full.indices.tolist() and cosines.tolist() == full.data.tolist()
        vector = np.zeros(len(index.idf), dtype=np.float32)
        vector[q.indices] = q.data
        rows = np.arange(0, len(texts), 3)
        assert index.matrix.dot_rows(rows, vector).tolist() == (raw[rows] @ vector).tolist()
