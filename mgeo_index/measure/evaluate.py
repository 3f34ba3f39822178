"""`mgeo-index eval`: pair classification and retrieval quality, measured the same way everywhere.

Pair files: CCKS style (``query, candidate, label`` with the three labels, optional ``query_id``) or
Shenzhen style (``addr1, addr2, label`` with 1 = same place → exact_match, 0 → not_match), TSV or
CSV, optionally gzipped. ``split`` keeps only the rows whose group (query_id, else the first address)
falls in that split of :func:`mgeo_index.measure.splits.split_of`, so figures on the shared data are
reported on the dev split the shipped networks never trained on, and beside it on the holdout split no choice
was made on (``--split dev,holdout``).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from mgeo_index import settings
from mgeo_index.runtime import inference
from mgeo_index.catalog.reader import CatalogError, detect_encoding, open_text
from mgeo_index.measure.metrics import classification_report, expected_calibration_error, retrieval_report
from mgeo_index.settings import LABELS
from mgeo_index.text import normalize
from mgeo_index.measure.splits import SPLITS as PAIR_SPLITS, split_of

_BINARY = {"1": "exact_match", "0": "not_match"}


SPLITS = (*PAIR_SPLITS, "all")


def split_names(value: str) -> list[str]:
    """``--split``'s value: one split or several, comma-separated (``dev,holdout``), each checked."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    for name in names or [value]:
        if name not in SPLITS:
            raise ValueError(f"--split must be one of {', '.join(SPLITS)} (or several, comma-separated: dev,holdout), "
                             f"not {name!r}")
    return list(dict.fromkeys(names))


def _open_text(path: Path, split: str):
    """The file in its own encoding (UTF-8, with BOM, UTF-16 or GB18030: detected), after checking ``split`` (one)."""
    if split_names(split) != [split]:
        raise ValueError(f"one split at a time here, not {split!r}")
    return open_text(path, detect_encoding(path))


def read_labeled_pairs(path: str | Path, split: str = "all", source: str | None = None) -> tuple[list[str], list[str], list[int]]:
    """(first addresses, second addresses, gold label indices) from a CCKS- or Shenzhen-style file;
    ``source`` keeps the rows whose ``split_source`` column is that (CCKS: round1_train_fold0,
    round2_train, round1_train_tail)."""
    path = Path(path)
    with _open_text(path, split) as fh:
        header = fh.readline()
        delimiter = "\t" if "\t" in header else ","
        columns = next(csv.reader([header], delimiter=delimiter))
        for first, second in (("query", "candidate"), ("addr1", "addr2"), ("a", "b")):
            if first in columns and second in columns and "label" in columns:
                break
        else:
            raise CatalogError(
                f"{path}: expected columns query, candidate, label (CCKS style) or addr1, addr2, label "
                f"(Shenzhen style); found {columns}"
            )
        a, b, gold = [], [], []
        for line, row in enumerate(csv.DictReader(fh, fieldnames=columns, delimiter=delimiter, quoting=csv.QUOTE_NONE), 2):
            label = _BINARY.get(row["label"], row["label"])
            if label not in LABELS:
                raise CatalogError(f"{path} line {line}: label {row['label']!r} is not one of {LABELS} or 0/1")
            if split != "all" and split_of(row.get("query_id") or row[first]) != split:
                continue
            if source is not None and row.get("split_source") != source:
                continue
            a.append(row[first])
            b.append(row[second])
            gold.append(LABELS.index(label))
    return a, b, gold


def evaluate_pairs(cross, a: list[str], b: list[str], gold: list[int], *, device: str | None = None,
                   grouped: bool = True, numbers: str | None = None) -> dict:
    """The report of ``mgeo-index eval pairs``; ``grouped``: consecutive pairs sharing their first address are a
    query's candidates, labelled together by the model's group head (:mod:`mgeo_index.model.group_head`), as
    ``mgeo-index match`` does (the same :func:`mgeo_index.query.match.score_sides`); False: every pair alone.
    ``numbers``: the number policy (:mod:`mgeo_index.model.numbers`)."""
    from mgeo_index.query.match import score_sides
    from mgeo_index.text import model_text

    probs, decided, _ = score_sides(cross, [model_text(x) for x in a], [model_text(y) for y in b], device=device,
                                    grouped=grouped, numbers=numbers)
    order = [cross.labels.index(label) for label in LABELS]  # report columns in LABELS order
    predicted = [LABELS.index(cross.labels[i]) for i in decided]
    probs = probs[:, order]
    report = classification_report(gold, predicted, LABELS)
    report["ece"] = expected_calibration_error(probs, gold)
    report["_probs"] = probs
    return report


