"""Character n-gram TF-IDF retrieval: the sparse half of hybrid retrieval.

Dense embeddings capture paraphrase (北京朝阳 ~ 北京市朝阳区) but a small model misses rare exact
strings (a shop name, a road it has never seen); character bigrams and trigrams catch those. Both
candidate lists are fused by reciprocal rank before reranking.

Stored as one ``.npz`` beside the FAISS file: the n-gram vocabulary, idf weights, the L2-normalized
CSR matrix (one row per entry: :mod:`mgeo_index.index.csr`) and the entry ids of its rows.
"""
from __future__ import annotations

import io
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mgeo_index.catalog.crashpoints import crashpoint
from mgeo_index.index.csr import Csr, stack
from mgeo_index.files import replace_atomic

NGRAMS = (2, 3)
# An n-gram in more than this share of the entries (and more than COMMON_MIN_ENTRIES of them) does not by
# itself make an entry a candidate (SparseIndex.search).
# 1% measured (research/bench_sparse.py, README): at 10^6 synthesized rows the single search's p50 falls from 55 to
# 14 ms; the CCKS dev retrieval figures do not move (39,627 rows: COMMON_MIN_ENTRIES decides there).
COMMON_SHARE = 0.01
COMMON_MIN_ENTRIES = 1000
# Float slack of the bound that spares a pruned search the exact scores of entries that cannot make its top k
# (float32 sums of at most a few hundred terms in [0, 1] err by ~1e-7; see SparseIndex._can_make_top).
BOUND_SLACK = 1e-4


def ngrams(text: str) -> Counter:
    grams: Counter = Counter()
    for n in NGRAMS:
        grams.update(text[i : i + n] for i in range(len(text) - n + 1))
    if len(text) == 1:
        grams[text] += 1
    return grams


