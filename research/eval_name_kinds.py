"""Whether a vocabulary of shop kinds would let names that share a brand (顺丰窗帘 / 顺丰家具) decide as two places.

The kinds come from the CCKS catalog's own names (:func:`mgeo_index.compare.names.name_of` of each entry): the last
two characters of a name that end at least ``--min-names`` of them. Over the CCKS train and calibration pairs whose
names share a pair of characters (neither name holding the other, and no name conflict read already), the pairs a
kind rule would call two places — both names end in a kind, the kinds differ, and neither address writes the other's
kind — and the share of them labelled ``exact_match``, against that share over all such pairs. A rule is worth its
place only where that share is far below the pairs' own (docs/numbers.md).

    python research/eval_name_kinds.py --data ../shared/data --min-names 20 40 80
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import json
from pathlib import Path

from mgeo_index.compare import names
from mgeo_index.measure.splits import split_of
from mgeo_index.text import model_text
from mgeo_index.text.parser import parse


def catalog_names(data: Path) -> list[str]:
    with gzip.open(data / "catalog" / "ccks2021_poi_candidates.tsv.gz", "rt", encoding="utf-8") as fh:
        texts = list(dict.fromkeys(model_text(row["text"]) for row in csv.DictReader(fh, delimiter="\t")))
    return [names.name_of(p) for p in parse(texts)]


def sharing_pairs(data: Path, splits: tuple[str, ...]) -> list[tuple[str, str, str, str, str]]:
    """(name a, name b, address a below admin, address b below admin, gold label) of the pairs of ``splits`` whose
    names share a pair of characters."""
    with gzip.open(data / "pairs" / "ccks2021_train.tsv.gz", "rt", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t") if split_of(r.get("query_id") or r["query"]) in splits]
    texts = list(dict.fromkeys(model_text(t) for r in rows for t in (r["query"], r["candidate"])))
    parsed = dict(zip(texts, parse(texts)))
    out = []
    for r in rows:
        qa, qb = parsed[model_text(r["query"])], parsed[model_text(r["candidate"])]
        na, nb = names.name_of(qa), names.name_of(qb)
        if not na or not nb or na in nb or nb in na or names.name_conflict(qa, qb):
            continue
        out.append((na, nb, names.below_admin(qa), names.below_admin(qb), r["label"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--min-names", nargs="+", type=int, default=[20, 40, 80])
    parser.add_argument("--examples", type=int, default=8)
    args = parser.parse_args()
    endings = collections.Counter(n[-2:] for n in catalog_names(args.data) if len(n) >= 4)
    pairs = sharing_pairs(args.data, ("train", "calib"))
    exact = sum(p[-1] == "exact_match" for p in pairs)
    print(json.dumps({"pairs": len(pairs), "exact_match_share": round(exact / max(len(pairs), 1), 4)}))
    for least in args.min_names:
        kinds = {k for k, count in endings.items() if count >= least}
        ruled = [p for p in pairs if p[0][-2:] in kinds and p[1][-2:] in kinds and p[0][-2:] != p[1][-2:]
                 and p[0][-2:] not in p[3] and p[1][-2:] not in p[2]]
        wrong = [p for p in ruled if p[-1] == "exact_match"]
        print(json.dumps({"min_names": least, "kinds": len(kinds), "pairs_ruled": len(ruled),
                          "exact_match_share": round(len(wrong) / max(len(ruled), 1), 4),
                          "exact_examples": [f"{p[0]} / {p[1]}" for p in wrong[: args.examples]]}, ensure_ascii=False))


if __name__ == "__main__":
    main()
