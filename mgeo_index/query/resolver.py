"""Retrieve → rerank → ranked matches: the query side of mgeo-index.

``open_resolver(index_dir)`` loads the index directory (FAISS file, store, the two models) once;
``Resolver.resolve(queries)`` runs every query of a call through the batched engine together:
one encode, one FAISS search, one store lookup, one cross-encoder pass.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mgeo_index import settings, store
from mgeo_index.compare import conflicts, features
from mgeo_index.catalog import index_json
from mgeo_index.index import sparse as sparse_index, vector_store
from mgeo_index.runtime import inference
from mgeo_index.model import numbers as number_policy
from mgeo_index.query.labelling import label_pairs
from mgeo_index.model.loading import ModelMismatch, check_index_model, load_for_index  # noqa: F401  (ModelMismatch: re-exported)
from mgeo_index.settings import LABELS
from mgeo_index.text import has_content, model_text, with_name
from mgeo_index.text.parser import parse, parser_version

if TYPE_CHECKING:  # the models: torch modules, or the numpy backend's (mgeo_index.model.numpy_backend)
    from mgeo_index.model.bi_encoder import BiEncoder
    from mgeo_index.model.cross_encoder import CrossEncoder

# Reranked order: P(exact_match) plus a share of the fused retrieval score (relative to the best
# candidate's), which breaks the reranker's near-ties. Chosen on the CCKS calibration split (116
# queries, MRR@10), never on dev: partial weight 0.5 / 0.25 / 0 with retrieval weight 0.3 → 0.711 /
# 0.753 / 0.771; partial 0 with retrieval 0.5 / 0.7 / 1.0 → 0.774 / 0.765 / 0.766.
PARTIAL_WEIGHT = 0.0
RETRIEVAL_WEIGHT = 0.5
RETRIEVALS = ("hybrid", "dense", "sparse")
# Hybrid retrieval: each retriever returns POOL_FACTOR × top_k candidates when reranking; reciprocal-rank
# fusion weighs the dense list at DENSE_WEIGHT relative to the character n-gram list (the small dense
# model is the weaker retriever on held-out queries: recall@10 0.745 vs 0.938 on the CCKS dev split).
POOL_FACTOR = 2
DENSE_WEIGHT = 0.5
# A third list: the n-gram search of the query without its province/city/district/town
# (features.without_admin), weighed CORE_WEIGHT (0 / 0.5 / 1.0 on the CCKS calibration split, reranked:
# MRR@10 0.804 / 0.809 / 0.802, recall@10 0.972 / 0.981 / 0.972); at 1.0 it lifts the pool recall@20
# from 0.972 to 0.991 (dev: 0.961 → 0.974).
CORE_WEIGHT = 0.5
# Of that pool, the cross-encoder's network scores the RERANK_DEPTH most promising by its feature
# head and retrieval alone (see Resolver._rerank); on 20 candidates the network was ~90% of a query's
# time, on these 10 it is still the largest part (≈ 45% of a single query, README: bench).
RERANK_DEPTH = 10
# Of those, the network judges only the candidates that may yet come first: the NETWORK_DEPTH most promising by
# that same key, within NETWORK_GAP of the best one's; the others keep the feature-only probabilities of the
# cascade's gate. Chosen with research/eval_network_depth.py on the CCKS train, calibration and dev splits (5,113,
# 326 and 507 queries) against the network on all 10: depth 4 and gap 0.3 moved 3, 0 and 0 rank-1 answers and no
# query's recall@1 but one (gained, train), with 2.3 network pairs a query instead of 4.9; depth 3 moved 10, 0 and
# 3 (dev: one query lost), depth 5 1, 0 and 0 with 2.6 pairs.
NETWORK_DEPTH = 4
NETWORK_GAP = 0.3


@dataclass(slots=True)
class Retrieved:
    """A retrieved entry on its way to an answer: ``match``, the answer's dict as it will be shown (filled in by the
    reranker and explanations); the entry's normalized text, which the reranker compares with the query; and its
    fused retrieval score relative to the query's best (1.0 for the best-retrieved candidate), a share of the
    ranking key."""

    match: dict
    normalized: str
    fused: float

    @property
    def id(self) -> int:
        return self.match["id"]


@dataclass
class Resolver:
    bi: BiEncoder
    cross: CrossEncoder | None
    index: object  # faiss.Index, or vector_store.MilvusIndex (searched through mgeo_index.index.vector_store)
    engine: object  # sqlalchemy.Engine
    descriptor: dict
    device: str

    sparse: object | None = None  # sparse.SparseIndex, for hybrid retrieval
    numbers: str = number_policy.DEFAULT  # the number policy of reranked labels (mgeo_index.model.numbers)
    profile: str = "default"  # which bundled cross-encoder reranks (settings.PROFILES)
    profile_note: str | None = None  # why, when it was chosen for a GPU
    name_column: str | None = None  # the catalog column naming each entry's place (build --name-column), if any

    def made_with(self, rerank: bool = True) -> dict[str, str]:
        """What its answers are made with, as ``resolve --json`` and the service show it beside them: the profile and
        number policy (reranked answers only) and the plan its models compute with (:mod:`mgeo_index.runtime.plan`)."""
        made = {"profile": self.profile, "numbers": self.numbers} if rerank else {}
        plan = getattr(self.bi, "plan", None)
        return made | ({"plan": str(plan)} if plan is not None else {})

    def resolve(
        self,
        queries: Sequence[str],
        *,
        top_k: int = settings.DEFAULT_TOP_K,
        rerank: bool = True,
        explain: bool = False,
        retrieval: str = "hybrid",
        admin_filter: bool = False,
        rerank_depth: int | None = None,
        confirmed: bool = True,
        parses: Sequence[dict] | None = None,
        numbers: str | None = None,
        names: Sequence[str | None] | None = None,
    ) -> list[list[dict]]:
        """For each query, up to ``top_k`` matches, best first (see README for the fields).

        ``retrieval``: ``dense`` (FAISS), ``sparse`` (the character n-gram lists: whole query and query
        below town level) or ``hybrid`` (all, fused by weighted reciprocal rank; the reranker then sees
        up to POOL_FACTOR·top_k candidates). ``explain`` adds, per
        match, which address elements agree or differ (:func:`features.explain`). ``admin_filter``
        drops candidates whose stored city (or district) code differs from the query's parsed one
        when both are known (off by default: see README for what it does to recall). ``rerank_depth``:
        how many of the pool the cross-encoder's network scores, at least ``top_k`` [RERANK_DEPTH].
        ``confirmed``: put what reviewers decided for these query texts on top (:meth:`apply_confirmations`).
        ``parses``: the queries' :func:`~mgeo_index.text.parser.parse` results, when the caller has them (a
        normalize job parses each address once, for its admin columns and for this). ``numbers``: ``strict``
        (a candidate writing another road / house / building / floor / unit / room number than the query is not
        ``exact_match`` and ranks below those that agree) or ``loose`` (the scorer alone); the resolver's own
        setting when None (:mod:`mgeo_index.model.numbers`). ``names``: each query's place name, for queries
        kept as name + address (None or empty where a query has none): the query matches as its address with the
        name after it (:func:`~mgeo_index.text.with_name`), and the name is compared with each entry's
        (:mod:`mgeo_index.compare.names`). An index built with ``--name-column`` gives each match its ``name``; every
        match carries ``fields``, the entry's own catalog columns but its address and id (as the catalog wrote them).
        """
        numbers = number_policy.check_mode(numbers or self.numbers)
        if retrieval not in RETRIEVALS:
            raise ValueError(f"retrieval must be one of {RETRIEVALS}, not {retrieval!r}")
        if parses is not None and len(parses) != len(queries):
            raise ValueError(f"{len(queries)} queries but {len(parses)} parses")
        if names is not None and len(names) != len(queries):
            raise ValueError(f"{len(queries)} queries but {len(names)} names")
        names = [n.strip() if n and n.strip() else None for n in names] if names is not None else [None] * len(queries)
        queries = [with_name(q, n) for q, n in zip(queries, names)]
        if retrieval != "dense" and self.sparse is None:
            retrieval = "dense"  # an index built before sparse retrieval existed
        normalized = [model_text(q) for q in queries]
        vectors = inference.encode(self.bi, normalized, device=self.device)
        reranking = rerank and self.cross is not None
        depth = top_k * POOL_FACTOR if reranking else top_k  # the reranker sees a deeper pool
        candidates = self._retrieve(normalized, vectors, depth, retrieval)
        needs_parses = reranking and (self.cross.feature_head is not None or numbers == "strict")  # stacked scorer, policy
        query_parses = None
        if admin_filter or explain or needs_parses:
            query_parses = list(parses) if parses is not None else parse(normalized)
            query_parses = [p | {"name": n} if n else p for p, n in zip(query_parses, names)]
        if admin_filter:
            candidates = self._same_admin(query_parses, candidates)
        results = self._matches(normalized, vectors, candidates)
        # per query: (its parse, {entry id: parse}), for the stacked scorer, the number policy and explanations
        parsed = self._parses(query_parses, results) if explain or needs_parses else None
        if reranking:
            self._rerank(normalized, results, max(top_k, RERANK_DEPTH if rerank_depth is None else rerank_depth), parsed,
                         numbers)
        for matches in results:
            del matches[top_k:]
        if explain:
            for (query, candidates), matches in zip(parsed, results):
                for c in matches:
                    c.match["explain"] = features.explain_parsed(query, candidates[c.id])
        results = [[c.match for c in matches] for matches in results]
        if confirmed:
            results = self.apply_confirmations(normalized, results, top_k=top_k, explain=explain, rerank=rerank)
        return results

    def _retrieve(self, normalized: list[str], vectors: np.ndarray, depth: int,
                  retrieval: str) -> list[list[tuple[int, float]]]:
        """Each query's ``depth`` best entries with their fused retrieval score, best first: the dense ranking, the
        character n-gram ranking of the whole query and of its core (the query without its admin levels), fused by
        weighted reciprocal rank (``retrieval``: which of them)."""
        rankings, weights = [], []
        if retrieval != "sparse":
            rankings.append(vector_store.search(self.index, vectors, depth)[1])
            weights.append(DENSE_WEIGHT)
        if retrieval != "dense":
            rankings.append(self.sparse.search(normalized, depth)[1])
            weights.append(1.0)
            if CORE_WEIGHT:
                cores = [features.without_admin(q) for q in normalized]
                changed = [i for i, (core, q) in enumerate(zip(cores, normalized)) if core != q]
                core_ranking = rankings[-1].copy()  # a query with no admin part is its own core: searched once
                if changed:
                    core_ranking[changed] = self.sparse.search([cores[i] for i in changed], depth)[1]
                rankings.append(core_ranking)
                weights.append(CORE_WEIGHT)
        return sparse_index.fuse(rankings, depth, weights)

    def _matches(self, normalized: list[str], vectors: np.ndarray,
                 candidates: list[list[tuple[int, float]]]) -> list[list[Retrieved]]:
        """Each query's retrieved entries: the match (the stored entry, its dense cosine with the query), and for the
        reranker its normalized text and its fused score relative to the query's best (:class:`Retrieved`)."""
        entries = store.get_entries(self.engine, sorted({i for row in candidates for i, _ in row}))
        stored = vector_store.stored_vectors(self.index, sorted(entries))  # one read for the batch's candidates
        results: list[list[Retrieved]] = []
        for query, vector, row in zip(normalized, vectors, candidates):
            # nothing left to match (empty, only spaces, punctuation or control characters): no candidates
            row = [(i, fused) for i, fused in row if i in entries] if has_content(query) else []
            top_fused = row[0][1] if row else 1.0
            results.append(
                [
                    Retrieved(
                        {"id": i, "source_id": entries[i]["source_id"], "address": entries[i]["address"], "score": score,
                         **self._name_of(entries[i]), "fields": dict(entries[i]["extra"] or {})},
                        entries[i]["normalized"],
                        fused / top_fused,  # 1.0 for the best-retrieved candidate
                    )
                    for (i, fused), score in zip(row, self._cosines(vector, [i for i, _ in row], stored))
                ]
            )
        return results

    def apply_confirmations(self, normalized: Sequence[str], results: list[list[dict]], *, top_k: int,
                            explain: bool = False, rerank: bool = True) -> list[list[dict]]:
        """Reviewers' decisions on these (normalized) query texts applied to their matches: an entry confirmed
        as the same place comes first with ``"source": "confirmed"`` (label ``exact_match``, probability 1 when the
        matches were reranked: ``rerank`` as asked of :meth:`resolve`, and a cross-encoder loaded),
        fetched from the store when retrieval missed it; entries a reviewer said are not the place are
        dropped. A retired entry's confirmation no longer counts. One store query for the whole batch;
        ``results`` is not modified (the service caches it): changed lists are copies."""
        decided = store.confirmations(self.engine, normalized)
        if not decided:
            return results
        reranked = rerank and self.cross is not None
        wanted = sorted({i for text in normalized if text in decided for i in decided[text]["confirmed"]})
        entries = store.get_entries(self.engine, wanted) if wanted else {}
        out = []
        for text, matches in zip(normalized, results):
            answer = decided.get(text)
            if answer is None:
                out.append(matches)
                continue
            by_id = {m["id"]: m for m in matches}
            first = []
            for i in answer["confirmed"]:
                if i not in entries:
                    continue
                base = dict(by_id.get(i) or {"id": i, "source_id": entries[i]["source_id"], "address": entries[i]["address"],
                                             "score": self._cosines(self._vector_of(text), [i])[0],
                                             **self._name_of(entries[i]), "fields": dict(entries[i]["extra"] or {})})
                if reranked:
                    base.update(label="exact_match", probability=1.0,
                                probabilities={label: float(label == "exact_match") for label in LABELS})
                if explain and "explain" not in base:
                    base["explain"] = self._explain_one(text, i, entries[i]["normalized"])
                base["source"] = "confirmed"
                first.append(base)
            skip = answer["rejected"] | {m["id"] for m in first}
            out.append((first + [m for m in matches if m["id"] not in skip])[:top_k])
        return out

    def _name_of(self, entry: dict) -> dict:
        """``{"name": …}`` of a stored entry when the catalog has a name column (None where its cell is empty);
        nothing otherwise."""
        if self.name_column is None:
            return {}
        return {"name": (entry.get("extra") or {}).get(self.name_column, "").strip() or None}

    def _vector_of(self, text: str) -> np.ndarray:
        return inference.encode(self.bi, [text], device=self.device)[0]

    def _explain_one(self, query: str, entry_id: int, entry_normalized: str) -> dict:
        stored = self._current_elements([entry_id])
        candidate = stored[entry_id] | {"text": entry_normalized} if entry_id in stored else parse([entry_normalized])[0]
        return features.explain_parsed(parse([query])[0], candidate)

    def _parses(self, query_parses: list[dict], results: list[list[Retrieved]]) -> list[tuple[dict, dict[int, dict]]]:
        """Each query's parse with its candidates' parses: read from the store (written by ``build``; with the
        entry's normalized ``text``, as a parse has it, and its ``name`` where the catalog has a name column), parsed
        now for entries built before that existed or by another parser version."""
        known = self._current_elements([c.id for matches in results for c in matches])
        missing = sorted({c.normalized for matches in results for c in matches if c.id not in known})
        fresh = dict(zip(missing, parse(missing))) if missing else {}

        made: dict[int, dict] = {}  # one parse an entry, however many queries it is a candidate of

        def candidate(c: Retrieved) -> dict:
            if (found := made.get(c.id)) is None:
                found = known[c.id] | {"text": c.normalized} if c.id in known else fresh[c.normalized]
                found = made[c.id] = found | {"name": c.match["name"]} if c.match.get("name") else found
            return found

        return [(query, {c.id: candidate(c) for c in matches}) for query, matches in zip(query_parses, results)]

    def _current_elements(self, ids: list[int]) -> dict[int, dict]:
        """The stored parses of these entries that the current parser made (``build`` writes them)."""
        current = parser_version()
        return {i: e for i, e in store.get_elements(self.engine, ids).items() if e["parser"] == current}

    def _same_admin(self, query_parses: list[dict], candidates: list[list[tuple[int, float]]]):
        """Candidates whose city and district codes do not contradict the query's (unknown = no contradiction;
        codes stored by another parser version count as unknown until a build re-parses them)."""
        stored = self._current_elements([i for row in candidates for i, _ in row])
        out = []
        for query, row in zip(query_parses, candidates):
            admin = query["admin"]
            keep = []
            for i, fused in row:
                entry = stored.get(i)
                clash = entry is not None and any(
                    admin[f"{level}_code"] and entry[f"{level}_code"] and admin[f"{level}_code"] != entry[f"{level}_code"]
                    for level in ("city", "district")
                )
                if not clash:
                    keep.append((i, fused))
            out.append(keep)
        return out

    def _cosines(self, vector: np.ndarray, ids: list[int], stored: dict | None = None) -> list[float | None]:
        """Dense cosine of the query with each candidate (``stored`` vectors, read when not given; None where the
        index cannot say: e.g. an IVF index without a direct map, or a GPU index)."""
        stored = vector_store.stored_vectors(self.index, ids) if stored is None else stored
        return [None if stored.get(i) is None else round(float(vector @ stored[i]), 6) for i in ids]

    def close(self) -> None:
        """Release the store connection and the vector store's (a Milvus client; Milvus Lite's file)."""
        vector_store.close(self.index)
        self.engine.dispose()

    def _rerank(self, normalized: list[str], results: list[list[Retrieved]], depth: int,
                parsed: list[tuple[dict, dict[int, dict]]] | None, numbers: str = number_policy.DEFAULT) -> None:
        """Score each query's candidates with the cross-encoder and sort them best first.

        A stacked cross-encoder first cuts each pool to its ``depth`` most promising candidates by the
        feature head alone (plus the retrieval share of the ranking key), and its network — the largest part
        of a query's time — judges only the first NETWORK_DEPTH of those within NETWORK_GAP of the best (a
        candidate's answer depends on its query's pool, never on the other queries of the call); the features and
        the number conflicts are computed once for every step, from the ``parsed`` queries and candidates
        (:meth:`_parses`). ``numbers``: the number policy, applied to the probabilities and labels before the
        candidates are ordered.
        """
        cross = self.cross
        labels = cross.labels
        exact, partial = labels.index("exact_match"), labels.index("partial_match")
        firsts = [q for q, matches in zip(normalized, results) for _ in matches]
        seconds = [c.normalized for matches in results for c in matches]
        parsed_firsts = [query for (query, _), matches in zip(parsed, results) for _ in matches] if parsed else None
        parsed_seconds = [cs[c.id] for (_, cs), matches in zip(parsed, results) for c in matches] if parsed else None
        # each pair's number conflicts, read by the pair features and the number policy alike
        read = bool(parsed) and (cross.feature_head is not None or numbers == "strict")
        found = conflicts.number_conflicts_batch(parsed_firsts, parsed_seconds) if read else None
        pair_features, settled = None, None
        if cross.feature_head is not None:
            pair_features = features.pair_features_batch(firsts, seconds, parsed_firsts, parsed_seconds, found)
            if cross.uses_network:
                # feature-only P(exact), through the one softmax dispatch point the scorer uses
                prior = cross.probabilities(cross.feature_logits(pair_features))[:, exact]
                kept, settled, start = [], [], 0
                for matches in results:
                    rows = range(start, start + len(matches))
                    key = {r: prior[r] + RETRIEVAL_WEIGHT * matches[r - start].fused for r in rows}
                    best = sorted(rows, key=lambda r: -key[r])[:depth]
                    # the network judges the candidates that may yet come first: the NETWORK_DEPTH most promising
                    # within NETWORK_GAP of the best; the others keep the feature-only probabilities
                    judged = {r for r in best[:NETWORK_DEPTH] if key[r] >= key[best[0]] - NETWORK_GAP}
                    best.sort()
                    matches[:] = [matches[r - start] for r in best]
                    kept += best
                    settled += [r not in judged for r in best]
                    start = rows.stop
                firsts, seconds = [firsts[r] for r in kept], [seconds[r] for r in kept]
                parsed_firsts, parsed_seconds = [parsed_firsts[r] for r in kept], [parsed_seconds[r] for r in kept]
                found = [found[r] for r in kept]
                pair_features, settled = pair_features[kept], np.array(settled, dtype=bool)
        labelled = label_pairs(cross, firsts, seconds, parsed_firsts, parsed_seconds, numbers=numbers,
                               device=self.device, features=pair_features, runs=[len(matches) for matches in results],
                               settled=settled, found=found)
        row = 0
        for matches in results:
            rows = range(row, row + len(matches))
            ranks = []
            for c, r in zip(matches, rows):
                # ranked by the calibrated probabilities; shown with the label the most probable
                p, q, best = labelled.calibrated[r], labelled.shown[r], int(labelled.decided[r])
                c.match["label"] = labels[best]
                c.match["probability"] = round(float(q[best]), 6)
                c.match["probabilities"] = {label: round(float(v), 6) for label, v in zip(labels, q)}
                ranks.append(float(p[exact] + PARTIAL_WEIGHT * p[partial] + RETRIEVAL_WEIGHT * c.fused))
            row = rows.stop
            order = sorted(range(len(matches)), key=lambda i: (-ranks[i], -(matches[i].match["score"] or 0.0)))
            matches[:] = [matches[i] for i in order]


