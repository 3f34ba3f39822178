"""FAISS index management: ids, training errors, search, GPU no-op and atomic saves."""
from __future__ import annotations

import os
from pathlib import Path

import faiss
import numpy as np
import pytest

from mgeo_index.index import faiss_index as I

DIM = 32


def _unit_vectors(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _entry_ids(n: int) -> np.ndarray:
    return (1000 + 3 * np.arange(n)).astype(np.int64)  # non-contiguous entry ids


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    return _unit_vectors(2000), _entry_ids(2000)


@pytest.fixture(scope="module")
def flat(data: tuple[np.ndarray, np.ndarray]) -> faiss.Index:
    vectors, ids = data
    index = I.make_index(DIM, "Flat")
    I.add(index, vectors, ids)
    return index


def test_flat_returns_entry_ids(flat: faiss.Index, data: tuple[np.ndarray, np.ndarray]) -> None:
    vectors, ids = data
    assert np.array_equal(I.index_ids(flat), ids)
    scores, found = I.search(flat, vectors[:50], k=5)
    assert scores.dtype == np.float32 and found.dtype == np.int64
    assert scores.shape == found.shape == (50, 5)
    # Each vector's nearest neighbour (inner product = cosine) is itself.
    assert np.array_equal(found[:, 0], ids[:50])
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    assert np.isin(found, ids).all()
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first


def test_a_batch_finds_what_each_query_finds_alone_on_either_scan(flat: faiss.Index) -> None:
    """From BLAS_MIN_QUERIES queries a call FAISS scores through BLAS, below it query by query: the same ids in the
    same order, scores within a few ulps."""
    queries = _unit_vectors(40, seed=7)
    scores, found = I.search(flat, queries, k=20)
    assert faiss.cvar.distance_compute_blas_threshold == I.BLAS_MIN_QUERIES * DIM
    for size in (1, I.BLAS_MIN_QUERIES - 1, I.BLAS_MIN_QUERIES):
        for start in range(0, 40, size):
            part_scores, part = I.search(flat, queries[start : start + size], k=20)
            assert np.array_equal(part, found[start : start + size])
            np.testing.assert_allclose(part_scores, scores[start : start + size], rtol=0, atol=1e-6)


def test_a_search_of_a_few_queries_runs_on_one_openmp_thread_and_restores_the_count(flat: faiss.Index) -> None:
    """Below BLAS_MIN_QUERIES FAISS scans query by query: its other OpenMP threads would only wake and then spin on
    the cores torch's threads need next. This thread's count comes back as it was; batches keep every thread."""

    class Recording:  # the index, recording FAISS's thread count while it searches
        def __init__(self, index):
            self.index, self.d, self.ntotal, self.threads = index, index.d, index.ntotal, []

        def search(self, x, k):
            self.threads.append(faiss.omp_get_max_threads())
            return self.index.search(x, k)

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        recording = Recording(flat)
        queries = _unit_vectors(I.BLAS_MIN_QUERIES, seed=3)
        alone = I.search(recording, queries[:1], k=5)
        batch = I.search(recording, queries, k=5)
        assert recording.threads == [1, 2] and faiss.omp_get_max_threads() == 2
        assert np.array_equal(alone[1], batch[1][:1])
    finally:
        faiss.omp_set_num_threads(before)


def test_make_index_wraps_in_idmap2_once() -> None:
    assert isinstance(I.make_index(DIM, "Flat"), faiss.IndexIDMap2)
    wrapped = I.make_index(DIM, "IDMap2,Flat")
    assert isinstance(wrapped, faiss.IndexIDMap2)
    assert not isinstance(faiss.downcast_index(wrapped.index), faiss.IndexIDMap)
    assert I.make_index(DIM, "Flat", metric="l2").metric_type == faiss.METRIC_L2


def test_save_atomic_load_round_trip(tmp_path: Path, flat: faiss.Index, data: tuple[np.ndarray, np.ndarray]) -> None:
    vectors, ids = data
    path = tmp_path / "sub" / "catalog.faiss"  # missing directories are created
    I.save_atomic(flat, path)
    assert sorted(os.listdir(path.parent)) == ["catalog.faiss"]  # no temp file left
    loaded = I.load(path)
    assert loaded.ntotal == flat.ntotal
    assert np.array_equal(I.index_ids(loaded), ids)
    queries = _unit_vectors(20, seed=1)
    s0, i0 = I.search(flat, queries, k=10)
    s1, i1 = I.search(loaded, queries, k=10)
    assert np.array_equal(i0, i1)
    assert np.array_equal(s0, s1)


@pytest.mark.parametrize("factory", ["Flat", "IVF16,SQ8", "IVF16,PQ8"])
def test_a_memory_mapped_index_searches_alike(tmp_path: Path, factory: str,
                                                                 data: tuple[np.ndarray, np.ndarray]) -> None:
    vectors, ids = data
    index = I.make_index(DIM, factory)
    if I.needs_training(index):
        index.train(vectors)
    I.add(index, vectors, ids)
    I.save_atomic(index, tmp_path / "g.faiss")
    mapped = I.load(tmp_path / "g.faiss", mmap=True)
    queries = _unit_vectors(20, seed=2)
    for one in (index, mapped):
        I.set_search_params(one, nprobe=4)
    assert mapped.ntotal == index.ntotal and np.array_equal(I.index_ids(mapped), ids)
    s0, i0 = I.search(index, queries, k=10)
    s1, i1 = I.search(mapped, queries, k=10)
    assert np.array_equal(i0, i1) and np.array_equal(s0, s1)
    if factory.startswith("IVF"):  # its lists are read-only views of the file (never written to: see index.load)
        assert not isinstance(faiss.extract_index_ivf(mapped).invlists, faiss.ArrayInvertedLists)


def test_save_atomic_failure_keeps_old_file(
    tmp_path: Path, flat: faiss.Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.faiss"
    old = I.make_index(DIM, "Flat")
    I.add(old, _unit_vectors(3, seed=2), np.array([7, 8, 9]))
    I.save_atomic(old, path)
    before = path.read_bytes()

    def partial_write(index: faiss.Index, filename: str) -> None:
        with open(filename, "wb") as fh:  # half a file, then a crash
            fh.write(b"partial index bytes")
        raise OSError("disk full")

    monkeypatch.setattr(faiss, "write_index", partial_write)
    with pytest.raises(OSError, match="disk full"):
        I.save_atomic(flat, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["catalog.faiss"]
    monkeypatch.undo()
    assert np.array_equal(I.index_ids(I.load(path)), [7, 8, 9])

    # A successful save replaces the file in one step.
    I.save_atomic(flat, path)
    assert I.load(path).ntotal == flat.ntotal
    assert os.listdir(tmp_path) == ["catalog.faiss"]


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        I.load(tmp_path / "nope.faiss")


def test_hnsw_recall(flat: faiss.Index, data: tuple[np.ndarray, np.ndarray]) -> None:
    vectors, ids = data
    hnsw = I.make_index(DIM, "HNSW32")
    assert not I.needs_training(hnsw)
    I.add(hnsw, vectors, ids)
    assert I.describe(hnsw)["ef_search"] == I.DEFAULT_EF_SEARCH
    queries = _unit_vectors(100, seed=3)
    _, truth = I.search(flat, queries, k=10)
    _, found = I.search(hnsw, queries, k=10)
    recall = np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, found)])
    assert recall >= 0.9, recall


