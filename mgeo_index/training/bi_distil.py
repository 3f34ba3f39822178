"""Fine-tune the bi-encoder on hard negatives mined from the current retrieval, with the shipped cross-encoder's
scores as targets and as the judge of false negatives, so that dense retrieval alone comes closer to hybrid
(measured, not shipped: see the README's *Distilling the reranker into the bi-encoder*).

Stages, each resumable in ``out`` (outside the work tree, default ``~/.cache/mgeo-index/bi-distil``):

1. ``pools`` — for each training query (the train split of both CCKS files against the CCKS catalog,
   ``shenzhen_queries`` Shenzhen train-split queries against the Shenzhen catalog, ``--unlabelled`` N
   unlabelled addresses against the CCKS catalog) the union of the bi-encoder's dense top ``pool_k`` and the
   character n-gram top ``pool_k`` over its catalog, plus the catalog entries the query is labelled against;
   every (query, candidate) is scored by the shipped cross-encoder (feature head, network, cascade: what
   ``resolve`` reranks with). Written once to ``out/pools.npz``.
2. ``train`` — the bi-encoder fine-tuned from its weights. Each step draws ``ccks_share`` of its pool queries
   from the CCKS ones and the rest from Shenzhen's, plus ``tagged_share`` of the batch of the original recipe's
   tagged-address augmentations (so what it knew is kept). A query's positive is its labelled gold (with
   ``pseudo_positive_min``, else an unlabelled candidate the cross-encoder calls ``exact_match`` with at least
   that P), with ``negatives`` candidates drawn from its pool; the loss is InfoNCE of the positive against
   every other document of the batch, where a pool candidate the cross-encoder finds relevant (``P(exact) +
   0.3·P(partial)`` ≥ 0.5, half-way to the human label where there is one) is not a negative, plus
   ``kl_weight`` × the KL from the cross-encoder's distribution over the query's list to the bi-encoder's
   (cosine / 0.05). Checkpoints every ``checkpoint_minutes``; every ``eval_minutes`` the dense recall@10 and
   MRR@10 of the calibration split's queries (CCKS and Shenzhen, each over its catalog) are measured and the
   best weights kept.
3. ``export`` — the best weights as a bi-encoder directory (FP16), with the dev split's dense figures before
   and after.

Run: ``OMP_NUM_THREADS=1 nohup python -m mgeo_index.training.bi_distil --data ../shared/data --minutes 28
--export runs/bi-distil > bi-distil.log &``; the figures of every stage are in ``out/bi_distil.json``. The
defaults are the variant that measured best (no KL term, labelled positives only).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mgeo_index import settings
from mgeo_index.runtime import inference
from mgeo_index.query import labelling
from mgeo_index.measure.evaluate import evaluate_dense_retrieval
from mgeo_index.files import replace_atomic, write_json_atomic
from mgeo_index.model.bi_encoder import BiEncoder, load_bi_encoder
from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of
from mgeo_index.text import normalize
from mgeo_index.training import data
from mgeo_index.training.loops import (checkpoint_of, record_stage, resolve_precision, restore_checkpoint, save_atomic,
                                      timed_loop)

EXACT, PARTIAL = LABELS.index("exact_match"), LABELS.index("partial_match")
TEMPERATURE = 0.05  # the bi-encoder's InfoNCE temperature (training.train.stage_bi)


@dataclass
class DistilConfig:
    data_dir: Path
    out: Path = field(default_factory=lambda: settings.cache_dir() / "bi-distil")
    bi_model: Path = settings.DEFAULT_BI_MODEL
    cross_model: Path = settings.DEFAULT_CROSS_MODEL
    pool_bi_model: Path | None = None  # the bi-encoder whose dense lists the pools hold (None: bi_model)
    minutes: float = 40.0
    lr: float = 2e-5
    batch: int = 32  # queries per step
    negatives: int = 7  # pool candidates per query and step besides its positive
    pool_k: int = 12  # dense top-k and n-gram top-k of each query
    shenzhen_queries: int = 6000  # Shenzhen train-split queries (of ~19,000)
    unlabelled: int = 0  # unlabelled addresses against the CCKS catalog
    max_queries: int = 0  # a random subset of that many queries (0: all; for trials)
    pseudo_positive_min: float | None = None  # P(exact) that makes an unlabelled candidate a positive (None: never)
    tagged_share: float = 0.25
    ccks_share: float = 0.5  # of each batch's pool queries, the share drawn from the CCKS ones
    kl_weight: float = 0.0  # measured: 1.0 and 0.2 lower CCKS dense recall (the README)
    checkpoint_minutes: float = 5.0
    eval_minutes: float = 8.0
    precision: str = "auto"
    seed: int = 0
    log: object = print


def _record(cfg: DistilConfig, stage: str, stats: dict) -> None:
    record_stage(cfg.out / "bi_distil.json", cfg, stage, stats)


def _save_arrays(tmp: str, array: np.ndarray | None = None, **arrays: np.ndarray) -> None:
    """One array as .npy, or named arrays as .npz, into the open temporary file of :func:`replace_atomic`."""
    with open(tmp, "wb") as fh:
        np.save(fh, array) if array is not None else np.savez(fh, **arrays)


# ---- stage 1: pools ------------------------------------------------------------------------------------


def catalogs_of(cfg: DistilConfig) -> dict[str, list[str]]:
    """The two catalogs, normalized and without repeats: what pools and evaluations search."""
    return {"ccks": list(dict.fromkeys(normalize(t) for t in data.ccks_catalog(cfg.data_dir))),
            "shenzhen": list(dict.fromkeys(normalize(t) for t in data.shenzhen_catalog(cfg.data_dir)))}


def training_queries(cfg: DistilConfig, rng: random.Random) -> list[tuple[str, str, dict[str, str]]]:
    """(catalog name, normalized query, {normalized labelled candidate: label}) for the train split."""
    by_query: dict[tuple[str, str], dict[str, str]] = {}
    ccks = data.ccks_pairs(cfg.data_dir) + data.ccks_extra_pairs(cfg.data_dir)
    for p in ccks:
        if split_of(p.group) == "train":
            by_query.setdefault(("ccks", normalize(p.a)), {})[normalize(p.b)] = p.label
    shenzhen: dict[str, dict[str, str]] = {}
    for p in data.shenzhen_pairs(cfg.data_dir) + data.shenzhen_train_pairs(cfg.data_dir):
        if split_of(p.group) == "train":
            shenzhen.setdefault(normalize(p.a), {})[normalize(p.b)] = p.label
    picked = sorted(shenzhen)
    rng.shuffle(picked)
    for q in picked[: cfg.shenzhen_queries]:
        by_query[("shenzhen", q)] = shenzhen[q]
    if cfg.unlabelled:
        texts = sorted({normalize(t) for t in data.unlabeled_addresses(cfg.data_dir)})
        for q in rng.sample(texts, min(cfg.unlabelled, len(texts))):
            by_query.setdefault(("ccks", q), {})
    queries = [(name, q, labelled) for (name, q), labelled in by_query.items()]
    return rng.sample(queries, cfg.max_queries) if 0 < cfg.max_queries < len(queries) else queries


def mine_pools(cfg: DistilConfig, bi: BiEncoder, cross) -> dict[str, np.ndarray]:
    """Each query's pool (dense ∪ n-gram top ``pool_k`` ∪ its labelled candidates) scored by ``cross``.

    Returns (and keeps in ``out/pools.npz``): ``queries`` / ``documents`` (normalized texts; documents are the
    catalogs one after the other), ``query_catalog`` (each query's catalog name), one row per (query,
    candidate): ``q``, ``d``, ``gold`` (the labelled label's index, -1 where none) and ``probs`` (n, 3) in LABELS
    order. Scoring goes by chunks kept in ``out/scores/``, so an interrupted run scores only what it had not.
    The pools are mined once per ``out``: other pool settings or models want another ``--out``."""
    import faiss

    from mgeo_index.index.sparse import build_sparse

    path = cfg.out / "pools.npz"
    if path.exists():
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    rng = random.Random(cfg.seed)
    catalogs = catalogs_of(cfg)
    queries = training_queries(cfg, rng)
    documents: list[str] = []
    rows_q, rows_d, rows_gold = [], [], []
    for name, catalog in catalogs.items():
        offset, where = len(documents), {t: j for j, t in enumerate(catalog)}
        documents.extend(catalog)
        mine = [(i, q, labelled) for i, (n, q, labelled) in enumerate(queries) if n == name]
        if not mine:
            continue
        started = time.perf_counter()
        texts = [q for _, q, _ in mine]
        _, dense = faiss.knn(inference.encode(bi, texts), inference.encode(bi, catalog), cfg.pool_k)
        _, ngram = build_sparse(catalog, np.arange(len(catalog))).search(texts, cfg.pool_k)
        for r, (i, q, labelled) in enumerate(mine):
            members = [int(j) for j in (*dense[r], *ngram[r]) if j >= 0] + [where[t] for t in labelled if t in where]
            for j in dict.fromkeys(members):
                if catalog[j] != q:  # the query itself in the catalog teaches nothing
                    rows_q.append(i)
                    rows_d.append(offset + j)
                    rows_gold.append(LABELS.index(labelled[catalog[j]]) if catalog[j] in labelled else -1)
        cfg.log(f"[pools] {name}: {len(mine)} queries, {len(rows_q)} pairs so far, mined in {time.perf_counter() - started:.0f} s")
    q_idx, d_idx = np.asarray(rows_q, dtype=np.int32), np.asarray(rows_d, dtype=np.int32)
    chunks, chunk = cfg.out / "scores", 20000
    chunks.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    probs = []
    for start in range(0, len(q_idx), chunk):
        part = chunks / f"{start:08d}-{len(q_idx)}.npy"
        if not part.exists():
            scored = labelling.score_pairs(cross, [queries[i][1] for i in q_idx[start : start + chunk]],
                                           [documents[j] for j in d_idx[start : start + chunk]])
            replace_atomic(part, lambda tmp, s=scored: _save_arrays(tmp, s.astype(np.float32)))
            cfg.log(f"[pools] scored {min(start + chunk, len(q_idx))} of {len(q_idx)} pairs "
                    f"({time.perf_counter() - started:.0f} s)")
        probs.append(np.load(part))
    scores = np.concatenate(probs)[:, [cross.labels.index(label) for label in LABELS]]  # columns in LABELS order
    pools = {"queries": np.array([q for _, q, _ in queries]), "query_catalog": np.array([n for n, _, _ in queries]),
             "documents": np.array(documents),
             "q": q_idx, "d": d_idx, "gold": np.asarray(rows_gold, dtype=np.int8), "probs": scores}
    replace_atomic(path, lambda tmp: _save_arrays(tmp, **pools))
    _record(cfg, "pools", {"queries": len(queries), "pairs": int(len(q_idx)), "minutes_scoring": (time.perf_counter() - started) / 60,
                           "queries_by_catalog": {n: sum(1 for m, *_ in queries if m == n) for n in catalogs}})
    return pools


# ---- stage 2: train ------------------------------------------------------------------------------------


@dataclass
class Query:
    text: str
    catalog: str  # "ccks" or "shenzhen"
    rows: np.ndarray  # the document index of each pool member
    relevance: np.ndarray  # the target's relevance of each pool member
    positive: int  # position in rows of the positive, -1 where none


def relevance_of(probs: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """The cross-encoder's P(exact) + 0.3·P(partial), half-way to the human label where the pair has one."""
    r = probs[:, EXACT] + 0.3 * probs[:, PARTIAL]
    labelled = gold >= 0
    human = np.select([gold == EXACT, gold == PARTIAL], [1.0, 0.3], 0.0)
    return np.where(labelled, 0.5 * r + 0.5 * human, r).astype(np.float32)


def query_lists(pools: dict[str, np.ndarray], cfg: DistilConfig, rng: random.Random) -> list[Query]:
    """Each query's pool with its targets and positive (labelled gold first, else a confident unlabelled one)."""
    relevance = relevance_of(pools["probs"], pools["gold"])
    order = np.argsort(pools["q"], kind="stable")
    bounds = np.flatnonzero(np.diff(pools["q"][order])) + 1
    out = []
    for members in np.split(order, bounds):
        if not len(members):
            continue
        gold, p_exact = pools["gold"][members], pools["probs"][members, EXACT]
        golds = np.flatnonzero(gold == EXACT)
        threshold = np.inf if cfg.pseudo_positive_min is None else cfg.pseudo_positive_min
        unlabelled = np.flatnonzero((gold < 0) & (p_exact >= threshold))
        positive = int(rng.choice(golds.tolist())) if len(golds) else (
            int(unlabelled[np.argmax(p_exact[unlabelled])]) if len(unlabelled) else -1)
        q = pools["q"][members[0]]
        out.append(Query(str(pools["queries"][q]), str(pools["query_catalog"][q]), pools["d"][members], relevance[members], positive))
    return out


def batch_loss(bi: BiEncoder, queries: list[Query], tagged: list[tuple[str, str]], documents: np.ndarray,
               cfg: DistilConfig, rng: random.Random, device: str = "cpu") -> torch.Tensor:
    """KL to the cross-encoder over each query's list + InfoNCE of the positives against the whole batch."""
    lists, docs, doc_ids = [], [], []  # lists: (first doc, count, positive or -1, targets or None)
    for q in queries:
        others = [i for i in range(len(q.rows)) if i != q.positive]
        picked = ([q.positive] if q.positive >= 0 else []) + rng.sample(others, min(cfg.negatives, len(others)))
        lists.append((len(docs), len(picked), 0 if q.positive >= 0 else -1, torch.tensor(q.relevance[picked])))
        docs += [str(documents[q.rows[i]]) for i in picked]
        doc_ids += [int(q.rows[i]) for i in picked]
    for messy, clean in tagged:
        lists.append((len(docs), 1, 0, None))
        docs.append(clean)
        doc_ids.append(-1 - len(doc_ids))  # never the same as another document
    texts = [q.text for q in queries] + [messy for messy, _ in tagged]

    def embed(batch: list[str]) -> torch.Tensor:
        enc = bi.tokenizer(batch, padding=True, truncation=True, max_length=bi.max_length, return_tensors="pt")
        return F.normalize(bi(**{k: v.to(device) for k, v in enc.items()}).float(), dim=-1)

    with inference._autocast(device, resolve_precision(cfg.precision)):
        qv, dv = embed(texts), embed(docs)
    sims = qv @ dv.T / TEMPERATURE  # (Q, D)
    ids = torch.tensor(doc_ids)
    kl, nce, n_kl, n_nce = sims.new_zeros(()), sims.new_zeros(()), 0, 0
    for r, (first, count, positive, relevance) in enumerate(lists):
        own = sims[r, first : first + count]
        if relevance is not None and count > 1:
            target = torch.log_softmax(torch.log(relevance + 1e-3), 0)
            kl = kl + F.kl_div(torch.log_softmax(own, 0), target, log_target=True, reduction="sum")
            n_kl += 1
        if positive >= 0:
            row = sims[r].clone()
            hit = first + positive
            blocked = ids == ids[hit]  # the same document elsewhere in the batch
            if relevance is not None:  # the own list's other members the cross-encoder also finds relevant
                close = torch.zeros_like(blocked)
                close[first : first + count] = relevance >= 0.5
                blocked |= close
            blocked[hit] = False
            row = row.masked_fill(blocked, float("-inf"))
            nce = nce + F.cross_entropy(row[None], torch.tensor([hit]))
            n_nce += 1
    return cfg.kl_weight * kl / max(n_kl, 1) + nce / max(n_nce, 1)


def calib_queries(cfg: DistilConfig, split: str = "calib") -> dict[str, tuple[list[str], list[str], list[set[int]]]]:
    """Per catalog: (catalog, queries, gold positions) of ``split``'s queries with a gold entry in it."""
    catalogs = catalogs_of(cfg)
    pairs = {"ccks": data.ccks_pairs(cfg.data_dir), "shenzhen": data.shenzhen_pairs(cfg.data_dir)}
    out = {}
    for name, catalog in catalogs.items():
        where = {t: j for j, t in enumerate(catalog)}
        gold: dict[str, set[int]] = {}
        for p in pairs[name]:
            if p.label == "exact_match" and split_of(p.group) == split and normalize(p.b) in where:
                gold.setdefault(normalize(p.a), set()).add(where[normalize(p.b)])
        out[name] = (catalog, list(gold), list(gold.values()))
    return out


def dense_retrieval(bi: BiEncoder, sets: dict, cfg: DistilConfig) -> dict[str, dict]:
    """Dense recall@1/5/10 and MRR@10 of each catalog's queries over it (exact search), encoded in the precision
    the stage trains in (``cfg.precision``)."""
    bi.eval()
    precision = resolve_precision(cfg.precision)
    out = {name: evaluate_dense_retrieval(bi, queries, catalog, gold, precision=precision)
           for name, (catalog, queries, gold) in sets.items()}
    bi.train()
    return out


def selection_score(report: dict[str, dict]) -> float:
    """What the kept weights maximize: CCKS recall@10 + MRR@10 (the gap to hybrid), Shenzhen MRR@10 at half."""
    return report["ccks"]["recall@10"] + report["ccks"]["mrr@10"] + 0.5 * report["shenzhen"]["mrr@10"]


def stage_train(cfg: DistilConfig, pools: dict[str, np.ndarray]) -> Path:
    best_path, ckpt = cfg.out / "best.pt", cfg.out / "checkpoint.pt"
    if (cfg.out / "train_done.json").exists():
        return best_path
    rng = random.Random(cfg.seed + 1)
    torch.manual_seed(cfg.seed + 1)
    bi = load_bi_encoder(cfg.bi_model, trainable=True).train()
    optimizer = torch.optim.AdamW(bi.parameters(), lr=cfg.lr, weight_decay=0.01)
    queries = query_lists(pools, cfg, random.Random(cfg.seed))
    tagged = [t["elements"] for t in data.tagged_addresses(cfg.data_dir) if t.get("split", "train") == "train" and t.get("elements")]
    sets = calib_queries(cfg)
    state = {"step": 0, "elapsed": 0.0, "best": None, "evals": []}
    if ckpt.exists():
        saved = restore_checkpoint(ckpt, bi, optimizer, rng)
        state = {key: saved[key] for key in ("step", "elapsed", "best", "evals")}
        cfg.log(f"[train] resuming at step {state['step']} ({state['elapsed'] / 60:.1f} min done)")
    else:
        report = dense_retrieval(bi, sets, cfg)
        state["evals"].append({"step": 0, "minutes": 0.0, **report})
        state["best"] = {"score": selection_score(report), "step": 0}
        save_atomic(bi.state_dict(), best_path)
        cfg.log(f"[train] start: {report}")
    n_tagged = round(cfg.batch * cfg.tagged_share)
    with_positive = sum(q.positive >= 0 for q in queries)
    cfg.log(f"[train] {len(queries)} queries ({with_positive} with a positive), {len(tagged)} tagged addresses")
    last_eval = [time.perf_counter()]

    # with no KL term, a query without a positive teaches nothing
    usable = [q for q in queries if q.positive >= 0 or cfg.kl_weight > 0]
    by_catalog = {name: [q for q in usable if q.catalog == name] for name in ("ccks", "shenzhen")}
    n_ccks = round((cfg.batch - n_tagged) * cfg.ccks_share) if all(by_catalog.values()) else None

    def step():
        if n_ccks is None:
            picked = rng.sample(usable, min(cfg.batch - n_tagged, len(usable)))
        else:
            picked = (rng.sample(by_catalog["ccks"], min(n_ccks, len(by_catalog["ccks"])))
                      + rng.sample(by_catalog["shenzhen"], min(cfg.batch - n_tagged - n_ccks, len(by_catalog["shenzhen"]))))
        views = [data.augment_tagged(rng.choice(tagged), rng) for _ in range(n_tagged)]
        return batch_loss(bi, picked, [(normalize(messy), normalize(clean)) for messy, clean in views],
                          pools["documents"], cfg, rng)

    def checkpoint(steps: int, elapsed: float) -> None:
        state.update(step=steps, elapsed=elapsed)
        if time.perf_counter() - last_eval[0] >= cfg.eval_minutes * 60:
            evaluate(steps, elapsed)
        save_atomic(checkpoint_of(bi, optimizer, rng, steps, elapsed, best=state["best"], evals=state["evals"]), ckpt)

    def evaluate(steps: int, elapsed: float) -> None:
        report = dense_retrieval(bi, sets, cfg)
        score = selection_score(report)
        state["evals"].append({"step": steps, "minutes": elapsed / 60, **report})
        cfg.log(f"[train] step {steps} ({elapsed / 60:.1f} min): calib ccks {report['ccks']} shenzhen "
                f"{report['shenzhen']['mrr@10']:.4f}; score {score:.4f} (best {state['best']['score']:.4f})")
        if score > state["best"]["score"]:
            state["best"] = {"score": score, "step": steps, "minutes": elapsed / 60}
            save_atomic(bi.state_dict(), best_path)
        last_eval[0] = time.perf_counter()

    steps, elapsed = timed_loop("bi-distil", cfg.minutes, cfg.lr, optimizer, step, cfg.log, start_step=state["step"],
                                start_elapsed=state["elapsed"], checkpoint=checkpoint,
                                checkpoint_every=cfg.checkpoint_minutes * 60)
    if state["evals"][-1]["step"] != steps:
        evaluate(steps, elapsed)
    last_eval[0] = time.perf_counter()  # the final checkpoint: a larger budget later continues from here
    checkpoint(steps, elapsed)
    _record(cfg, "train", {"steps": steps, "minutes": elapsed / 60, "queries": len(queries),
                           "queries_with_positive": with_positive, "best": state["best"], "evals": state["evals"]})
    write_json_atomic(cfg.out / "train_done.json", state["best"])
    return best_path


# ---- stage 3: export -----------------------------------------------------------------------------------


def export(cfg: DistilConfig, best_path: Path, target: Path) -> dict:
    """The kept weights as a bi-encoder directory, with the dev split's dense figures before and after."""
    bi = load_bi_encoder(cfg.bi_model)
    bi.load_state_dict(torch.load(best_path, weights_only=False))
    bi.eval().save(target)
    bi = load_bi_encoder(target)  # as it ships: FP16 weights
    shipped = load_bi_encoder(cfg.bi_model)
    sets = calib_queries(cfg, "dev")
    stats = {"dev": {"distilled": dense_retrieval(bi, sets, cfg), "before": dense_retrieval(shipped, sets, cfg)}}
    _record(cfg, "export", {"to": str(target), **stats})
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data directory")
    parser.add_argument("--out", type=Path, default=None, help="pools and checkpoints (outside the work tree)")
    parser.add_argument("--export", type=Path, default=None, help="write the distilled bi-encoder here when done")
    parser.add_argument("--bi-model", type=Path, default=DistilConfig.bi_model)
    parser.add_argument("--cross-model", type=Path, default=DistilConfig.cross_model)
    parser.add_argument("--pool-bi-model", type=Path, default=None,
                        help="mine the pools' dense lists with this bi-encoder (default: --bi-model), e.g. the "
                             "shipped one when --bi-model is an untrained tower (training.teacher --tower-layers)")
    for name in ("batch", "negatives", "pool_k", "shenzhen_queries", "unlabelled", "max_queries", "seed"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(DistilConfig, name))
    for name in ("minutes", "lr", "tagged_share", "ccks_share", "kl_weight", "checkpoint_minutes", "eval_minutes"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(DistilConfig, name))
    parser.add_argument("--pseudo-positive-min", type=float, default=None,
                        help="an unlabelled pool candidate with at least this P(exact) is a query's positive")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    args = vars(parser.parse_args(argv))
    target = args.pop("export")
    out = args.pop("out")
    cfg = DistilConfig(data_dir=args.pop("data"), log=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True),
                       **({"out": out} if out else {}), **args)
    cfg.out.mkdir(parents=True, exist_ok=True)
    from mgeo_index.model.cross_encoder import load_cross_encoder

    started = time.perf_counter()
    pools = mine_pools(cfg, load_bi_encoder(cfg.pool_bi_model or cfg.bi_model), load_cross_encoder(cfg.cross_model))
    cfg.log(f"[pools] {len(pools['queries'])} queries, {len(pools['q'])} pairs ({(time.perf_counter() - started) / 60:.1f} min)")
    best = stage_train(cfg, pools)
    if target is not None:
        print(json.dumps(export(cfg, best, target), indent=2))


if __name__ == "__main__":
    main()