def open_resolver(
    index_dir: str | Path,
    *,
    db: str | None = None,
    model: str | Path | None = None,
    cross_model: str | Path | None = None,
    device: str | None = None,
    rerank: bool = True,
    backend: str | None = None,
    numbers: str | None = None,
    profile: str | None = None,
) -> Resolver:
    """Load the index directory's current generation (the database pointer decides which; its files never
    change once written, so a writer switching generations meanwhile cannot mix two); refuses a query
    model other than the one that built the index. ``numbers``: the number policy of its answers
    (:func:`index_numbers`); ``profile``: which bundled cross-encoder reranks (``--profile`` >
    ``MGEO_INDEX_PROFILE`` > the index's, from ``build --profile`` > accurate on a CUDA device > default; the index
    and its bi-encoder are the same for both)."""
    db_url = settings.database_url(index_dir, db)
    eng = store.connect(db_url)
    descriptor = index_json.current_descriptor(index_dir, eng, db_url)
    numbers = index_numbers(eng, descriptor, numbers)
    profile, profile_note = settings.profile(profile, store.catalog_profile(eng, descriptor["catalog"]))
    device = settings.device(device)
    bi, cross = load_for_index(descriptor, index_dir, model=model, cross_model=cross_model, device=device, engine=eng,
                               backend=backend, rerank=rerank, profile=profile)
    resolver = _on_generation(index_dir, eng, descriptor, bi, cross, device)
    resolver.numbers, resolver.profile, resolver.profile_note = numbers, profile, profile_note
    resolver.name_column = store.catalog_name_column(eng, descriptor["catalog"])
    return resolver