def test_ivf_trains_and_full_nprobe_is_exact(flat: faiss.Index, data: tuple[np.ndarray, np.ndarray]) -> None:
    vectors, ids = data
    ivf = I.make_index(DIM, "IVF8,Flat")
    assert I.needs_training(ivf)
    assert I.min_training_vectors(ivf) == 8
    I.add(ivf, vectors, ids)
    assert not I.needs_training(ivf)
    assert I.describe(ivf)["nprobe"] == 8  # default 16 clamped to nlist
    I.set_search_params(ivf, nprobe=2)
    assert I.describe(ivf)["nprobe"] == 2
    I.set_search_params(ivf, nprobe=8)  # all lists probed: same answers as Flat
    queries = _unit_vectors(20, seed=4)
    assert np.array_equal(I.search(ivf, queries, 5)[1], I.search(flat, queries, 5)[1])


def test_ivf_too_few_training_vectors() -> None:
    index = I.make_index(DIM, "IVF256,Flat")
    with pytest.raises(ValueError) as err:
        I.add(index, _unit_vectors(100), _entry_ids(100))
    message = str(err.value)
    assert "'IVF256,Flat'" in message and "256" in message and "100" in message
    assert "smaller nlist" in message and "IVF2,Flat" in message
    assert index.ntotal == 0


def test_pq_too_few_training_vectors() -> None:
    with pytest.raises(ValueError, match=r"'PQ8'.*at least 256.*PQ8x4"):
        I.add(I.make_index(DIM, "PQ8"), _unit_vectors(100), _entry_ids(100))


@pytest.mark.parametrize("factory", ["Bogus", "IVF,Flat", "HNSWx"])
def test_invalid_factory_string(factory: str) -> None:
    with pytest.raises(ValueError) as err:
        I.make_index(DIM, factory)
    assert repr(factory) in str(err.value)
    assert "IVF4096,Flat" in str(err.value)  # lists valid examples


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="metric"):
        I.make_index(DIM, "Flat", metric="cosine")
    with pytest.raises(ValueError, match="dim"):
        I.make_index(0)
    with pytest.raises(ValueError, match="multiple of the number of subquantizers"):
        I.make_index(30, "PQ8")
    index = I.make_index(DIM)
    with pytest.raises(ValueError, match="shape"):
        I.add(index, _unit_vectors(3, dim=DIM + 1), np.arange(3))
    with pytest.raises(ValueError, match="ids must have shape"):
        I.add(index, _unit_vectors(3), np.arange(4))
    with pytest.raises(ValueError, match="duplicates"):
        I.add(index, _unit_vectors(3), np.array([1, 1, 2]))
    I.add(index, _unit_vectors(3), np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="already in the index"):
        I.add(index, _unit_vectors(2, seed=9), np.array([3, 4]))
    with pytest.raises(ValueError, match="k must be"):
        I.search(index, _unit_vectors(1), 0)
    with pytest.raises(TypeError, match="id map"):
        I.index_ids(faiss.IndexFlatIP(DIM))


