"""Where two parsed addresses are two places: their numbers read as people write them (road and house numbers,
buildings, units, floors, rooms, ranges and lists, basements, letters and 甲 / 乙, lanes and village groups) and
their names. :func:`number_conflicts` is computed once a pair (:func:`number_conflicts_batch`) and read by the pair
features, the explanations and the number policy (:mod:`mgeo_index.model.numbers`) alike.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from mgeo_index.compare.elements import NUMBERED, PARSED_ELEMENTS, same, spans
from mgeo_index.compare.names import Named, below_admin, name_conflict_of
from mgeo_index.text import normalize

# A number's tokens: digits, letters (a座, 12a栋) and the stems 甲 / 乙 / 丙 … (甲12号 and 乙12号 are two doors).
_STEMS = "甲乙丙丁戊己庚辛壬癸"
_NUMBER_TOKENS = re.compile(rf"[0-9]+|[a-z]|[{_STEMS}]")  # each letter alone: ab栋 is buildings a and b (a.b栋)
# 4-6号, 21号-23号: numbers 4 to 6 (one plot, several numbers); normalization writes 4~6号 and 4至6号 so too.
_RANGE = re.compile(r"^([0-9]+)(?:号|弄|栋|幢)?-([0-9]+)(?:号|弄|栋|幢)")
_BASEMENT = re.compile(r"^b([0-9]+)")  # b1层: normalization writes 负一层, 地下一层 and -1层 so
_DIGIT_RUN = re.compile(r"[0-9]+")
# A room numbered by its floor: 1202室 is on floor 12 (3 or 4 digits, the last two the room on its floor).
_FLOOR_ROOM = re.compile(r"^([0-9]{1,2})([0-9]{2})(?:室|房|户)?$")
_SHORT_ROOM = re.compile(r"^([0-9]{1,2})(?:室|房|户)?$")
_ROOM_ON_FLOOR = re.compile(r"^([0-9]{1,2})(?:f|楼|层)-?([0-9]{1,2})(?:室|房|户)?$")  # one room span: 4f-01, 12楼01室


@lru_cache(maxsize=1 << 16)
def _normal_span(span: str) -> str:
    """``normalize`` of an element span on its own (a span reads otherwise alone: 二百零八弄 becomes 208弄), kept:
    catalog entries repeat the same spans, and every candidate pair asks again."""
    return normalize(span)


def number_value(name: str, span: str) -> tuple[str, ...]:
    """The number an element span writes, as comparable tokens: digits without leading zeros, each letter and the
    stems 甲 / 乙 … (88号院 → ('88',), 3#楼 → ('3',), 12a栋 → ('12', 'a'), ab栋 → ('a', 'b'), 甲12号 → ('甲', '12'),
    7-6-1046 → ('7', '6', '1046')). A floor is one signed number: its ``f`` is a marker, a basement is below zero
    (12f → ('12',), b1层 → ('-1',)); a room written with its floor is the room numbered by its floor (4f-01 →
    ('401',)). Chinese and full-width numerals are digits already (:func:`~mgeo_index.text.normalize`). Empty when
    the span writes no number (东座)."""
    text = _normal_span(span)
    if name == "room" and (door := _ROOM_ON_FLOOR.match(text)):
        return (door[1].lstrip("0") + door[2].zfill(2),)
    tokens = _NUMBER_TOKENS.findall(text)
    if name == "floor":
        tokens = [t for t in tokens if t.isdigit()]
        if tokens and _BASEMENT.match(text):
            return ("-" + (tokens[0].lstrip("0") or "0"), *tokens[1:])
    return tuple(t.lstrip("0") or "0" if t.isdigit() else t for t in tokens)


def numbers_agree(name: str, a: str, b: str) -> bool:
    """Whether two spans of element ``name`` can write the same number. They agree when:

    - their values are equal, or one's tokens run inside the other's (a more specific writing: 316栋 ~ d316幢,
      g栋 ~ g栋-1号, 16#-5号 ~ 16号; a list holding the other's number: 4、6号 ~ 6号);
    - a range holds the other side's number (4-6号 ~ 5号, 21号-23号 ~ 22号);
    - one side is bare digits that start with the other's number and go on for a room number (12706 ~ 12号:
      12号706 with its 号 dropped);
    - either side writes no number at all (no evidence).

    A range or list is not the number its digits run into (4-6号, 4、6号 ≁ 46号), a basement not the floor of its
    digit (b1层 ≁ 1层), one letter or stem not another (a座 ≁ b座, 甲12号 ≁ 乙12号)."""
    va, vb = number_value(name, a), number_value(name, b)
    if not va or not vb or va == vb:
        return True
    short, long = sorted((va, vb), key=len)
    if any(long[i : i + len(short)] == short for i in range(len(long) - len(short) + 1)):
        return True
    for range_span, other in ((a, vb), (b, va)):
        m = _RANGE.match(_normal_span(range_span))
        if m and len(other) == 1 and other[0].isdigit() and int(m[1]) <= int(other[0]) <= int(m[2]):
            return True
    for bare, marked in ((a, vb), (b, va)):
        if _normal_span(bare).isdigit() and len(marked) == 1 and bare.startswith(marked[0]) and len(bare) >= len(marked[0]) + 3:
            return True
    return False


# A range in the text, whatever elements the tagger split it into (618号-622号 read as a road number and a
# building): low < high, at most 50 numbers.
_TEXT_RANGE = re.compile(r"(?<![0-9-])([0-9]+)(?:号|栋|幢|弄)?-([0-9]+)(?:号|栋|幢|弄)")


def _numberspans(parsed: dict) -> dict[str, list[str]]:
    """Numbered element → its spans (each alone: 478号 and 12号 in one address are two road numbers). A span inside
    a range of the text reads as the whole range (618号 of 618号-622号)."""
    ranges = [m for m in _TEXT_RANGE.finditer(parsed["text"]) if int(m[1]) < int(m[2]) <= int(m[1]) + 50]
    out: dict[str, list[str]] = {}
    for e in parsed["elements"]:
        name = PARSED_ELEMENTS.get(e["label"])
        if name in NUMBERED:
            text = next((m[0] for m in ranges if m.start() <= e["start"] and e["end"] <= m.end()), e["text"])
            if text not in out.get(name, ()):
                out.setdefault(name, []).append(text)
    return out


def _door_digits(spans: dict[str, list[str]]) -> str:
    """The digits of a side's floor and room as written (12楼01 → 1201; 18 + 2 → 182), for two readings of one door."""
    return "".join(_DIGIT_RUN.findall("".join(spans.get("floor", []) + spans.get("room", []))))


