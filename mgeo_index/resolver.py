"""Retrieve → rerank → ranked matches: the query side of mgeo-index.

``open_resolver(index_dir)`` loads the index directory (FAISS file, store, the two models) once;
``Resolver.resolve(queries)`` runs every query of a call through the batched engine together:
one encode, one FAISS search, one store lookup, one cross-encoder pass.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mgeo_index import build as build_mod, engine, features, index as faiss_index, settings, store
from mgeo_index.model.bi_encoder import BiEncoder, load_bi_encoder
from mgeo_index.model.cross_encoder import CrossEncoder, load_cross_encoder
from mgeo_index.text import normalize

# Rank by expected relevance: an exact match counts 1, a partial match ½.
PARTIAL_WEIGHT = 0.5


class ModelMismatch(Exception):
    """The query model is not the model the index was built with."""


@dataclass
class Resolver:
    bi: BiEncoder
    cross: CrossEncoder | None
    index: object  # faiss.Index
    engine: object  # sqlalchemy.Engine
    manifest: dict
    device: str

    def resolve(
        self, queries: Sequence[str], *, top_k: int = 10, rerank: bool = True, explain: bool = False
    ) -> list[list[dict]]:
        """For each query, up to ``top_k`` matches, best first (see README for the fields).

        ``explain`` adds, per match, which address elements agree or differ (:func:`features.explain`).
        """
        normalized = [normalize(q) for q in queries]
        vectors = engine.encode(self.bi, normalized, device=self.device)
        scores, ids = faiss_index.search(self.index, vectors, top_k)
        entries = store.get_entries(self.engine, sorted({int(i) for i in ids.ravel() if i >= 0}))
        results: list[list[dict]] = []
        for row_scores, row_ids in zip(scores, ids):
            results.append(
                [
                    {
                        "id": int(i),
                        "source_id": entries[int(i)]["source_id"],
                        "address": entries[int(i)]["address"],
                        "score": round(float(s), 6),
                        "_normalized": entries[int(i)]["normalized"],
                    }
                    for s, i in zip(row_scores, row_ids)
                    if i >= 0 and int(i) in entries
                ]
            )
        if rerank and self.cross is not None:
            self._rerank(normalized, results)
        for query, matches in zip(normalized, results):
            for m in matches:
                candidate = m.pop("_normalized")
                if explain:
                    m["explain"] = features.explain(query, candidate)
        return results

    def _rerank(self, normalized: list[str], results: list[list[dict]]) -> None:
        firsts = [q for q, matches in zip(normalized, results) for _ in matches]
        seconds = [m["_normalized"] for matches in results for m in matches]
        probs = engine.score_pairs(self.cross, firsts, seconds, device=self.device)
        labels = self.cross.labels
        exact, partial = labels.index("exact_match"), labels.index("partial_match")
        row = 0
        for matches in results:
            for m in matches:
                p = probs[row]
                best = int(p.argmax())
                m["label"] = labels[best]
                m["probability"] = round(float(p[best]), 6)
                m["probabilities"] = {label: round(float(v), 6) for label, v in zip(labels, p)}
                m["_rank"] = float(p[exact] + PARTIAL_WEIGHT * p[partial])
                row += 1
            matches.sort(key=lambda m: (-m["_rank"], -m["score"]))
            for m in matches:
                m.pop("_rank")


def open_resolver(
    index_dir: str | Path,
    *,
    db: str | None = None,
    model: str | Path | None = None,
    cross_model: str | Path | None = None,
    device: str | None = None,
    rerank: bool = True,
) -> Resolver:
    """Load an index directory; refuses a query model other than the one that built the index."""
    manifest = build_mod.read_manifest(index_dir)
    device = settings.device(device)
    recorded = manifest.get("model_path")
    if model is None and settings.env("MODEL") is None and recorded and Path(recorded).is_dir():
        model = recorded  # default to the model that built the index when it is still there
    bi = load_bi_encoder(settings.bi_model_path(model)).to(device)
    if bi.fingerprint != manifest["model_fingerprint"]:
        raise ModelMismatch(
            f"the index in {index_dir} was built with model {manifest['model_fingerprint']} "
            f"({recorded}), but the query model {bi.path} is {bi.fingerprint}. Query with "
            f"--model {recorded} or rebuild the index with this model."
        )
    cross = load_cross_encoder(settings.cross_model_path(cross_model)).to(device) if rerank else None
    index = faiss_index.load(Path(index_dir) / manifest["index_file"], gpu=device.startswith("cuda"))
    faiss_index.set_search_params(index, nprobe=16, ef_search=128)
    eng = store.connect(settings.database_url(index_dir, db))
    return Resolver(bi=bi, cross=cross, index=index, engine=eng, manifest=manifest, device=device)


def top_matches_array(results: list[list[dict]], k: int) -> np.ndarray:
    """Entry ids of each query's matches (best first), padded with -1: for evaluation."""
    out = np.full((len(results), k), -1, dtype=np.int64)
    for row, matches in enumerate(results):
        for col, m in enumerate(matches[:k]):
            out[row, col] = m["id"]
    return out