@dataclass
class SparseIndex:
    vocabulary: dict[str, int]
    idf: np.ndarray  # (V,) float32
    matrix: Csr  # (N, V) rows L2-normalized
    ids: np.ndarray  # (N,) int64 entry ids
    _transposed: Csr | None = None
    _common: np.ndarray | None = None  # per n-gram: in more than COMMON_SHARE of the entries
    _common_norm: np.ndarray | None = None  # per entry: the L2 norm of its common n-grams' weights
    _common_max: np.ndarray | None = None  # per n-gram: its largest weight in any entry (0 for rare ones)

    def _vectorize(self, texts: Sequence[str]) -> Csr:
        rows, cols, vals = [], [], []
        for r, text in enumerate(texts):
            for gram, tf in ngrams(text).items():
                col = self.vocabulary.get(gram)
                if col is not None:
                    rows.append(r)
                    cols.append(col)
                    vals.append((1.0 + np.log(tf)) * self.idf[col])
        return Csr.from_rows(np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64),
                             np.asarray(vals, dtype=np.float32), (len(texts), len(self.idf))).unit_rows()

    def search(self, texts: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Cosine scores (n, k) and entry ids (n, k), best first; -1 ids where fewer than k match.

        Candidates are the entries sharing one of the query's *rare* n-grams (in at most COMMON_SHARE of
        the entries), scored exactly; entries that share only common ones (省, 市 and road names of a big
        city) are not scored unless the query has no rare n-gram. On a large catalog the common n-grams
        are in most rows, so this is what keeps a search from scoring the whole catalog. Of those candidates,
        only the ones a bound says can make the top k are scored (:meth:`_can_make_top`: the same answers)."""
        k = min(k, len(self.ids))
        scores = np.zeros((len(texts), k), dtype=np.float32)
        ids = np.full((len(texts), k), -1, dtype=np.int64)
        if k == 0 or not len(texts):
            return scores, ids
        if self._transposed is None:  # (V, N) CSR once: the entries of each n-gram
            self._prepare()
        queries = self._vectorize(texts)
        t = self._transposed
        pruned: dict[int, np.ndarray] = {}  # query row → its rare n-grams, where it also has common ones
        for r in range(len(texts)):
            cols = queries.indices[queries.indptr[r] : queries.indptr[r + 1]]
            rare = cols[~self._common[cols]]
            if 0 < rare.size < cols.size:
                pruned[r] = rare
        for r in range(len(texts)):
            if r in pruned:
                # the entries of its rare n-grams, once each and in order (a mask: 7x faster than np.unique on
                # ~40,000 postings), scored against the query as a dense vector (a CSR matrix-vector product: about
                # 3x faster than the sparse-sparse one) where a bound leaves them in the running; the buffers are per
                # call, so searches may run in threads
                seen = np.zeros(len(self.ids), dtype=bool)
                postings = [t.indices[t.indptr[c] : t.indptr[c + 1]] for c in pruned[r]]
                for entries in postings:
                    seen[entries] = True
                rows = np.flatnonzero(seen)
                query = np.zeros(len(self.idf), dtype=np.float32)
                start, stop = queries.indptr[r], queries.indptr[r + 1]
                query[queries.indices[start:stop]] = queries.data[start:stop]
                if rows.size > k:
                    rows = self._can_make_top(rows, postings, pruned[r], queries.indices[start:stop], query, k)
                sims = self.matrix.dot_rows(rows, query)
            else:
                rows, sims = self._every_sharing(*queries.row(r))
            if not sims.size:
                continue
            top = _top(sims, k)
            scores[r, : len(top)] = sims[top]
            ids[r, : len(top)] = self.ids[rows[top]]
        return scores, ids

    def _every_sharing(self, columns: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(entries, cosines) of every entry sharing an n-gram with a query (its ``columns`` and ``weights`` in
        stored order): the products summed entry by entry in the query's order, the entries last-seen first, as
        a sparse matrix product leaves them (ties keep that order)."""
        t = self._transposed
        sums = np.zeros(len(self.ids), dtype=np.float32)
        seen = np.zeros(len(self.ids), dtype=bool)
        first_seen = []  # the entries each n-gram brings first, in order
        for c, weight in zip(columns, weights):
            span = slice(t.indptr[c], t.indptr[c + 1])
            entries = t.indices[span]
            sums[entries] += weight * t.data[span]  # an n-gram's entries are distinct
            new = entries[~seen[entries]]
            seen[new] = True
            first_seen.append(new)
        entries = np.concatenate(first_seen)[::-1] if first_seen else np.zeros(0, dtype=np.int64)
        return entries, sums[entries]

    def _prepare(self) -> None:
        """What a search reads besides the matrix, computed once: the transposed matrix (each n-gram's
        entries), which n-grams are common, and the bounds of the common n-grams' part of a cosine."""
        t = self.matrix.transposed()
        df = np.diff(t.indptr)
        common = df > max(COMMON_SHARE * len(self.ids), COMMON_MIN_ENTRIES)
        squares = np.zeros(len(self.ids), dtype=np.float64)
        largest = np.zeros(len(self.idf), dtype=np.float32)
        for c in np.flatnonzero(common):  # a few hundred n-grams
            span = slice(t.indptr[c], t.indptr[c + 1])
            weights = t.data[span].astype(np.float64)
            squares[t.indices[span]] += weights * weights  # an n-gram's entries are distinct
            largest[c] = t.data[span].max()
        self._common_norm, self._common_max = np.sqrt(squares).astype(np.float32), largest
        self._common, self._transposed = common, t

    def _can_make_top(self, rows: np.ndarray, postings: list[np.ndarray], rare: np.ndarray, columns: np.ndarray,
                      query: np.ndarray, k: int) -> np.ndarray:
        """Of the candidate ``rows`` (sorted: the entries in the ``postings`` of the ``rare`` n-grams), those
        whose cosine with ``query`` (its n-grams: ``columns``) can reach the k-th best one.

        A candidate's cosine is its rare n-grams' part, summed here from their postings, plus its common
        n-grams' part, which is at most the smaller of ‖query's common part‖ · ‖entry's common part‖
        (Cauchy–Schwarz) and Σ query weight · the n-gram's largest weight. The k best rare parts are each a
        lower bound of a cosine, so the k-th best cosine is at least the k-th best rare part: a candidate
        whose rare part plus bound falls short of that (less BOUND_SLACK) is below the k-th best cosine and
        need not be scored. The rest are scored exactly as before, in the same order, so the top k, its ties
        and its scores are those of scoring every candidate (tested)."""
        t = self._transposed
        position = np.zeros(len(self.ids), dtype=np.int32)  # entry → its place in rows (zeroed lazily by the OS)
        position[rows] = np.arange(rows.size, dtype=np.int32)
        weights = [t.data[t.indptr[c] : t.indptr[c + 1]] * query[c] for c in rare]
        partial = np.bincount(position[np.concatenate(postings)], np.concatenate(weights), minlength=rows.size)
        common = columns[self._common[columns]]
        q = query[common]
        bound = np.minimum(np.sqrt(float(q @ q)) * self._common_norm[rows], float(q @ self._common_max[common]))
        kth = np.partition(partial, rows.size - k)[rows.size - k]
        return rows[partial + bound >= kth - BOUND_SLACK]


