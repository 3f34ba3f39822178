"""Admin resolution of mgeo-index, cpca and jionlp side by side on the tagger's held-out test split.

The same addresses go to all three (default settings: ``cpca.transform``, ``jionlp.parse_location``,
``mgeo_index.text.parser.parse``). Gold codes are those of ``research/eval_parser.py``: the
gazetteer's resolution of the gold prov / city / district / town spans (addresses whose gold is
ambiguous or unresolved are left out). cpca answers with its own adcodes; jionlp's names are
looked up in the gazetteer under their province and city. A municipality is its own city level;
a county-level city directly under its province has none (as the gazetteer reports them).

Rows:
- province / city / district where written: accuracy over addresses whose gold spans have that level,
  and how many were left empty;
- province not written, city or district written: filled (share) / wrong (count of all);
- district not written, town written: filled (count), of them consistent with the town (the gold
  district the town implies);
- the same two rows on more cases cut from addresses that wrote the levels (province and city
  spans removed where a district is written, district spans where a town is written, as
  ``eval_parser.py``'s inferred figures do): few test addresses leave them out;
- in-process addresses per second, one thread.

Example: OMP_NUM_THREADS=1 .venv/bin/python research/compare_parsers.py --data ../shared/data
Needs the ``eval`` extra (cpca, jionlp).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import math
import sys
import time
import types
from pathlib import Path

from mgeo_index.text.gazetteer import MUNICIPALITIES, default_gazetteer
from mgeo_index.text.parser import admin_mentions, parse
from mgeo_index.text.tagger import default_tagger
from mgeo_index.training.tagger import load_examples

KEYS = ("province", "city", "district")


def import_cpca():
    """cpca 0.5.5 reads its table with pkg_resources, which setuptools ≥ 81 no longer ships."""
    try:
        import pkg_resources  # noqa: F401
    except ImportError:
        shim = types.ModuleType("pkg_resources")
        shim.resource_stream = lambda package, name: importlib.resources.files(package).joinpath(name).open("rb")
        sys.modules["pkg_resources"] = shim
    import cpca

    return cpca


def mgeo_codes(texts: list[str]) -> list[dict]:
    tagger, gazetteer = default_tagger(), default_gazetteer()
    return [{k: p["admin"][f"{k}_code"] for k in KEYS} for p in parse(texts, tagger=tagger, gazetteer=gazetteer)]


def cpca_codes(texts: list[str]) -> list[dict]:
    cpca = import_cpca()
    frame = cpca.transform(texts)
    out = []
    for province, city, district, code in zip(frame["省"], frame["市"], frame["区"], frame["adcode"]):
        code = None if _nan(code) else str(code)[:6]
        row = dict.fromkeys(KEYS)
        if code and not _nan(province):
            row["province"] = code[:2] + "0000"
            if row["province"] in MUNICIPALITIES:
                row["city"] = row["province"]
            elif not _nan(city) and code[2:4] not in ("90",):  # 省直辖县级行政区划 has no city
                row["city"] = code[:4] + "00"
            if not _nan(district):
                row["district"] = code
        out.append(row)
    return out


def _nan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def jionlp_codes(texts: list[str]) -> list[dict]:
    with contextlib.redirect_stdout(sys.stderr):  # its banner
        import jionlp

    gazetteer = default_gazetteer()

    def find(name, level, parent):
        if not name:
            return None
        codes = [c for c in gazetteer.official.get(name, ()) if gazetteer.units[c].level == level]
        if parent:
            codes = [c for c in codes if parent in {u.code for u in gazetteer.chain(c)}]
        return codes[0] if len(codes) == 1 else f"?{name}"  # a name the gazetteer does not place: wrong

    out = []
    for text in texts:
        loc = jionlp.parse_location(text)
        row = dict.fromkeys(KEYS)
        row["province"] = find(loc.get("province"), 1, None)
        province = row["province"] if row["province"] and not row["province"].startswith("?") else None
        if province in MUNICIPALITIES:
            row["city"] = province if loc.get("city") else None
        else:
            row["city"] = find(loc.get("city"), 2, province)
        city = row["city"] if row["city"] and not row["city"].startswith("?") and row["city"] != province else None
        row["district"] = find(loc.get("county"), 3, city or province)
        out.append(row)
    return out


def gold_rows(examples, gazetteer) -> list[tuple[str, dict, set[int], list]]:
    rows = []
    for text, spans in examples:
        mentions = admin_mentions(text, spans)
        gold = gazetteer.resolve(mentions)
        if mentions and not gold["ambiguous"] and gold["province_code"]:
            rows.append((text, {k: gold[f"{k}_code"] for k in KEYS}, {level for _, level in mentions}, spans))
    return rows


def without(text: str, spans, labels: set[str]) -> str:
    """The text less the spans of ``labels`` (the rest of the address as it was written)."""
    return "".join(text[s:e] for i, (label, s, e) in enumerate(spans) if label not in labels)


def derived(rows) -> tuple[list, list]:
    """More cases for the two inference rows, cut from addresses that write the levels: the
    province and city spans removed where a district is written (the province must come from the
    district, as in eval_parser.py's inferred_from_district), the district spans removed where a
    town is written (texts, and the rows they stand for)."""
    province = [(without(t, sp, {"prov", "city"}), g, w - {1, 2}, sp) for t, g, w, sp in rows if 3 in w and w & {1, 2}]
    district = [(without(t, sp, {"district"}), g, w - {3}, sp) for t, g, w, sp in rows if 3 in w and 4 in w]
    return province, district


def score(rows, predicted: list[dict]) -> dict:
    out: dict = {}
    for level, key in enumerate(KEYS, start=1):
        pairs = [(g[key], p[key]) for (_, g, written, _), p in zip(rows, predicted) if level in written and g[key]]
        out[f"{key}_written"] = {
            "n": len(pairs), "accuracy": round(sum(g == p for g, p in pairs) / max(len(pairs), 1), 4),
            "empty": sum(p is None for _, p in pairs),
        }
    out["province_inferred"] = province_inferred(rows, predicted)
    out["district_from_town"] = district_from_town(rows, predicted)
    return out


def province_inferred(rows, predicted) -> dict:
    pairs = [(g["province"], p["province"]) for (_, g, written, _), p in zip(rows, predicted)
             if 1 not in written and written & {2, 3}]
    filled = [(g, p) for g, p in pairs if p is not None]
    return {"n": len(pairs), "filled": round(len(filled) / max(len(pairs), 1), 4),
            "wrong": sum(g != p for g, p in filled)}


def district_from_town(rows, predicted) -> dict:
    pairs = [(g["district"], p["district"]) for (_, g, written, _), p in zip(rows, predicted)
             if 3 not in written and 4 in written]
    return {"n": len(pairs), "filled": sum(p is not None for _, p in pairs),
            "consistent": sum(p is not None and p == g for g, p in pairs)}


def table(results: dict) -> str:
    names = list(results)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def row(label, cell):
        lines.append(f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |")

    def written(r, key):
        cell = r[f"{key}_written"]
        return f"{cell['accuracy']:.1%}" + (f" ({cell['empty']} empty)" if cell["empty"] else "")

    for key in KEYS:
        row(f"{key} where written", lambda r, k=key: written(r, k))
    for suffix, note in (("", ""), ("_removed", " (upper spans removed from addresses that wrote them)")):
        n = next(iter(results.values()))[f"province_inferred{suffix}"]["n"]
        row(f"province not written, city or district written{note}: filled / wrong (of {n})",
            lambda r, s=suffix: f"{r[f'province_inferred{s}']['filled']:.1%} / {r[f'province_inferred{s}']['wrong']}")
        n = next(iter(results.values()))[f"district_from_town{suffix}"]["n"]
        row(f"district not written, town written{note}: filled (consistent with the town), of {n}",
            lambda r, s=suffix: "{filled} ({consistent})".format(**r[f"district_from_town{s}"]))
    row("in-process, addresses/s (one thread)", lambda r: f"{r['addresses_per_s']:,}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--split", default="test", choices=["test", "dev"])
    parser.add_argument("--limit", type=int, default=0, help="only the first N gold addresses (0: all)")
    parser.add_argument("--json", action="store_true", help="the figures as JSON after the table")
    args = parser.parse_args()
    gazetteer = default_gazetteer()
    rows = gold_rows(load_examples(args.data)[args.split], gazetteer)
    if args.limit:
        rows = rows[: args.limit]
    province_rows, district_rows = derived(rows)
    texts = [text for text, *_ in rows]
    more = [text for text, *_ in province_rows + district_rows]
    results = {}
    for name, run in (("mgeo-index", mgeo_codes), ("cpca", cpca_codes), ("jionlp", jionlp_codes)):
        run(texts[:50])  # imports, dictionaries and caches loaded before the clock starts
        start = time.perf_counter()
        predicted = run(texts)
        rate = round(len(texts) / (time.perf_counter() - start))
        extra = run(more)
        results[name] = {
            **score(rows, predicted), "addresses_per_s": rate,
            "province_inferred_removed": province_inferred(province_rows, extra[: len(province_rows)]),
            "district_from_town_removed": district_from_town(district_rows, extra[len(province_rows):]),
        }
        print(f"{name}: {rate:,} addresses/s", file=sys.stderr)
    print(f"{args.split} split: {len(rows)} addresses with resolved gold admin codes\n")
    print(table(results))
    if args.json:
        print(json.dumps(results, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
