"""Training data assembled from ``../shared/data`` (read in place, never copied).

Pairs are split into dev / calib / train by :func:`mgeo_index.measure.splits.split_of` (a stable hash of
the query, so no query appears on both sides).
"""
from __future__ import annotations

import csv
import gzip
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mgeo_index.settings import LABELS
from mgeo_index.measure.splits import split_of


@dataclass(frozen=True)
class Pair:
    group: str  # the query's id: pairs of one group always share a split
    a: str
    b: str
    label: str  # one of LABELS
    source: str = ""  # where the label comes from (CCKS split_source, "shenzhen"): labelling differs by source


def _read_tsv(path: Path) -> Iterator[dict]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        yield from csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)


def _ccks_file(path: Path) -> list[Pair]:
    return [
        Pair(row["query_id"], row["query"], row["candidate"], row["label"], row.get("split_source") or "ccks")
        for row in _read_tsv(path)
        if row["label"] in LABELS and row["query"] and row["candidate"]
    ]


def ccks_pairs(data_dir: Path) -> list[Pair]:
    """The CCKS2021 pairs the figures are reported on (round-1 fold 0 and round 2; ``source`` says which)."""
    return _ccks_file(data_dir / "pairs" / "ccks2021_train.tsv.gz")


def ccks_extra_pairs(data_dir: Path) -> list[Pair]:
    """More round-1 CCKS pairs (``round1_train_tail``: 4% exact_match, labelled more sparingly than round 2)."""
    return _ccks_file(data_dir / "pairs" / "ccks2021_round1_extra.tsv.gz")


def _shenzhen_file(path: Path) -> list[Pair]:
    return [
        Pair(row["addr1"], row["addr1"], row["addr2"], "exact_match" if row["label"] == "1" else "not_match", "shenzhen")
        for row in _read_tsv(path)
    ]


def shenzhen_pairs(data_dir: Path) -> list[Pair]:
    """Shenzhen binary labels: 1 → exact_match (same place), 0 → not_match."""
    return _shenzhen_file(data_dir / "pairs" / "shenzhen_val.tsv.gz")


def shenzhen_train_pairs(data_dir: Path) -> list[Pair]:
    """The Shenzhen dataset's own training split (35,375 pairs); split by the same hash of addr1."""
    return _shenzhen_file(data_dir / "pairs" / "shenzhen_train.tsv.gz")


def labelled_file_pairs(path: Path) -> list[Pair]:
    """The pairs of a labelled file (``mgeo-index labels export``'s ``a, b, label``, or any form ``eval pairs``
    reads), each query its own group (so its pairs share a split), source ``labels:<file name>``."""
    from mgeo_index.measure.evaluate import read_labeled_pairs
    from mgeo_index.text import normalize

    a, b, gold = read_labeled_pairs(path)
    return [Pair(normalize(x), x, y, LABELS[g], f"labels:{Path(path).name}") for x, y, g in zip(a, b, gold)]


def all_pairs(data_dir: Path) -> list[Pair]:
    """Every labelled pair: CCKS (reported + extra round 1) and Shenzhen (val + train)."""
    return ccks_pairs(data_dir) + ccks_extra_pairs(data_dir) + shenzhen_pairs(data_dir) + shenzhen_train_pairs(data_dir)


def split_examples(pairs: list[Pair], split: str) -> list[tuple[str, str, int]]:
    """(a, b, LABELS index) of the pairs in ``split``: what the cross-encoder trains and calibrates on."""
    return [(p.a, p.b, LABELS.index(p.label)) for p in pairs if split_of(p.group) == split]


def ccks_catalog(data_dir: Path) -> list[str]:
    return [row["text"] for row in _read_tsv(data_dir / "catalog" / "ccks2021_poi_candidates.tsv.gz")]


def shenzhen_catalog(data_dir: Path) -> list[str]:
    with gzip.open(data_dir / "catalog" / "shenzhen_standard_addresses.txt.gz", "rt", encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip()]


TAGGED_FILES = ("tagged_addresses_swei412.jsonl.gz", "tagged_addresses_ncap2019.jsonl.gz",
                "tagged_addresses_ccks2021_track2.jsonl.gz")


def unlabeled_addresses(data_dir: Path) -> list[str]:
    """CCKS2021 track-2 test inputs (digits masked as 0): text for pretraining only."""
    with gzip.open(data_dir / "catalog" / "unlabeled_addresses_ccks2021_track2.txt.gz", "rt", encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip()]


def tagged_addresses(data_dir: Path, files: tuple[str, ...] | None = None) -> list[dict]:
    """Every row of the TAGGED_FILES (``files``: of these only, read in TAGGED_FILES order), each with ``file``:
    the name of the file it came from."""
    rows = []
    for name in TAGGED_FILES if files is None else [f for f in TAGGED_FILES if f in files]:
        with gzip.open(data_dir / "catalog" / name, "rt", encoding="utf-8") as fh:
            rows.extend(json.loads(line) | {"file": name} for line in fh if line.strip())
    return rows


def admin_addresses(data_dir: Path, rng: random.Random, limit: int = 40000) -> list[str]:
    """Synthetic addresses from the official tree: province + city + county + town (names only)."""
    with gzip.open(data_dir / "admin" / "jionlp_4level.csv.gz", "rt", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["level"] == "4"]
    rng.shuffle(rows)
    out = []
    for r in rows[:limit]:
        parts = [r["province"], r["city"], r["county"], r["name"]]
        if rng.random() < 0.3:
            parts = parts[1:]
        out.append("".join(dict.fromkeys(p for p in parts if p)))
    return out


def corpus(data_dir: Path, rng: random.Random) -> list[str]:
    """All address text available, for the vocabulary and masked-language pretraining."""
    texts: list[str] = []
    for pair in all_pairs(data_dir):
        if split_of(pair.group) == "train":
            texts.extend((pair.a, pair.b))
    texts += ccks_catalog(data_dir) + shenzhen_catalog(data_dir)
    texts += [row["text"] for row in tagged_addresses(data_dir) if row.get("split", "train") == "train"]
    texts += unlabeled_addresses(data_dir)
    texts += admin_addresses(data_dir, rng)
    return list(dict.fromkeys(t for t in texts if t))


_ADMIN_SUFFIX = ("省", "市", "区", "县", "自治区", "自治州")
_DETAIL = {"floorno", "roomno", "cellno", "subpoi"}


def augment_tagged(elements: list[list[str]], rng: random.Random) -> tuple[str, str]:
    """(messy view, clean view) of one tagged address: admin levels dropped or abbreviated, details cut."""
    clean = [(label, span) for label, span in elements if label != "redundant"]
    messy = []
    drop_upper = rng.random() < 0.6
    for label, span in clean:
        if label in ("prov", "city") and drop_upper and rng.random() < 0.7:
            continue
        if label == "district" and rng.random() < 0.25:
            continue
        if label in ("town", "community") and rng.random() < 0.2:
            continue
        if label in _DETAIL and rng.random() < 0.3:
            continue
        if label in ("prov", "city", "district") and rng.random() < 0.4:
            for suffix in _ADMIN_SUFFIX:
                if span.endswith(suffix) and len(span) > len(suffix) + 1:
                    span = span[: -len(suffix)]
                    break
        messy.append(span)
    return "".join(messy), "".join(span for _, span in clean)


