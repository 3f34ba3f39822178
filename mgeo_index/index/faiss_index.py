"""FAISS index management: build, train/add, search, GPU moves and atomic persistence.

Every index made here is an ``IndexIDMap2`` around the structure named by a FAISS
factory string, so the ids FAISS returns are our own entry ids (any int64, not
necessarily contiguous) and the stored ids can be listed again (:func:`index_ids`).

Vectors are expected L2-normalized (see :mod:`mgeo_index.runtime.kernels`) and the default
metric is inner product, so scores are cosine similarities.

Typical use::

    idx = make_index(768, "IVF1024,Flat")
    add(idx, vectors, ids)              # trains first when needed
    save_atomic(idx, "catalog.faiss")
    idx = load("catalog.faiss", gpu=True)
    scores, found = search(idx, queries, k=10)
"""
from __future__ import annotations

import logging
import math
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Union

import faiss
import numpy as np

from mgeo_index import files

__all__ = [
    "AUTO",
    "DEFAULT_EF_SEARCH",
    "auto_factory",
    "tune_nprobe",
    "DEFAULT_NPROBE",
    "add",
    "describe",
    "faiss_builds",
    "index_ids",
    "is_gpu_index",
    "load",
    "make_index",
    "min_training_vectors",
    "needs_training",
    "remove",
    "save_atomic",
    "search",
    "set_search_params",
    "to_cpu",
    "to_gpu",
]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


def faiss_builds(paths: list[str] | None = None) -> list[str]:
    """The FAISS distributions installed on ``paths`` (``sys.path``), e.g. ``["faiss-cpu"]``: faiss-cpu and every
    faiss-gpu build install the same ``faiss`` module, so more than one means a broken mix (FAISS's maintainers:
    never install both). Read from the ``*.dist-info`` folder names, which costs no metadata parsing."""
    found: set[str] = set()
    for entry in sys.path if paths is None else paths:
        folder = Path(entry or ".")
        if folder.is_dir():
            for info in folder.glob("faiss*.dist-info"):
                found.add(info.name.split("-")[0].lower().replace("_", "-"))
    return sorted(found)


def faiss_clash(builds: list[str]) -> str | None:
    """The one line that says what to do when ``builds`` (:func:`faiss_builds`) hold more than one FAISS."""
    if len(builds) < 2:
        return None
    gpu = next((name for name in builds if name != "faiss-cpu"), builds[-1])
    return (f"{' and '.join(builds)} are installed together; they write the same 'faiss' module, so which one "
            f"runs is an accident of install order. Keep one: pip uninstall -y {' '.join(builds)} && "
            f"pip install {gpu} (GPU) or faiss-cpu (CPU)")


_CLASH = faiss_clash(faiss_builds())
if _CLASH:
    warnings.warn(_CLASH, RuntimeWarning, stacklevel=2)

#: Searches of at least this many queries go through BLAS (see :func:`search`).
BLAS_MIN_QUERIES = 8
#: Search-time defaults applied by :func:`make_index`.
DEFAULT_NPROBE = 16
DEFAULT_EF_SEARCH = 128

_METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
_METRIC_NAMES = {v: k for k, v in _METRICS.items()}
_FACTORY_EXAMPLES = "Flat, HNSW32, IVF4096,Flat, IVF4096,PQ32, IVF256,SQfp16"
# faiss prints a warning when it has fewer than this many points per centroid.
_POINTS_PER_CENTROID = 39
# training vectors kept per inverted list (of a larger batch: see training_sample)
TRAIN_POINTS_PER_LIST = 64


# --------------------------------------------------------------------------------------
# Structure helpers
# --------------------------------------------------------------------------------------


def _downcast(index: Any) -> Any:
    """The most derived Python class for a FAISS index pointer."""
    return faiss.downcast_index(index)


def _unwrap(index: Any) -> Any:
    """Strip ID-mapping wrappers: IndexIDMap/IndexIDMap2 -> the index they wrap."""
    index = _downcast(index)
    while isinstance(index, faiss.IndexIDMap):  # IndexIDMap2 is a subclass
        index = _downcast(index.index)
    return index


