"""The name of a place in an address, and when two names make two places.

At one door there are many shops: 文明路564号顺丰窗帘 and 文明路564号21世纪不动产 share every number, and only
the name tells them apart. A name is the shop / POI part of an address — the spans the tagger labels ``poi``,
``subpoi`` and ``devzone``, less what stands in parentheses — or, for a catalog or a query kept as name + address,
the name field itself (``parsed["name"]``).

Two names are two places when neither writes anything the other address writes: no two characters in a row of one
name appear in the other side's address below its admin levels (its name included), and none the other way round.
Name variants keep a pair of characters in common — a branch in parentheses (肯德基(万达店) ~ 肯德基), 店 / 分店, a
company's full name (上海美维电子有限公司 ~ 美维电子), width and punctuation (normalization) — and so never conflict.
On the CCKS2021 train and calibration splits, of the 2,071 pairs whose names conflict so, 0.7% are labelled
``exact_match`` (at one door, the same road number on both sides: 0.4% of 279), against 7.5% of all pairs: a
conflicting name is rarely the same place. Names that share a pair of characters but tell two kinds of shop (顺丰窗帘
/ 顺丰家具) are left to the scorer: of such pairs at one door, 6% are labelled ``exact_match`` (美维科技 / 上海美维电子
有限公司 is one company), too many for a rule.

Two readings narrow "sharing": a company's legal form (有限公司, 集团) is no name in common (润彩塑模有限公司 /
台州溢豪模具有限公司 are two companies), and names of one place that agree still conflict when both name a sub-place
inside it (the tagger's ``subpoi``: 证大大拇指广场希莉娅 / 证大大拇指广场阿玛施, two shops of one mall) that shares
nothing with the other address, once the words for a phase, zone or side (2期, b区, 北区) are dropped. On the same
splits they make 330 more pairs conflict, 2.1% of them labelled ``exact_match`` (label noise among them: 卓高泰包装
有限公司 / 泰贺塑料有限公司): 2,401 in all, 0.9%.
"""
from __future__ import annotations

import re

_ADMIN_LABELS = ("prov", "city", "district", "town")
NAME_LABELS = ("poi", "subpoi", "devzone")
_BRACKETED = re.compile(r"\([^()]*\)|[()]")
# Words that say where at a place, not which place: a gate (北门, 3号门), nearby, opposite, a garage, …
_WHERE = re.compile(
    r"(?:[东西南北正侧后前][0-9一二三四五六七八九十]*|[0-9一二三四五六七八九十]+号?)门口?|门口|附近|对面|旁边|隔壁|"
    r"楼下|楼上|里面|院内|院子里|方向|交叉口|路口|车库|地下室|停车场|[0-9a-z]+|[^\u4e00-\u9fff]"
)
# A company's legal form says what kind of body it is, not which: two companies at one door that share only
# 有限公司 are two companies (润彩塑模有限公司 / 台州溢豪模具有限公司).
_LEGAL = re.compile(r"(?:股份)?有限(?:责任)?公司|[分总]公司|公司|集团")
_DROPPED = re.compile(f"{_LEGAL.pattern}|{_WHERE.pattern}")  # what a name is cut at before names are compared
MIN_NAME = 2  # characters a name needs, once the words of :data:`_DROPPED` are dropped, to tell a place
# Words that say which part of a place, not which place within it: a phase or zone (2期, b区, 第五街区, 组团), a side
# (北区, 东院, 南苑): dropped from a sub-place's name before two are compared.
_PART = re.compile(r"第?[一二三四五六七八九十]*(?:期|街区|片区|分区|组团|区)|[东西南北中上下](?:区|院|苑|里|楼|座)?")


def below_admin(parsed: dict) -> str:
    """The normalized text less its admin spans (wherever they are: a POI name may end on one, 温州市良荣修理厂)."""
    text, end = parsed["text"], 0
    kept = []
    for e in parsed["elements"]:
        if e["label"] in _ADMIN_LABELS:
            kept.append(text[end:e["start"]])
            end = e["end"]
    return "".join(kept) + text[end:]


def _bracketed(text: str, start: int) -> bool:
    """Whether position ``start`` of ``text`` lies inside parentheses (a branch or a landmark: 优品文化创意园(百易广场西))."""
    return text.count("(", 0, start) > text.count(")", 0, start)


def _written_spans(parsed: dict, labels: tuple[str, ...]) -> str:
    """The spans the tagger labels with one of ``labels``, in order, outside parentheses."""
    text = parsed["text"]
    return "".join(e["text"] for e in parsed["elements"] if e["label"] in labels and not _bracketed(text, e["start"]))