def _floor_of_room(span: str) -> str | None:
    """The floor a room number names (1202室 → '12', 0801 → '8'); None for a room not numbered by its floor."""
    m = _FLOOR_ROOM.match(_normal_span(span))
    return (m[1].lstrip("0") or None) if m else None


_FLOOR_MARK = re.compile(r"[0-9](?:层|楼|f)")


def _one_floor(spans: dict[str, list[str]]) -> str | None:
    """The side's floor when it writes one floor above ground as a number with its mark (12楼 → '12'; not a bare 14
    the tagger read as a floor), else None."""
    if not all(_FLOOR_MARK.search(_normal_span(f)) for f in spans.get("floor", ())):
        return None
    values = {number_value("floor", f) for f in spans.get("floor", ())}
    if len(values) == 1 and len(value := next(iter(values))) == 1 and value[0].isdigit():
        return value[0]
    return None


def _rooms_as_doors(mine: dict[str, list[str]], theirs: dict[str, list[str]]) -> list[str] | None:
    """``mine``'s rooms written as ``theirs`` writes a room, floor first: 12楼01 against a 1201室 with no floor of its
    own reads as 1201 (one room, two writings). None when that does not apply."""
    floor = _one_floor(mine)
    if floor is None or "floor" in theirs or not mine.get("room") \
            or not all(_floor_of_room(r) for r in theirs.get("room", ())) or not theirs.get("room"):
        return None
    rooms = [_SHORT_ROOM.match(_normal_span(r)) for r in mine["room"]]
    if not all(rooms):
        return None
    return [f"{floor}{m[1].zfill(2)}" for m in rooms]


# Two numbers joined by a range or list mark (830-831, 3、5), overlapping runs included (1-2-3: 1-2 and 2-3).
_JOINED = re.compile(r"(?<![0-9])([0-9]+)[-、](?=([0-9]+)(?![0-9]))")