def _id_map_wrapper(index: Any) -> Any | None:
    """The IndexIDMap(2) holding our ids, looking through multi-GPU replicas."""
    index = _downcast(index)
    if isinstance(index, faiss.IndexIDMap):
        return index
    if isinstance(index, (faiss.IndexReplicas, faiss.IndexShards)) and index.count() > 0:
        return _id_map_wrapper(index.at(0))
    return None


def is_gpu_index(index: Any) -> bool:
    """Whether ``index`` (or an index it wraps) lives on a GPU."""
    index = _downcast(index)
    if type(index).__name__.startswith("Gpu"):
        return True
    if isinstance(index, (faiss.IndexReplicas, faiss.IndexShards)):
        return any(is_gpu_index(index.at(i)) for i in range(index.count()))
    inner = getattr(index, "index", None)  # IDMap, PreTransform, ...
    if isinstance(inner, faiss.Index):
        return is_gpu_index(inner)
    return False


def _ivf(index: Any) -> Any | None:
    """The (downcast) IVF index inside ``index``, or None."""
    try:
        ivf = faiss.extract_index_ivf(_unwrap(index))
    except (RuntimeError, AttributeError, TypeError):
        return None
    return _downcast(ivf) if ivf is not None else None


def _hnsw(index: Any) -> Any | None:
    """The HNSW graph object of an HNSW index, or None."""
    return getattr(_unwrap(index), "hnsw", None)


def _factory_string(index: Any) -> str | None:
    """The factory string of the structure inside the IDMap wrapper (FAISS's own
    ``contrib.factory_tools.reverse_index_factory``), or None for a structure it cannot name."""
    from faiss.contrib.factory_tools import reverse_index_factory

    index = to_cpu(index) if is_gpu_index(index) else index
    try:
        factory = str(reverse_index_factory(_unwrap(index)))
    except Exception:  # noqa: BLE001 - a structure the factory grammar has no name for
        return None
    return re.sub(r"(PQ\d+)x8\b", r"\1", factory)  # 8-bit codes are the default: PQ8, as users write it


def _faiss_reason(exc: BaseException) -> str:
    """The human part of a FAISS C++ exception ("Error in <fn> at <file>:<line>: ...")."""
    text = " ".join(str(exc).split())
    match = re.search(r"\bat \S+:\d+: (?:Error: '.*?' failed: )?(.*)$", text)
    return (match.group(1) if match else text) or "unknown FAISS error"


# --------------------------------------------------------------------------------------
# Building, training, adding
# --------------------------------------------------------------------------------------


def make_index(dim: int, factory: str = "Flat", metric: str = "ip") -> faiss.Index:
    """Build an empty index for ``dim``-dimensional vectors.

    Args:
        dim: vector dimension (> 0).
        factory: FAISS factory string, e.g. ``"Flat"``, ``"HNSW32"``, ``"IVF4096,Flat"``,
            ``"IVF4096,PQ32"``, ``"IVF256,SQfp16"``. An ``IDMap``/``IDMap2`` prefix is
            accepted; otherwise the result is wrapped in ``IndexIDMap2``.
        metric: ``"ip"`` (inner product; cosine on normalized vectors) or ``"l2"``.

    Raises:
        ValueError: bad dimension, metric or factory string.
    """
    if int(dim) != dim or dim <= 0:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    metric_key = str(metric).lower()
    if metric_key not in _METRICS:
        raise ValueError(f"metric must be one of {sorted(_METRICS)}, got {metric!r}")
    if not isinstance(factory, str) or not factory.strip():
        raise ValueError(f"invalid FAISS factory string {factory!r}; examples: {_FACTORY_EXAMPLES}")
    factory = factory.strip()
    try:
        base = faiss.index_factory(int(dim), factory, _METRICS[metric_key])
    except RuntimeError as exc:
        reason = _faiss_reason(exc)
        raise ValueError(
            f"invalid FAISS factory string {factory!r} for dim={dim}: {reason}. "
            f"Valid examples: {_FACTORY_EXAMPLES}"
        ) from exc
    index = base if isinstance(base, faiss.IndexIDMap) else faiss.IndexIDMap2(base)
    set_search_params(index, nprobe=DEFAULT_NPROBE, ef_search=DEFAULT_EF_SEARCH)
    return index