def test_k_larger_than_ntotal() -> None:
    index = I.make_index(DIM)
    small_ids = np.array([5, 50, 500], dtype=np.int64)
    I.add(index, _unit_vectors(3, seed=5), small_ids)
    scores, found = I.search(index, _unit_vectors(4, seed=6), k=10)
    assert scores.shape == found.shape == (4, 3)
    assert (found >= 0).all()
    assert all(sorted(row) == sorted(small_ids) for row in found)
    # A single 1-D query is one row.
    assert I.search(index, _unit_vectors(1, seed=7)[0], k=2)[1].shape == (1, 2)
    # An empty index has nothing to return.
    scores, found = I.search(I.make_index(DIM), _unit_vectors(2), k=5)
    assert scores.shape == found.shape == (2, 0)


def test_to_gpu_is_noop_without_gpu(flat: faiss.Index) -> None:
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("a GPU is visible")
    assert I.to_gpu(flat) is flat
    assert I.to_gpu(flat, ngpu=1) is flat
    assert I.to_cpu(flat) is flat
    assert not I.is_gpu_index(flat)


def test_describe(flat: faiss.Index) -> None:
    info = I.describe(flat)
    assert info["ntotal"] == 2000 and info["dim"] == DIM
    assert info["factory"] == "Flat" and info["is_trained"] is True
    assert info["metric"] == "ip" and info["on_gpu"] is False
    for factory in ("HNSW16", "IVF16,Flat", "IVF16_HNSW32,Flat", "IVF16,PQ4", "IVF16,SQfp16", "PQ4x4", "SQ8"):
        assert I.describe(I.make_index(DIM, factory))["factory"] == factory


def test_auto_chooses_flat_while_small_then_quantized_ivf():
    assert I.auto_factory(300, 256) == "Flat" and I.auto_factory(I.FLAT_MAX_ROWS, 256) == "Flat"
    assert I.auto_factory(1_000_000, 256) == "IVF4096,SQ8"  # 4·√n = 4000 lists → 4096
    assert I.auto_factory(50_000_000, 256) == "IVF32768,PQ32"
    for n in (300, 1_000_000, 50_000_000):  # every choice is a valid factory string
        I.make_index(256, I.auto_factory(n, 256))


def test_tune_nprobe_picks_the_smallest_probe_count_holding_the_recall():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(64, DIM)).astype(np.float32)
    x = centers[rng.integers(0, 64, 6000)] + 0.3 * rng.normal(size=(6000, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = I.make_index(DIM, "IVF64,SQ8")
    I.add(index, x, np.arange(10, 6010))  # ids need not be row numbers
    tuned = I.tune_nprobe(index, x, sample=200, target=0.95)
    assert tuned["recall"] >= 0.95 and tuned["queries"] == 200
    assert tuned["nprobe"] < 64  # fewer lists than all of them hold it
    if tuned["nprobe"] > I.NPROBES[0]:  # and the next smaller count did not
        fewer = I.tune_nprobe(index, x, sample=200, target=0.0)  # the smallest count, whatever its recall
        assert fewer["nprobe"] == I.NPROBES[0] and fewer["recall"] < 0.95
    exhaustive = I.tune_nprobe(index, x, sample=200, target=1.01)  # never reached: every count up to nlist
    assert exhaustive["nprobe"] == 64 and exhaustive["recall"] > tuned["recall"] - 1e-9
    # 64-bit, sparse ids (a national catalog's): the same choice, no table indexed by id
    big = I.make_index(DIM, "IVF64,SQ8")
    I.add(big, x, 2**40 + 7 * np.arange(6000))
    assert I.tune_nprobe(big, x, sample=200, target=0.95) == tuned
    assert I.tune_nprobe(I.make_index(DIM, "Flat"), x) == {}


def test_a_large_batch_trains_an_ivf_index_on_a_seeded_sample_of_it():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5000, DIM)).astype(np.float32)
    index = I.make_index(DIM, "IVF16,SQ8")
    sample = I.training_sample(index, x)
    assert len(sample) == I.TRAIN_POINTS_PER_LIST * 16 < len(x)
    np.testing.assert_array_equal(sample, I.training_sample(index, x))  # the same rows every time
    assert len({row.tobytes() for row in sample}) == len(sample)  # rows of x, none twice
    assert {row.tobytes() for row in sample} <= {row.tobytes() for row in x}
    small = x[:500]
    assert I.training_sample(index, small) is small  # no more than the sample size: all of it
    assert I.training_sample(I.make_index(DIM, "Flat"), x) is x  # nothing to train
    I.add(index, x, np.arange(5000))  # trains on the sample, then holds every vector
    assert index.is_trained and index.ntotal == 5000
    I.set_search_params(index, nprobe=16)  # every list probed: exact within SQ8's rounding
    _, found = I.search(index, x[:50], 1)
    assert (found[:, 0] == np.arange(50)).mean() >= 0.95