def _in_range(text: str, span: str) -> bool:
    """Whether ``span``'s number is one end of a range or list in ``text`` (830-831仓库: 831 is no room of floor 8)."""
    number = _DIGIT_RUN.search(span)
    if number is None:
        return False
    n = number[0]
    return any(int(low) < int(high) <= int(low) + 50 and n in (low, high) for low, high in _JOINED.findall(text))


def _floor_against_room(qa: dict, qb: dict, sa: dict[str, list[str]], sb: dict[str, list[str]]) -> tuple[str, str] | None:
    """A floor on one side and, on the other, only rooms numbered by their floor, none of it (…3层 / …1202室):
    (query span, candidate span); None when they agree or do not compare (a number of a range is no room)."""
    for mine, theirs, text, flip in ((sa, sb, qb["text"], False), (sb, sa, qa["text"], True)):
        floor = _one_floor(mine)
        if floor is None or "floor" in theirs or not theirs.get("room") or any(_in_range(text, r) for r in theirs["room"]):
            continue
        floors = [_floor_of_room(r) for r in theirs["room"]]
        if all(floors) and floor not in floors:
            pair = ("".join(mine["floor"]), "".join(theirs["room"]))
            return pair[::-1] if flip else pair
    return None


# What tells two numbers apart in a text: digit runs, a lone letter (a座, b1层, f座; not a word such as soho, nor
# the f of a floor, 12f) and a stem before digits (甲12号). A range or list is one number for the skeleton (4-6号, 3、5栋).
_LETTER = r"(?<![a-z])(?:[a-eg-z]|(?<![0-9])f)(?![a-z])"
_MARKS = re.compile(rf"[0-9]+|{_LETTER}|[{_STEMS}](?=[0-9])")
_NUMBER_GROUP = re.compile(rf"(?:{_LETTER}|[{_STEMS}])?[0-9]+(?:[-、][0-9]+)*|{_LETTER}")


def _number_marks(parsed: dict) -> tuple[str, ...]:
    """The numbers an address writes, in order (:data:`_MARKS` of its normalized text, leading zeros dropped)."""
    return _runs(_MARKS, parsed["text"])


def _runs(pattern: re.Pattern, text: str) -> tuple[str, ...]:
    """The digit runs ``pattern`` finds in ``text`` (its group where it has one), leading zeros dropped."""
    return tuple(run.lstrip("0") or "0" for run in pattern.findall(text))


# A branch lane (2000弄51支弄 → 51), whatever element the tagger read it as: it reads 51支弄 as a sub-road on one
# side and 70支弄 as a road number on the other.
_LANE = re.compile(r"([0-9]+)支弄")
# A village group: 3组, 第5村民小组 (normalization writes 三组 and 第五村民小组 so); not 3组团, a numbered cluster.
_GROUP = re.compile(r"([0-9]+)(?:村民小组|村民组|小组|组)(?!团|合|织)")


def _skeleton(parsed: dict) -> str:
    """The address below its admin levels with every number (a range or list as one, letters and stems with it)
    replaced by ``#``: 北山道247号 → 北山道#号, soho现代城a座1201 → soho现代城#座#."""
    return _NUMBER_GROUP.sub("#", below_admin(parsed))


def _group_numbers(group: str) -> tuple[str, set[int] | None]:
    """A number of :data:`_NUMBER_GROUP` without leading zeros, and the numbers it holds when it is a range (4-6:
    4, 5, 6) or a list (3、5: 3, 5)."""
    group = re.sub(r"(?<![0-9])0+(?=[0-9])", "", group)
    if m := re.fullmatch(r"([0-9]+)-([0-9]+)", group):
        return group, set(range(int(m[1]), int(m[2]) + 1)) if int(m[2]) - int(m[1]) <= 1000 else None
    if "、" in group and all(t.isdigit() for t in group.split("、")):
        return group, {int(t) for t in group.split("、")}
    return group, None


def _groups_agree(x: str, y: str) -> bool:
    """Two numbers at one place of one skeleton are one: equal, or a range or list holding the other's number."""
    (x, held_x), (y, held_y) = _group_numbers(x), _group_numbers(y)
    return x == y or bool(held_x and y.isdigit() and int(y) in held_x) or bool(held_y and x.isdigit() and int(x) in held_y)


