"""The index the service serves: loading, warming up and recognizing a new build (reload), and what the
batcher runs on it: whole batches through the resolver and the pair scorer.

The server holds one :class:`Loaded` at a time and replaces it in one assignment on reload; a batch
reads it once when it starts, so batches in flight finish on the index they started with.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from mgeo_index import settings
from mgeo_index.catalog import index_json
from mgeo_index.model import numbers as number_policy
from mgeo_index.query.resolver import Resolver, open_resolver
from mgeo_index.service.batcher import Submission
from mgeo_index.text import model_text, with_name

# Written unlike any catalog entry on purpose: warm-up must go through every stage of a resolve.
WARMUP_QUERIES = (
    "北京朝阳建国路88号",
    "广州市天河区柯木塱背坪村窑屋地西街四巷1号首层",
    "深圳南山中山路７５号东方科技园９号楼",
    "上海徐汇漕溪北路1号",
    "杭州市西湖区文三路478号华星时代广场A座",
)


def index_version(index_dir: str | Path, loaded: "Loaded", db: str | None = None) -> str:
    """What identifies the generation ``open_resolver`` would load now: the database pointer (the same
    source ``open_resolver`` reads; ``index.json`` is only its mirror), through the loaded resolver's
    store connection.

    The one place that knows how an index change shows: adapt it when the directory layout changes.
    """
    db_url = settings.database_url(index_dir, db)
    return descriptor_version(index_json.current_descriptor(index_dir, loaded.resolver.engine, db_url))


def descriptor_version(descriptor: dict) -> str:
    return f"{descriptor.get('build_id')}:{descriptor.get('index_file')}"


# The form of a cached answer: raised whenever the same index and models answer otherwise (here: names are read,
# and each match carries its entry's name and other catalog columns).
ANSWER_FORM = "a3"


@dataclass
class Loaded:
    resolver: Resolver
    version: str  # of the descriptor the resolver actually loaded

    @property
    def cache_version(self) -> str:
        """What cached answers are keyed by: the generation, the form of an answer (:data:`ANSWER_FORM`: a shared
        cache outlives an upgrade that answers otherwise), and the number policy and profile when they are not the
        defaults (servers sharing a cache with another policy or cross-encoder keep apart)."""
        numbers, profile = self.resolver.numbers, getattr(self.resolver, "profile", None) or "default"
        return (f"{self.version}:{ANSWER_FORM}" + ("" if numbers == number_policy.DEFAULT else f":numbers={numbers}")
                + ("" if profile == "default" else f":profile={profile}"))

    @property
    def build_id(self) -> str:
        return str(self.resolver.descriptor.get("build_id"))

    @property
    def entries(self) -> int:
        return int(self.resolver.index.ntotal)


def load(index_dir: str | Path, *, db=None, model=None, cross_model=None, device=None, numbers=None,
         profile=None) -> Loaded:
    """Open the index directory (always with the reranker: /v1/match needs it; ``numbers``: the number policy of
    resolve and match answers, default the index's). Warm it up before use, on the thread that computes batches (the
    server loads it aside: :func:`mgeo_index.service.lifecycle.aside`)."""
    resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device, rerank=True,
                             numbers=numbers, profile=profile)
    return Loaded(resolver=resolver, version=descriptor_version(resolver.descriptor))


def warm_up(resolver: Resolver, batch: int) -> None:
    """One lone query and one batch through encode, both searches, the store and the reranker."""
    resolver.resolve(WARMUP_QUERIES[:1])
    resolver.resolve([WARMUP_QUERIES[i % len(WARMUP_QUERIES)] for i in range(max(1, batch))], explain=True)
    score_pairs(resolver, [(WARMUP_QUERIES[0], WARMUP_QUERIES[1])], explain=True)


def score_pairs(resolver: Resolver, pairs: list[tuple[str, str]], explain: bool) -> list[dict]:
    """Labels (the cross-encoder's decision, as ``mgeo-index match`` gives them) and probabilities."""
    from mgeo_index.api import match_pairs

    return [result.to_dict() for result in match_pairs(resolver.cross, pairs, device=resolver.device, explain=explain,
                                                       numbers=resolver.numbers)]


def run_batch(loaded: Loaded, submissions: list[Submission]) -> list[tuple[str, list]]:
    """(version, per-item results) for each submission. Submissions with the same kind and parameters share one call:
    one resolve (one encode, one search, one rerank) or one score_pairs for all their items. A resolve item's result
    is ``(matches, answer)``: the matches as computed (what the cache keeps) and the answer with reviewers'
    decisions on top (:meth:`Resolver.apply_confirmations`: one store query for the whole batch)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, submission in enumerate(submissions):
        groups[(submission.kind, submission.params)].append(i)
    out: list = [None] * len(submissions)
    for (kind, params), members in groups.items():
        items = [item for i in members for item in submissions[i].items]
        if kind == "resolve":
            top_k, rerank, explain, retrieval = params
            # the cache keeps results without reviewers' decisions, which are applied again to every cached answer
            # (app.py): a new label shows at once
            resolver = loaded.resolver
            queries, names = [q for q, _ in items], [n for _, n in items]  # an item: (query, its place name or None)
            results = resolver.resolve(queries, top_k=top_k, rerank=rerank, explain=explain, retrieval=retrieval,
                                       confirmed=False, names=names)
            answers = resolver.apply_confirmations([model_text(with_name(q, n)) for q, n in items], results, top_k=top_k,
                                                   explain=explain, rerank=rerank)
            results = list(zip(results, answers))
        elif kind == "match":
            (explain,) = params
            results = score_pairs(loaded.resolver, items, explain)
        else:
            raise ValueError(f"unknown submission kind {kind!r}")
        start = 0
        for i in members:
            n = len(submissions[i].items)
            out[i] = (loaded.version, results[start : start + n])
            start += n
    return out