def index_numbers(engine, descriptor: dict, numbers: str | None = None) -> str:
    """The number policy of an index's answers: ``numbers`` when given, else ``MGEO_INDEX_NUMBERS``, else the one
    its catalog was built with, else strict (:func:`mgeo_index.settings.numbers`)."""
    return settings.numbers(numbers, recorded=store.catalog_numbers(engine, descriptor["catalog"]))


def reopen(resolver: Resolver, index_dir: str | Path, *, db: str | None = None) -> Resolver:
    """The index directory's current generation with ``resolver``'s models and store connection (after an
    ``add`` or ``remove``: nothing is loaded again but the index files)."""
    db_url = settings.database_url(index_dir, db)
    descriptor = index_json.current_descriptor(index_dir, resolver.engine, db_url)
    check_index_model(resolver.bi.fingerprint, resolver.bi.path, descriptor, index_dir)
    reopened = _on_generation(index_dir, resolver.engine, descriptor, resolver.bi, resolver.cross, resolver.device)
    reopened.numbers, reopened.profile, reopened.profile_note = resolver.numbers, resolver.profile, resolver.profile_note
    reopened.name_column = store.catalog_name_column(resolver.engine, descriptor["catalog"])
    return reopened


def _on_generation(index_dir, eng, descriptor: dict, bi: BiEncoder, cross: CrossEncoder | None, device: str) -> Resolver:
    index = vector_store.open_index(descriptor, index_dir, gpu=device.startswith("cuda"))
    sparse_file = descriptor.get("sparse_file")
    sparse = sparse_index.load(Path(index_dir) / sparse_file) if sparse_file else None
    return Resolver(bi=bi, cross=cross, index=index, engine=eng, descriptor=descriptor, device=device, sparse=sparse)


def top_matches_array(results: list[list[dict]], k: int) -> np.ndarray:
    """Entry ids of each query's matches (best first), padded with -1: for evaluation."""
    out = np.full((len(results), k), -1, dtype=np.int64)
    for row, matches in enumerate(results):
        for col, m in enumerate(matches[:k]):
            out[row, col] = m["id"]
    return out