def evaluate_variants(cross, pairs: dict[str, list[tuple[str, str, str]]], *, device: str | None = None,
                      numbers: str | None = None) -> dict:
    """How the model labels a test set of addresses paired with variants of themselves, each pair alone — the number
    test set (:func:`mgeo_index.measure.number_set.number_pairs`: parts ``changed``, another place; ``controls``, the
    same place written otherwise; ``holds``, a range or list and one of its numbers) or the name test set
    (:func:`mgeo_index.measure.name_set.name_pairs`): per part its pairs, the share labelled ``exact_match`` and the
    share whose parses conflict (:func:`mgeo_index.compare.conflicts.conflicts`; for the controls and holds: conflicts
    that are not one), overall and by kind."""
    from mgeo_index.compare.conflicts import conflicts
    from mgeo_index.compare.features import parse_distinct
    from mgeo_index.query.match import score_sides
    from mgeo_index.text import model_text

    exact = cross.labels.index("exact_match")
    report = {}
    for part, rows in pairs.items():
        if not rows:
            report[part] = {"pairs": 0, "exact_match": None, "conflict": None, "by_kind": {}}
            continue
        a, b = [model_text(x) for x, _, _ in rows], [model_text(y) for _, y, _ in rows]
        _, decided, _ = score_sides(cross, a, b, device=device, numbers=numbers)
        parsed = parse_distinct(a + b)
        conflict = [bool(conflicts(pa, pb)) for pa, pb in zip(parsed[: len(a)], parsed[len(a):])]
        by_kind: dict[str, list[tuple[int, int]]] = {}
        for (_, _, kind), d, c in zip(rows, decided, conflict):
            by_kind.setdefault(kind, []).append((int(d == exact), int(c)))
        report[part] = {
            "pairs": len(rows),
            "exact_match": round(float(np.mean(decided == exact)), 4),
            "conflict": round(float(np.mean(conflict)), 4),
            "by_kind": {k: {"pairs": len(v), "exact_match": round(float(np.mean([e for e, _ in v])), 4),
                            "conflict": round(float(np.mean([c for _, c in v])), 4)}
                        for k, v in sorted(by_kind.items())},
        }
    return report


