"""The name test set: catalog entries at one door, for the name half of the policy (:mod:`mgeo_index.compare.names`).

Made from a real map catalog (the CCKS2021 candidates: POIs written as road + number + name). Two parts, each a list
of (entry, other, kind), paired both ways round:

- ``changed``: two entries of the catalog on one road at one road number whose names differ (neither name holds the
  other), never to be called ``exact_match``. Kind ``name_other``: the names share no two characters in a row
  (文明路564号名仕之家 / 文明路564号21世纪不动产); ``name_shared``: they do (顺丰窗帘 / 顺丰家具: a brand and two kinds
  of shop, which the policy leaves to the scorer).
- ``controls``: one entry with its name written otherwise, to stay ``exact_match``: ``branch_dropped`` (肯德基(万达店)
  / 肯德基), ``branch_unbracketed`` (肯德基(万达店) / 肯德基万达店), ``name_width`` (letters and digits full-width, a
  middle dot or space dropped: 时代·天悦 / 时代天悦).

Each kind holds up to :data:`PAIRS_PER_KIND` draws, seeded, so the set is the same on every machine.
"""
from __future__ import annotations

import random
import re
from collections.abc import Sequence

from mgeo_index.compare.names import name_of, written_name

PAIRS_PER_KIND = 300
CONFLICT_KINDS = {
    "name_other": "two entries at one door whose names share no two characters in a row: 名仕之家 / 21世纪不动产",
    "name_shared": "two entries at one door whose names share some: 顺丰窗帘 / 顺丰家具",
}
CONTROL_KINDS = {
    "branch_dropped": "the branch in parentheses dropped: 肯德基(万达店) / 肯德基",
    "branch_unbracketed": "the branch written without parentheses: 肯德基(万达店) / 肯德基万达店",
    "name_width": "letters and digits full-width, a middle dot or a space dropped: 时代·天悦 / 时代天悦",
}
_BRANCH = re.compile(r"\(([^()]{1,12})\)$")
_FULL_WIDTH = {c: chr(ord(c) + 0xFEE0) for c in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"}
_DOT = re.compile(r"[·・ ]")


def _pairs(text: str) -> set[str]:
    return {text[i : i + 2] for i in range(len(text) - 1)}


def _door(parsed: dict) -> tuple[str, str] | None:
    """(road, road number) as the tagger reads them, when the address writes both."""
    spans = {e["label"]: e["text"] for e in parsed["elements"] if e["label"] in ("road", "roadno")}
    return (spans["road"], spans["roadno"]) if len(spans) == 2 else None


def _controls(entry: str, rng: random.Random) -> list[tuple[str, str, str]]:
    out = []
    if (m := _BRANCH.search(entry)) and len(entry[: m.start()]) >= 6:
        out += [(entry, entry[: m.start()], "branch_dropped"), (entry, entry[: m.start()] + m[1], "branch_unbracketed")]
    wide = "".join(_FULL_WIDTH.get(c, c) for c in _DOT.sub("", entry))
    if wide != entry:
        out.append((entry, wide, "name_width"))
    return out


def name_pairs(entries: Sequence[str], parsed: Sequence[dict], seed: int = 0) -> dict[str, list[tuple[str, str, str]]]:
    """The name test set from catalog ``entries`` and their parses (``text.parser.parse``): ``{"changed",
    "controls"}``, each a list of (entry, other, kind) (see the module docstring)."""
    at_door: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(parsed):
        if (door := _door(p)) and name_of(p):
            at_door.setdefault(door, []).append(i)
    by_kind: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for door, rows in sorted(at_door.items()):
        for j, x in enumerate(rows):
            for y in rows[j + 1 :]:
                na, nb = name_of(parsed[x]), name_of(parsed[y])
                if na in nb or nb in na or written_name(parsed[x]) == written_name(parsed[y]):
                    continue
                kind = "name_shared" if _pairs(na) & _pairs(nb) else "name_other"
                by_kind.setdefault(("changed", kind), []).append((entries[x], entries[y], kind))
    for i, p in enumerate(parsed):
        if name_of(p):
            for row in _controls(entries[i], random.Random(f"{seed}:{entries[i]}")):
                by_kind.setdefault(("controls", row[2]), []).append(row)
    out: dict[str, list[tuple[str, str, str]]] = {"changed": [], "controls": []}
    for (part, kind), rows in sorted(by_kind.items()):
        rows = random.Random(f"{seed}:{part}:{kind}").sample(rows, min(len(rows), PAIRS_PER_KIND))
        out[part] += rows + [(b, a, k) for a, b, k in rows]
    return out