def _top(sims: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest ``sims``, best first, ties in position order: ``np.argsort(-sims,
    kind="stable")[:k]``, sorting only the values at least the k-th largest (a search scores ~30,000
    entries at 10^6 rows and keeps 40)."""
    if sims.size > 4 * k:
        kth = np.partition(sims, sims.size - k)[sims.size - k]
        kept = np.flatnonzero(sims >= kth)  # every tie of the k-th value, in position order
        return kept[np.argsort(-sims[kept], kind="stable")][:k]
    return np.argsort(-sims, kind="stable")[:k]


def build_sparse(texts: Iterable[str], ids: Sequence[int]) -> SparseIndex:
    texts = list(texts)
    vocabulary: dict[str, int] = {}
    df: list[int] = []
    # one (row, column, tf) triple per distinct n-gram of each text, kept as packed C values (12 bytes)
    # rather than three Python objects (~100 bytes): the build's memory then stays small on large catalogs
    rows, cols, tfs = array("i"), array("i"), array("f")
    for r, text in enumerate(texts):
        for gram, tf in ngrams(text).items():
            col = vocabulary.setdefault(gram, len(vocabulary))
            if col == len(df):
                df.append(0)
            df[col] += 1
            rows.append(r)
            cols.append(col)
            tfs.append(1.0 + math.log(tf))
    idf = (np.log((1 + len(texts)) / (1 + np.asarray(df, dtype=np.float64))) + 1.0).astype(np.float32)
    rows_, cols_ = np.frombuffer(rows, dtype=np.int32), np.frombuffer(cols, dtype=np.int32)
    raw = Csr.from_rows(rows_, cols_, np.frombuffer(tfs, dtype=np.float32) * idf[cols_], (len(texts), len(idf)))
    del rows, cols, tfs, rows_, cols_
    return SparseIndex(vocabulary, idf, raw.unit_rows(), np.asarray(ids, dtype=np.int64))


def update_sparse(index: SparseIndex, remove_ids: Sequence[int], texts: Sequence[str], ids: Sequence[int]) -> SparseIndex:
    """``index`` without the rows of ``remove_ids`` and with rows for ``texts`` under ``ids``: the cheap
    path for small changes (cost grows with the change, not the catalog).

    The idf of n-grams already known is kept (a small change barely moves it); n-grams seen for the first
    time get the idf their document frequency among ``texts`` gives.  A full :func:`build_sparse`
    recomputes every weight.
    """
    keep = ~np.isin(index.ids, np.asarray(remove_ids, dtype=np.int64))
    vocabulary = dict(index.vocabulary)
    new_df: Counter = Counter()
    for text in texts:
        new_df.update(g for g in ngrams(text) if g not in vocabulary)
    n_docs = int(keep.sum()) + len(texts)
    new_idf = [np.log((1 + n_docs) / (1 + df)) + 1.0 for df in new_df.values()]
    for gram in new_df:
        vocabulary[gram] = len(vocabulary)
    idf = np.concatenate([index.idf, np.asarray(new_idf, dtype=np.float32)]).astype(np.float32)
    kept = index.matrix.take_rows(keep).with_columns(len(idf))
    updated = SparseIndex(vocabulary, idf, kept, np.concatenate([index.ids[keep], np.asarray(ids, dtype=np.int64)]))
    if len(texts):
        updated.matrix = stack(kept, updated._vectorize(texts))
    return updated


def save_atomic(index: SparseIndex, path: str | Path) -> None:
    path = Path(path)
    buffer = io.BytesIO()
    m = index.matrix
    np.savez(
        buffer,
        vocabulary=np.asarray(list(index.vocabulary), dtype=object).astype(str),
        idf=index.idf, data=m.data, indices=m.indices, indptr=m.indptr, shape=np.asarray(m.shape), ids=index.ids,
    )
    data = buffer.getvalue()

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            crashpoint("index-write")  # tests: die with the file half written
            fh.write(data[len(data) // 2 :])

    replace_atomic(path, write)


def load(path: str | Path) -> SparseIndex:
    with np.load(path, allow_pickle=False) as z:
        vocabulary = {gram: i for i, gram in enumerate(z["vocabulary"].tolist())}
        matrix = Csr(z["data"], z["indices"], z["indptr"], tuple(int(n) for n in z["shape"]))
        return SparseIndex(vocabulary, z["idf"], matrix, z["ids"])


def fuse(
    rankings: Sequence[np.ndarray], k: int, weights: Sequence[float] | None = None, constant: float = 60.0
) -> list[list[tuple[int, float]]]:
    """Weighted reciprocal-rank fusion of (n, k_i) id matrices → up to ``k`` (id, score) per row, best first."""
    weights = weights or [1.0] * len(rankings)
    fused = []
    for r in range(len(rankings[0])):
        score: dict[int, float] = {}
        for weight, ranking in zip(weights, rankings):
            for rank, entry_id in enumerate(ranking[r]):
                if entry_id >= 0:
                    score[int(entry_id)] = score.get(int(entry_id), 0.0) + weight / (constant + rank + 1)
        fused.append(sorted(score.items(), key=lambda item: -item[1])[:k])
    return fused