def needs_training(index: faiss.Index) -> bool:
    """True when the index must be trained before vectors can be added."""
    return not bool(index.is_trained)


def min_training_vectors(index: faiss.Index) -> int:
    """Fewest training vectors FAISS accepts for this (untrained) structure.

    IVF needs one point per list (``nlist``); product quantizers need ``2**nbits``
    points per sub-quantizer codebook. Returns 0 when no training is needed.
    """
    if not needs_training(index):
        return 0
    need = 1
    base = _unwrap(index)
    if isinstance(base, faiss.IndexPreTransform):
        for i in range(base.chain.size()):
            vt = base.chain.at(i)
            if isinstance(faiss.downcast_VectorTransform(vt), faiss.OPQMatrix):
                need = max(need, 256)  # OPQ trains an 8-bit PQ internally
        base = _downcast(base.index)
    ivf = _ivf(base)
    if ivf is not None:
        need = max(need, int(ivf.nlist))
        if isinstance(ivf, faiss.IndexIVFPQ):
            need = max(need, 1 << int(ivf.pq.nbits))
    elif isinstance(base, faiss.IndexPQ):
        need = max(need, 1 << int(base.pq.nbits))
    elif isinstance(base, faiss.IndexHNSW):
        storage = _downcast(base.storage)
        if isinstance(storage, faiss.IndexPQ):
            need = max(need, 1 << int(storage.pq.nbits))
    return need