def _differing_numbers(qa: dict, qb: dict) -> tuple[str, str] | None:
    """The two addresses below their admin levels are the same text but for numbers that are not one (白云拂公馆152
    / 白云拂公馆1592): the numbers that differ, as (query, candidate); None otherwise."""
    if _skeleton(qa) != _skeleton(qb):
        return None
    pairs = zip(_NUMBER_GROUP.findall(below_admin(qa)), _NUMBER_GROUP.findall(below_admin(qb)))
    differ = [(x, y) for x, y in pairs if not _groups_agree(x, y)]
    return ("、".join(x for x, _ in differ), "、".join(y for _, y in differ)) if differ else None


# Conflicts read off the text rather than off the tagger's elements, and the name (rows of their own in an
# explanation; the pair features, which read the tagger's elements, do not see them).
TEXT_CONFLICTS = ("numbers", "lane", "group", "name")


def number_conflicts(qa: dict, qb: dict) -> dict[str, tuple[str, str]]:
    """Where two parsed addresses write different numbers for the same thing: ``{element: (query, candidate)}``.

    - Both write the same numbers (letters and stems included) in the same order: no conflict, however the tagger
      split them (沁芳里682 read as building 6, room 82 on one side and building 68, room 2 on the other).
    - A numbered element (road number, building, unit, floor, room) both sides write with no number in common
      (:func:`numbers_agree`; an element with several spans conflicts only when no span of one side agrees with a
      span of the other); the spans of one element joined. Road numbers count only on the same road (or where
      neither side names one); a span the other side writes too, read there as another element, is no conflict.
      A room numbered by its floor is compared with a floor and room written apart (1201室 ~ 12楼01), and with a
      floor the other side writes alone (1202室 ≁ 3层: element ``floor``).
    - Otherwise, the two addresses below their admin levels are the same text but for their numbers (白云拂公馆152
      / 白云拂公馆1592, where the tagger reads the bare digits differently on each side): element ``numbers``.
    - Both write a branch lane (支弄) and no lane number in common (2000弄51支弄 / 2000弄70支弄): element ``lane``,
      read off the text, since the tagger labels these spans inconsistently; the same for a village group
      (3组 / 5组, 第3村民小组 / 第5村民小组): element ``group``.

    An element written on one side only is no conflict."""
    return _conflicts(_Numbers(qa), _Numbers(qb))


class _Numbers:
    """What :func:`number_conflicts` reads of one parsed address's numbers, each read when first asked and kept: in a
    batch a query meets each of its candidates, and a catalog entry several queries (:func:`number_conflicts_batch`).
    Nothing read here is changed by a caller. (Kept in slots by hand: ``functools.cached_property`` takes a lock on
    every first read, and most of a batch's sides are read once.)"""

    __slots__ = ("parsed", "_marks", "_numbered", "_normal_spans", "_road", "_lanes", "_groups")

    def __init__(self, parsed: dict):
        self.parsed = parsed
        self._marks = self._numbered = self._normal_spans = self._road = self._lanes = self._groups = _UNREAD

    @property
    def marks(self) -> tuple[str, ...]:
        if self._marks is _UNREAD:
            self._marks = _number_marks(self.parsed)
        return self._marks

    @property
    def numbered(self) -> dict[str, list[str]]:
        if self._numbered is _UNREAD:
            self._numbered = _numberspans(self.parsed)
        return self._numbered

    @property
    def normal_spans(self) -> set[str]:
        if self._normal_spans is _UNREAD:
            self._normal_spans = {_normal_span(t) for spans in self.numbered.values() for t in spans}
        return self._normal_spans

    @property
    def road(self) -> str | None:
        if self._road is _UNREAD:
            self._road = spans(self.parsed).get("road")
        return self._road

    @property
    def lanes(self) -> tuple[str, ...]:
        if self._lanes is _UNREAD:
            self._lanes = _runs(_LANE, self.parsed["text"])
        return self._lanes

    @property
    def groups(self) -> tuple[str, ...]:
        if self._groups is _UNREAD:
            self._groups = _runs(_GROUP, self.parsed["text"])
        return self._groups


_UNREAD = object()