def written_name(parsed: dict) -> str:
    """The place's name as a parsed address writes it: its name field when it has one (``parsed["name"]``), else
    the spans the tagger labels ``poi``, ``subpoi`` or ``devzone`` (a park by its name: 优品文化创意园), in order;
    what stands in parentheses (a branch, a landmark near by) dropped."""
    given = parsed.get("name")
    return _BRACKETED.sub("", (_written_spans(parsed, NAME_LABELS) if given is None else given).lower())


def _parts(parsed: dict) -> list[str]:
    """:func:`written_name` cut where it says where at a place (北门, 附近, 车库, digits and letters) or a company's
    legal form (有限公司): the parts that tell the place."""
    return [part for part in _DROPPED.split(written_name(parsed)) if part]


def _pairs(text: str) -> set[str]:
    return {text[i : i + 2] for i in range(len(text) - 1)}


def _pairs_of_parts(parts: list[str]) -> set[str]:
    """The pairs of characters in a row within each part (none across a word dropped between two parts)."""
    return set().union(*(_pairs(part) for part in parts))


def _address_pairs(parsed: dict) -> set[str]:
    """The pairs of characters in a row of the address below its admin levels, its name field included."""
    return _pairs((below_admin(parsed) + parsed.get("name", "")).lower())


def _place(parsed: dict) -> tuple[str, set[str]]:
    """(:func:`name_of`, the pairs of characters in a row of the name's parts: none across a word dropped between
    two parts), from one reading of the name."""
    parts = _parts(parsed)
    name = "".join(parts)
    return (name if len(name) >= MIN_NAME else ""), _pairs_of_parts(parts)


def name_of(parsed: dict) -> str:
    """What tells the place in a parsed address: its :func:`written_name` less the words that say where at a place
    (北门, 附近, 车库, digits and letters) and a company's legal form. Empty when less than :data:`MIN_NAME` characters
    are left."""
    return _place(parsed)[0]


def _sub_place(parsed: dict) -> tuple[str, set[str]]:
    """(the sub-place an address names inside its place, as written: the tagger's ``subpoi`` spans, 希莉娅 in
    证大大拇指广场希莉娅; the pairs of characters in a row of it, less what says where at a place and which part of it
    (:data:`_PART`: 2期, b区, 北区)). Empty for an address kept with a name field, or with no sub-place."""
    if parsed.get("name") is not None:
        return "", set()
    written = _BRACKETED.sub("", _written_spans(parsed, ("subpoi",)).lower())
    return written, _pairs_of_parts([part for part in _DROPPED.split(_PART.sub(" ", written)) if part])


def name_conflict(qa: dict, qb: dict) -> tuple[str, str] | None:
    """(query name, candidate name), as written, when both addresses name a place and the names are two places (see
    the module docstring); None when either names none, or a name shares a pair of characters with the other
    address. Names of one place that agree so still conflict when both name a sub-place inside it (two shops of one
    mall: 证大大拇指广场希莉娅 / 证大大拇指广场阿玛施) and neither sub-place shares a pair of characters with the
    other address: then the sub-places are returned."""
    return name_conflict_of(Named(qa), Named(qb))


class Named:
    """What :func:`name_conflict` reads of one parsed address, each read when first asked and kept: in a batch a query
    meets each of its candidates, and a catalog entry several queries (:func:`mgeo_index.compare.conflicts.conflicts_batch`).
    Nothing read here is changed by a caller."""

    __slots__ = ("parsed", "_place", "_text", "_sub")

    def __init__(self, parsed: dict):
        self.parsed = parsed
        self._place = self._text = self._sub = None

    @property
    def place(self) -> tuple[str, set[str]]:
        if self._place is None:
            self._place = _place(self.parsed)
        return self._place

    @property
    def text(self) -> set[str]:
        if self._text is None:
            self._text = _address_pairs(self.parsed)
        return self._text

    @property
    def sub_place(self) -> tuple[str, set[str]]:
        if self._sub is None:
            self._sub = _sub_place(self.parsed)
        return self._sub


def name_conflict_of(a: Named, b: Named) -> tuple[str, str] | None:
    """:func:`name_conflict` of two sides."""
    (name_a, pairs_a), (name_b, pairs_b) = a.place, b.place
    if not name_a or not name_b:
        return None
    text_a, text_b = a.text, b.text
    if not pairs_a & text_b and not pairs_b & text_a:
        return written_name(a.parsed), written_name(b.parsed)
    (sub_a, sub_pairs_a), (sub_b, sub_pairs_b) = a.sub_place, b.sub_place
    if sub_pairs_a and sub_pairs_b and not sub_pairs_a & text_b and not sub_pairs_b & text_a:
        return sub_a, sub_b
    return None