def reliability_diagram(probs: np.ndarray, gold: list[int], path: str | Path, bins: int = 10) -> None:
    """Top-label confidence vs accuracy per bin, with the bin sizes: a PNG for people."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # optional dependency
        raise ImportError("the reliability diagram needs matplotlib: pip install 'mgeo-index[eval]'") from exc
    confidence = probs.max(1)
    correct = probs.argmax(1) == np.asarray(gold)
    edges = np.linspace(0, 1, bins + 1)
    centers, accuracy, counts = [], [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (confidence > lo) & (confidence <= hi)
        if mask.any():
            centers.append(confidence[mask].mean())
            accuracy.append(correct[mask].mean())
            counts.append(int(mask.sum()))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=[3, 1], sharex=True)
    top.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
    top.plot(centers, accuracy, "o-", label="mgeo-index")
    top.set_ylabel("accuracy")
    top.set_title(f"Reliability (ECE {expected_calibration_error(probs, gold):.3f}, n={len(gold)})")
    top.legend(loc="upper left")
    bottom.bar(centers, counts, width=0.08)
    bottom.set_xlabel("confidence of the predicted label")
    bottom.set_ylabel("pairs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_gold_queries(path: str | Path, split: str = "all") -> tuple[list[str], list[list[str]]]:
    """(queries, gold catalog addresses of each query): one item per distinct query.

    A CCKS pairs file gives each query (by ``query_id``) all its ``exact_match`` candidates; a Shenzhen
    file each ``addr1`` all its label-1 ``addr2``; a TSV ``query, gold`` may repeat a query on several
    rows. A query with several gold entries (the same place listed more than once in the catalog) is
    found when any of them is retrieved.
    """
    path = Path(path)
    with _open_text(path, split) as fh:
        reader = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        columns = reader.fieldnames or []
        if {"query", "candidate", "label"} <= set(columns):
            rows = [(r["query"], r["candidate"], r.get("query_id") or r["query"]) for r in reader if r["label"] == "exact_match"]
        elif {"addr1", "addr2", "label"} <= set(columns):  # Shenzhen style: label 1 = same place
            rows = [(r["addr1"], r["addr2"], r["addr1"]) for r in reader if r["label"] == "1"]
        elif {"query", "gold"} <= set(columns):
            rows = [(r["query"], r["gold"], r["query"]) for r in reader]
        else:
            raise CatalogError(f"{path}: expected columns query, gold (or a CCKS pairs file); found {columns}")
    grouped: dict[str, tuple[str, list[str]]] = {}
    for query, gold, group in rows:
        if split == "all" or split_of(group) == split:
            grouped.setdefault(group, (query, []))[1].append(gold)
    return [q for q, _ in grouped.values()], [golds for _, golds in grouped.values()]


def gold_entry_ids(resolver, golds: list[list[str]]) -> list[set[int]]:
    """The entry ids of each query's gold addresses in the resolver's catalog, found by normalized address (an
    empty set where none of them is in it)."""
    from mgeo_index import store

    catalog_id = store.catalog_id(resolver.engine, resolver.descriptor["catalog"])
    normalized = [[normalize(g) for g in gs] for gs in golds]
    flat = [g for gs in normalized for g in gs]
    ids = dict(zip(flat, store.ids_by_normalized(resolver.engine, catalog_id, flat)))
    return [{ids[g] for g in gs} - {None} for gs in normalized]


def evaluate_retrieval(
    resolver, queries: list[str], golds: list[list[str]], *, top_k: int = settings.DEFAULT_TOP_K, retrieval: str = "hybrid",
    admin_filter: bool = False, rerank_depth: int | None = None,
) -> dict:
    """recall@1/5/10 and MRR@10 of retrieval alone and after reranking; gold found by normalized address. After
    reranking also ``top1_exact``, the share of queries whose first answer is labelled ``exact_match``, and
    ``top1_exact_wrong``, the share of those whose first answer is not a gold entry (another place called the
    place: what a normalize job would tie a row to).

    ``golds[i]`` lists the gold addresses of ``queries[i]``; the query counts as found at the first
    rank holding any of them. Queries none of whose gold addresses is in the catalog are left out.
    """
    gold_sets = gold_entry_ids(resolver, golds)
    keep = [i for i, found in enumerate(gold_sets) if found]
    if not keep:
        raise CatalogError("none of the gold addresses is in the index's catalog")
    queries = [queries[i] for i in keep]
    gold = [gold_sets[i] for i in keep]
    report = {"queries": len(golds), "gold_in_catalog": len(keep), "method": retrieval, "admin_filter": admin_filter,
              "rerank_depth": rerank_depth}
    for name, rerank in (("retrieval", False), ("reranked", True)):
        ranked, exact_first = [], []
        for start in range(0, len(queries), 256):
            for matches in resolver.resolve(queries[start : start + 256], top_k=top_k, rerank=rerank, retrieval=retrieval,
                                            admin_filter=admin_filter, rerank_depth=rerank_depth):
                ranked.append([m["id"] for m in matches] + [-1] * (top_k - len(matches)))
                exact_first.append(bool(matches) and matches[0].get("label") == "exact_match")
        report[name] = retrieval_report(np.array(ranked), gold, ks=(1, 5, 10))
        if rerank:
            called = [i for i, e in enumerate(exact_first) if e]
            report[name]["top1_exact"] = round(len(called) / len(queries), 4)
            report[name]["top1_exact_wrong"] = (round(sum(ranked[i][0] not in gold[i] for i in called) / len(called), 4)
                                                if called else None)
    return report


def evaluate_dense_retrieval(bi, queries: list[str], catalog: list[str], gold: list, *, top_k: int = settings.DEFAULT_TOP_K,
                             precision: str | None = None) -> dict:
    """recall@1/5/10 and MRR@10 of dense retrieval alone over an in-memory catalog (no index directory,
    no store: how training measures a fresh bi-encoder). ``gold[i]`` is the catalog position (or a
    collection of positions) of ``queries[i]``'s answer; the catalog goes into an exact (flat) FAISS index.
    ``precision``: the encoding's (:func:`inference.encode`; default the device's)."""
    from mgeo_index.index import faiss_index

    index = faiss_index.make_index(bi.dim, "Flat")
    faiss_index.add(index, inference.encode(bi, [normalize(t) for t in catalog], precision=precision),
                    np.arange(len(catalog), dtype=np.int64))
    _, ids = faiss_index.search(index, inference.encode(bi, [normalize(q) for q in queries], precision=precision), top_k)
    return retrieval_report(ids, gold)