def _conflicts(a: _Numbers, b: _Numbers) -> dict[str, tuple[str, str]]:
    """:func:`number_conflicts` of two sides."""
    qa, qb, marks_a, marks_b = a.parsed, b.parsed, a.marks, b.marks
    if marks_a == marks_b:
        return {}
    sa, sb = a.numbered, b.numbered
    spans_a, spans_b = a.normal_spans, b.normal_spans
    roads = [a.road, b.road]
    rooms = {"room": (_rooms_as_doors(sa, sb) or sa.get("room"), _rooms_as_doors(sb, sa) or sb.get("room"))}
    out = {}
    for name in NUMBERED:
        mine, theirs = rooms.get(name, (sa.get(name), sb.get(name)))
        if not mine or not theirs or any(numbers_agree(name, x, y) for x in mine for y in theirs):
            continue
        if name == "roadno" and (bool(roads[0]) != bool(roads[1]) or roads[0] and not same("road", *roads)):
            continue  # a number of another road (or of a road one side does not name): not comparable
        if any(_normal_span(t) in spans_b for t in sa[name]) or any(_normal_span(t) in spans_a for t in sb[name]):
            continue  # the other side writes this very span, read as another element (75号 a road number, a building)
        composed = (rooms["room"][0] is not sa.get("room"), rooms["room"][1] is not sb.get("room"))
        shown = [side.get("floor", []) + side[name] if name == "room" and read_with_floor else side[name]
                 for side, read_with_floor in zip((sa, sb), composed)]
        out[name] = ("".join(shown[0]), "".join(shown[1]))  # a room read with its floor is shown with it: 12楼02
    if "floor" not in out and "room" not in out and (floor := _floor_against_room(qa, qb, sa, sb)):
        out["floor"] = floor
    basement = any(_normal_span(f).startswith("b") for f in sa.get("floor", []) + sb.get("floor", []))
    if ("floor" in out or "room" in out) and sa.get("room") and sb.get("room") and not basement \
            and _door_digits(sa) == _door_digits(sb):
        out.pop("floor", None), out.pop("room", None)  # one door, split otherwise: 18 + 2 / 1层 + 82室
    for name, found_a, found_b, unit in (("lane", a.lanes, b.lanes, "支弄"), ("group", a.groups, b.groups, "组")):
        if found_a and found_b and not set(found_a) & set(found_b):
            out[name] = ("、".join(f"{n}{unit}" for n in found_a), "、".join(f"{n}{unit}" for n in found_b))
    if not out and marks_a and marks_b and (numbers := _differing_numbers(qa, qb)):
        out["numbers"] = numbers
    return out


def conflicts(qa: dict, qb: dict, found: dict[str, tuple[str, str]] | None = None) -> dict[str, tuple[str, str]]:
    """Where two parsed addresses are two places: :func:`number_conflicts` (``found``, when the caller has them), and
    element ``name`` when both name a place and the names are two places
    (:func:`mgeo_index.compare.names.name_conflict`). ``{element: (query, candidate)}``; empty when nothing
    conflicts."""
    return conflicts_batch([qa], [qb], None if found is None else [found])[0]


def number_conflicts_batch(parsed_a: Sequence[dict], parsed_b: Sequence[dict]) -> list[dict[str, tuple[str, str]]]:
    """:func:`number_conflicts` of each pair of parses: computed once for the pair features and the number policy,
    what each parse says of its numbers read once however many pairs it is in."""
    side = by_identity(_Numbers)
    return [_conflicts(side(qa), side(qb)) for qa, qb in zip(parsed_a, parsed_b)]


def conflicts_batch(parsed_a: Sequence[dict], parsed_b: Sequence[dict],
                    found: Sequence[dict] | None = None) -> list[dict[str, tuple[str, str]]]:
    """:func:`conflicts` of each pair of parses (``found``: their :func:`number_conflicts_batch`, when the caller has
    them), what each parse says of its name read once however many pairs it is in."""
    found = number_conflicts_batch(parsed_a, parsed_b) if found is None else found
    side = by_identity(Named)
    out = []
    for qa, qb, numbers in zip(parsed_a, parsed_b, found):
        names = name_conflict_of(side(qa), side(qb))
        out.append({**numbers, "name": names} if names else numbers)  # a new dict: ``found`` is the caller's
    return out


def by_identity(reading):
    """A function giving ``reading(parsed)`` of each parse once, by identity: for one batch's parses, which stay alive in
    the caller's lists meanwhile (a query repeats for each of its candidates, an entry for each query retrieving it)."""
    read: dict[int, object] = {}

    def side(parsed: dict):
        if (known := read.get(id(parsed))) is None:
            known = read[id(parsed)] = reading(parsed)
        return known

    return side
