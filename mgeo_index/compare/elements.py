"""The address elements, named once: the element parser's labels as explanation rows (:data:`PARSED_ELEMENTS`, in
address order: :data:`EXPLAIN_ORDER`), the admin levels among them, and how two spans of one element compare
(:func:`core`, :func:`same`). The pair features (:mod:`mgeo_index.compare.features`), the conflicts
(:mod:`mgeo_index.compare.conflicts`), explanations and the review page read them from here.
"""
from __future__ import annotations

import re

from rapidfuzz import fuzz

from mgeo_index.text.gazetteer import LEVELS

ADMIN_ELEMENTS = ("province", "city", "district", "town", "village")
_SUFFIX = re.compile(r"(?:省|自治区|市|自治州|地区|区|县|旗|镇|乡|街道|村|社区|居委会)$")
DIGITS = re.compile(r"[0-9]+")
# Elements that carry a number: a different number on both sides is a different place (road number, building,
# floor), or a different door within one (unit, room). See :mod:`mgeo_index.model.numbers` for the decision.
NUMBERED = ("roadno", "building", "unit", "floor", "room")

# Explanation rows from the element parser's labels (mgeo_index.text.parser), in address order.
PARSED_ELEMENTS = {
    "prov": "province", "city": "city", "district": "district", "town": "town", "community": "village",
    "village": "village", "road": "road", "roadno": "roadno", "poi": "poi", "subpoi": "subpoi",
    "houseno": "building", "cellno": "unit", "floorno": "floor", "roomno": "room",
}
EXPLAIN_ORDER = list(dict.fromkeys(PARSED_ELEMENTS.values()))
ADMIN_LEVEL_NAMES = tuple(LEVELS.values())  # compared by official code when both sides resolve


def core(name: str, span: str) -> str:
    """Comparable core of an element: admin suffixes dropped (北京市 ~ 北京), numbers as such."""
    if name in ADMIN_ELEMENTS:
        return _SUFFIX.sub("", span) or span
    if name in NUMBERED:
        return "-".join(DIGITS.findall(span)) or span
    return span


def spans(parsed: dict) -> dict[str, str]:
    """Explanation element → its text (spans of one label joined, in order)."""
    out: dict[str, str] = {}
    for e in parsed["elements"]:
        name = PARSED_ELEMENTS.get(e["label"])
        if name:
            out[name] = out.get(name, "") + e["text"]
    return out


def same(name: str, a: str, b: str) -> bool:
    """Whether two spans of explanation element ``name`` are one place: cores equal, a road within the other, a village
    ending the other, POI names within each other or alike (fuzzy ratio 70)."""
    kind = "poi" if name == "subpoi" else name
    ca, cb = core(kind, a), core(kind, b)
    if name in ("poi", "subpoi"):
        return ca in cb or cb in ca or fuzz.ratio(ca, cb) >= 70
    if name == "village":
        return ca.endswith(cb) or cb.endswith(ca)
    return ca == cb or (name == "road" and (ca in cb or cb in ca))