def training_sample(index: faiss.Index, x: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """The rows of ``x`` to train ``index`` on: all of them up to ``TRAIN_POINTS_PER_LIST`` per inverted list
    (FAISS's k-means samples 256 per list itself, but an IVF with residual codes copies every training
    vector once more: 1 GiB at 10^6 × 256), else a seeded sample of that many, in their original order."""
    ivf = _ivf(index)
    if ivf is None:
        return x
    size = max(min_training_vectors(index), TRAIN_POINTS_PER_LIST * int(ivf.nlist))
    if len(x) <= size:
        return x
    rows = np.sort(np.random.default_rng(seed).choice(len(x), size=size, replace=False))
    return x[rows]


def _suggest_nlist(n: int) -> int:
    """Largest power of two <= min(4*sqrt(n), n/39), at least 1."""
    target = max(1.0, min(4.0 * math.sqrt(max(n, 1)), n / _POINTS_PER_CENTROID))
    return 1 << int(math.floor(math.log2(target)))


def _too_few_message(index: faiss.Index, n: int, need: int) -> str:
    factory = _factory_string(index) or type(_unwrap(index)).__name__
    msg = (
        f"index {factory!r} needs at least {need} training vectors, got {n}. "
    )
    ivf = _ivf(index)
    if ivf is not None and n < ivf.nlist:
        nlist = _suggest_nlist(n)
        smaller = re.sub(r"IVF\d+", f"IVF{nlist}", factory, count=1)
        msg += (
            f"IVF with nlist={ivf.nlist} needs one training vector per list; use a smaller nlist, "
            f"e.g. {smaller!r} (rule of thumb: nlist ~ 4*sqrt(n) with >= {_POINTS_PER_CENTROID} "
            "vectors per list), or use 'Flat'/'HNSW32' for small catalogs."
        )
    else:
        fewer_bits = re.sub(r"PQ(\d+)(x\d+)?", r"PQ\1x4", factory, count=1)
        hint = f"e.g. {fewer_bits!r}" if fewer_bits != factory else "e.g. 'PQ16x4'"
        msg += (
            "Product quantizers need 2**nbits training vectors per codebook (256 for the default "
            f"8-bit codes); add more data or use fewer bits, {hint}."
        )
    return msg


def add(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray) -> None:
    """Add ``vectors`` (n, d) under entry ``ids`` (n,), training first when needed.

    Training (for IVF/PQ factories) happens only while the index is untrained and
    uses the vectors of this call, so pass a representative batch the first time; of a
    large batch, a seeded sample of ``TRAIN_POINTS_PER_LIST`` vectors per inverted list
    (:func:`training_sample`).

    Raises:
        ValueError: shape/dtype mismatch, duplicate ids (within the batch or already
            stored), or too few vectors to train this structure.
    """
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != index.d:
        raise ValueError(f"vectors must have shape (n, {index.d}), got {np.shape(vectors)}")
    id_arr = np.ascontiguousarray(ids)
    if id_arr.ndim != 1 or id_arr.shape[0] != x.shape[0]:
        raise ValueError(f"ids must have shape ({x.shape[0]},), got {id_arr.shape}")
    if id_arr.size and not np.issubdtype(id_arr.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {id_arr.dtype}")
    id_arr = id_arr.astype(np.int64, copy=False)
    n = x.shape[0]
    if n == 0:
        return
    # IndexIDMap2 keeps an id -> position map; duplicates would make ids ambiguous.
    if np.unique(id_arr).size != n:
        raise ValueError("ids contain duplicates")
    if index.ntotal and _id_map_wrapper(index) is not None:
        clash = np.isin(id_arr, index_ids(index))
        if clash.any():
            raise ValueError(f"{int(clash.sum())} ids already in the index, e.g. {int(id_arr[clash][0])}")
    if needs_training(index):
        need = min_training_vectors(index)
        if n < need:
            raise ValueError(_too_few_message(index, n, need))
        try:
            index.train(training_sample(index, x))
        except RuntimeError as exc:
            if "training points" in str(exc) or "should be at least" in str(exc):
                raise ValueError(f"{_too_few_message(index, n, need)} (FAISS: {_faiss_reason(exc)})") from exc
            raise
    index.add_with_ids(x, id_arr)


def remove(index: faiss.Index, ids: np.ndarray) -> faiss.Index:
    """Drop the vectors of ``ids`` (ids not in the index are ignored); returns the index to use.

    Structures that support removal (Flat, IVF) are changed in place. Those that do not (HNSW) are
    rebuilt from their own stored vectors (``reconstruct``; nothing is re-embedded), so the returned
    index may be a new object.
    """
    drop = np.ascontiguousarray(ids, dtype=np.int64)
    if drop.size == 0:
        return index
    try:
        index.remove_ids(faiss.IDSelectorBatch(drop.size, faiss.swig_ptr(drop)))
        return index
    except RuntimeError:
        pass  # e.g. "not implemented for this type of index" (HNSW)
    cpu = to_cpu(index) if is_gpu_index(index) else index
    present = index_ids(cpu)  # in insertion order, the order of the wrapped index's own vectors
    keep = ~np.isin(present, drop)
    vectors = _unwrap(cpu).reconstruct_n(0, cpu.ntotal)[keep] if cpu.ntotal else np.empty((0, cpu.d), np.float32)
    kept = present[keep]
    factory = _factory_string(cpu) or "Flat"
    fresh = make_index(cpu.d, factory, metric=_METRIC_NAMES.get(int(cpu.metric_type), "ip"))
    add(fresh, vectors, kept)
    return fresh


def _ivf_parts(index: Any) -> list[Any]:
    """Every IVF-like part holding ``nprobe``: a CPU IndexIVF, a GPU IVF index, or one
    per replica/shard of a multi-GPU index."""
    base = _unwrap(index)
    if isinstance(base, (faiss.IndexReplicas, faiss.IndexShards)):
        return [part for i in range(base.count()) for part in _ivf_parts(base.at(i))]
    ivf = _ivf(base)
    if ivf is not None:
        return [ivf]
    if hasattr(base, "nprobe") and hasattr(base, "nlist"):  # GpuIndexIVF*
        return [base]
    return []


def set_search_params(
    index: faiss.Index, nprobe: int | None = None, ef_search: int | None = None
) -> None:
    """Set search-time knobs; ``None`` leaves a parameter unchanged.

    ``nprobe`` applies to IVF indexes (clamped to ``nlist``; CPU or GPU), ``ef_search``
    to HNSW graphs (including an HNSW coarse quantizer); parameters that do not apply
    to this structure are ignored. Both are persisted by :func:`save_atomic`.
    """
    if nprobe is not None and nprobe < 1:
        raise ValueError(f"nprobe must be >= 1, got {nprobe}")
    if ef_search is not None and ef_search < 1:
        raise ValueError(f"ef_search must be >= 1, got {ef_search}")
    ivf_parts = _ivf_parts(index)
    if nprobe is not None:
        for part in ivf_parts:
            part.nprobe = int(min(nprobe, part.nlist))
    if ef_search is not None:
        hnsw = _hnsw(index)
        if hnsw is not None:
            hnsw.efSearch = int(ef_search)
        for part in ivf_parts:
            quantizer = getattr(part, "quantizer", None)
            quantizer_hnsw = getattr(_downcast(quantizer), "hnsw", None) if quantizer is not None else None
            if quantizer_hnsw is not None:
                quantizer_hnsw.efSearch = int(ef_search)


# --------------------------------------------------------------------------------------
# Choosing a structure by catalog size ("auto")
# --------------------------------------------------------------------------------------

#: The factory string that lets :func:`auto_factory` choose by catalog size (the default of ``build``).
AUTO = "auto"
#: Up to this many vectors an exact Flat index (≈ 1 KB a 256-d row; a single query scans them all).
FLAT_MAX_ROWS = 200_000
#: Up to this many, an IVF index with 8-bit scalar-quantized vectors (a quarter of Flat's memory,
#: recall close to it); beyond, product-quantized codes (dim / 8 bytes a row).
SQ8_MAX_ROWS = 20_000_000
#: The recall@10 (relative to exact search) the IVF probe count is tuned to hold.
RECALL_TARGET = 0.98
NPROBES = (4, 8, 16, 32, 64, 128, 256)


def auto_factory(n_rows: int, dim: int) -> str:
    """The factory string ``auto`` builds for ``n_rows`` vectors of ``dim``: Flat while it is small, then
    ``IVF<nlist>,SQ8`` with about 4·√n lists (a power of two), then ``IVF<nlist>,PQ<dim/8>``."""
    if n_rows <= FLAT_MAX_ROWS:
        return "Flat"
    # about 4·√n lists, and never more than the vectors train well (_POINTS_PER_CENTROID each)
    nlist = min(2 ** round(math.log2(4 * math.sqrt(n_rows))), 2 ** int(math.log2(max(n_rows // _POINTS_PER_CENTROID, 1))))
    return f"IVF{nlist},SQ8" if n_rows <= SQ8_MAX_ROWS else f"IVF{nlist},PQ{max(dim // 8, 1)}"


def tune_nprobe(index: faiss.Index, vectors: np.ndarray, *, k: int = 10, sample: int = 1000,
                target: float = RECALL_TARGET, seed: int = 0) -> dict[str, Any]:
    """Set the smallest ``nprobe`` (of NPROBES) whose recall@``k`` on ``sample`` of the indexed ``vectors``
    used as queries, against exact inner-product search over all of them, reaches ``target``; the last
    one tried when none does. Returns {nprobe, recall, queries}. A no-op ({}) for a non-IVF index."""
    parts = _ivf_parts(index)
    if not parts or not len(vectors):
        return {}
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(vectors), size=min(sample, len(vectors)), replace=False)
    queries = np.ascontiguousarray(vectors[rows], dtype=np.float32)
    k = min(k, len(vectors))
    # exact top-k by FAISS's blocked brute force: a few MB of scores at a time (a block of 100 queries
    # against 10^6 vectors scored and argsorted in numpy held 1.6 GB)
    _, exact = faiss.knn(queries, np.ascontiguousarray(vectors, dtype=np.float32), k, metric=faiss.METRIC_INNER_PRODUCT)
    ids = index_ids(index)  # FAISS ids in the order their vectors were added: row i of ``vectors`` is ids[i]
    order = np.argsort(ids)  # id → row by binary search (ids are 64-bit and sparse: no table indexed by id)
    best: dict[str, Any] = {}
    for nprobe in NPROBES:
        set_search_params(index, nprobe=nprobe)
        _, found = index.search(queries, k)
        found_rows = np.where(found >= 0, order[np.clip(np.searchsorted(ids, found, sorter=order), 0, ids.size - 1)], -1)
        recall = float(np.mean([len(set(f) & set(e)) / k for f, e in zip(found_rows, exact)]))
        best = {"nprobe": int(min(nprobe, parts[0].nlist)), "recall": round(recall, 4), "queries": len(queries)}
        if recall >= target or nprobe >= parts[0].nlist:
            break
    return best


# --------------------------------------------------------------------------------------
# GPU / CPU
# --------------------------------------------------------------------------------------


def to_gpu(index: faiss.Index, ngpu: int = -1) -> faiss.Index:
    """Copy the index to GPU(s) (all of them for ``ngpu=-1``, replicated).

    Returns ``index`` unchanged when FAISS has no GPU support, no GPU is visible,
    ``ngpu == 0``, the index is already on GPU, or the structure has no GPU
    implementation (e.g. HNSW; a warning is logged).
    """
    if ngpu == 0 or not hasattr(faiss, "StandardGpuResources"):
        return index
    try:
        available = int(faiss.get_num_gpus())
    except Exception:  # noqa: BLE001 - treat an unusable GPU runtime as "no GPU"
        return index
    if available <= 0 or is_gpu_index(index):
        return index
    count = available if ngpu < 0 else min(int(ngpu), available)
    options = faiss.GpuMultipleClonerOptions()
    options.shard = False  # replicate: every GPU answers every query
    try:
        # index_cpu_to_all_gpus creates and keeps references to the GPU resources.
        return faiss.index_cpu_to_all_gpus(index, co=options, ngpu=count)
    except RuntimeError as exc:
        log.warning("keeping index on CPU, GPU copy failed: %s", _faiss_reason(exc))
        return index


def to_cpu(index: faiss.Index) -> faiss.Index:
    """A CPU copy of a GPU index (for saving); CPU indexes are returned as-is."""
    if is_gpu_index(index) and hasattr(faiss, "index_gpu_to_cpu"):
        return faiss.index_gpu_to_cpu(index)
    return index


# --------------------------------------------------------------------------------------
# Search and introspection
# --------------------------------------------------------------------------------------


def search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` search for each query row.

    ``k`` is clamped to ``index.ntotal`` (so an index with 3 vectors returns 3
    columns for k=10; an empty index returns 0 columns). A 1-D query is treated as
    one row.

    Returns:
        ``(scores, ids)``: float32 and int64 arrays of shape ``(n_queries, k')``, best
        first. Where FAISS finds fewer than ``k'`` results (IVF with few probed lists,
        HNSW on tiny graphs) the remaining slots have id ``-1`` and score ``-FLT_MAX``
        (inner product) / ``+FLT_MAX`` (L2), exactly as FAISS returns them.

    GPU indexes limit ``k`` (2048 for recent FAISS builds); FAISS raises above that.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if q.ndim == 1:
        q = q.reshape(1, -1)
    if q.ndim != 2 or q.shape[1] != index.d:
        raise ValueError(f"queries must have shape (n, {index.d}), got {np.shape(queries)}")
    k_eff = int(min(int(k), index.ntotal))
    if k_eff == 0 or q.shape[0] == 0:
        return np.empty((q.shape[0], k_eff), np.float32), np.empty((q.shape[0], k_eff), np.int64)
    # FAISS scans vectors query by query (SIMD) while queries × dim < distance_compute_blas_threshold, and through
    # BLAS from there. Its default (128,000: 500 queries of 256 dims) left batches of 8–499 queries on the scan, 4×
    # slower for 32 queries (1.45 against 0.39 ms a query on 39,627 × 256); below 8 queries BLAS is no faster (2:
    # 3.2 ms a query, 7: 1.3). The two paths can differ in a score's last bits (5e-7): the same dense top 20, ids
    # and order, on 2,048 CCKS queries alone and in batches of 2 to 1,024. Process-wide, so set for each search.
    faiss.cvar.distance_compute_blas_threshold = BLAS_MIN_QUERIES * index.d
    # A few queries on one OpenMP thread (this thread's setting, restored): FAISS's other threads would only wake
    # and then spin on the cores torch's threads need next (one query over 39,627 × 256: 1.3 ms against 2.4).
    threads = faiss.omp_get_max_threads()
    if q.shape[0] < BLAS_MIN_QUERIES:
        faiss.omp_set_num_threads(1)
    try:
        scores, ids = index.search(q, k_eff)
    finally:
        faiss.omp_set_num_threads(threads)
    return np.asarray(scores, dtype=np.float32), np.asarray(ids, dtype=np.int64)


def index_ids(index: faiss.Index) -> np.ndarray:
    """The entry ids stored in the index (int64, insertion order).

    Raises:
        TypeError: the index has no id map (not built by :func:`make_index`).
    """
    wrapper = _id_map_wrapper(index)
    if wrapper is None:
        raise TypeError(f"{type(_downcast(index)).__name__} has no id map; build indexes with make_index()")
    return faiss.vector_to_array(wrapper.id_map).astype(np.int64, copy=False)


def describe(index: faiss.Index) -> dict[str, Any]:
    """Summary for logs and the CLI.

    Keys: ``ntotal``, ``dim``, ``factory`` (factory string of the wrapped structure,
    None when it cannot be recovered), ``is_trained``, ``metric`` (``"ip"``/``"l2"``/
    other FAISS metric number), ``on_gpu``, ``type`` (FAISS class), plus ``nprobe``
    / ``nlist`` for IVF and ``ef_search`` for HNSW.
    """
    on_gpu = is_gpu_index(index)
    cpu = to_cpu(index) if on_gpu else index  # introspect one CPU copy
    info: dict[str, Any] = {
        "ntotal": int(index.ntotal),
        "dim": int(index.d),
        "factory": _factory_string(cpu),
        "is_trained": bool(index.is_trained),
        "metric": _METRIC_NAMES.get(int(index.metric_type), int(index.metric_type)),
        "on_gpu": on_gpu,
        "type": type(_unwrap(cpu)).__name__,
    }
    ivf = _ivf(cpu)
    if ivf is not None:
        info["nlist"] = int(ivf.nlist)
        info["nprobe"] = int(ivf.nprobe)
    hnsw = _hnsw(cpu)
    if hnsw is not None:
        info["ef_search"] = int(hnsw.efSearch)
    return info


# --------------------------------------------------------------------------------------
# Persistence
# --------------------------------------------------------------------------------------


def save_atomic(index: faiss.Index, path: PathLike) -> None:
    """Write the index (copied to CPU first when on GPU) with :func:`mgeo_index.files.replace_atomic`."""
    cpu_index = to_cpu(index)
    files.replace_atomic(path, lambda tmp: faiss.write_index(cpu_index, tmp))


def load(path: PathLike, *, gpu: bool = False, mmap: bool = False) -> faiss.Index:
    """Read an index written by :func:`save_atomic`; ``gpu=True`` moves it with :func:`to_gpu`.

    ``mmap=True`` (readers: search only) maps an IVF index's inverted lists from the file, read-only, instead
    of copying them into the process: the codes stay in the page cache, shared by every process serving the
    same generation and evicted under memory pressure, so a reader's own (anonymous) memory does not grow with
    the catalog. Other structures are read into memory as usual. Never add to or remove from such an index
    (FAISS refuses, and with several OpenMP threads its refusal aborts the process): writers load without it.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"no index file at {p}")
    index = faiss.read_index(p, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY) if mmap and not gpu else faiss.read_index(p)
    return to_gpu(index) if gpu else index
