"""The number test set: tagged addresses paired with variants of themselves, for the number policy
(:mod:`mgeo_index.model.numbers`).

Made from the shared tagged addresses' **test** split (:data:`NUMBER_TEST_FILES`; CCKS2021 track 2 masks its digits),
on which no choice is made. Every draw is seeded by the address text, so the set is the same on every machine.
Three parts, each a list of (address, variant, kind):

- ``changed``: another place, never to be called ``exact_match``. One number changed (kind = the element's label:
  roadno, houseno, cellno, floorno, roomno), and the ways people write another number (:data:`CONFLICT_KINDS`).
- ``controls``: the same place written otherwise, to stay ``exact_match``: province and city dropped, a number in
  Chinese numerals, full-width digits, and the writings of :data:`CONTROL_KINDS`.
- ``holds``: a range or list against one of its numbers (4至6号 / 5号): no conflict; the label is the scorer's call.

Each kind of writing is drawn from up to :data:`WRITINGS_PER_KIND` addresses and, but for ``holds``, paired both
ways round (the variant first too), as a query may write either.
"""
from __future__ import annotations

import random
import re

from mgeo_index.text.numerals import int_to_chinese

NUMBER_TEST_FILES = ("tagged_addresses_swei412.jsonl.gz", "tagged_addresses_ncap2019.jsonl.gz")
NUMBERED_LABELS = ("roadno", "houseno", "cellno", "floorno", "roomno")
_DIGITS = re.compile(r"[0-9]+")
_MARKED = re.compile(r"([0-9]+)(?=号|栋|幢|座|单元|层|楼|室|弄)")
_FULL_WIDTH = str.maketrans("0123456789", "０１２３４５６７８９")
_ROAD_NUMBER = re.compile(r"([1-9][0-9]{0,3})号")  # a whole road number span: 183号
_BUILDING = re.compile(r"([1-9][0-9]{0,2})(栋|座|幢|号楼)")
_FLOOR = re.compile(r"([1-9][0-9]?)(层|楼)")
_FLOOR_ROOM = re.compile(r"([1-9][0-9]?)([0-9]{2})(室?)")  # 1202室: room 02 of floor 12
_VILLAGE = re.compile(r".+村")
_AFTER_PART = re.compile(r"[0-9a-zA-Z元栋幢座楼层室号#-]")  # a hyphen after these separates, it is no minus
WRITINGS_PER_KIND = 300  # addresses drawn for each kind of writing (pairs: twice as many, both ways round)

# Another place, written as people write numbers.
CONFLICT_KINDS = {
    "letter_building": "a building letter changed: A座 / B座, A栋 / B栋",
    "separator_merged": "a range or list against the number its digits run into: 4~6号 / 46号, 3、5栋 / 35栋",
    "basement": "a basement against the floor of its digit: B1层, 负一层, -1层, 地下一层 / 1层",
    "room_floor": "a room against another floor: 1202室 / 3层",
    "stem": "another stem: 甲12号 / 乙12号",
    "group_numerals": "another village group in Chinese numerals: 三组 / 五组, 第三村民小组 / 第五村民小组",
    "lane_numerals": "another lane, one in Chinese numerals: 二百零八弄3号 / 280弄3号",
}
# The same place, written another way.
CONTROL_KINDS = {
    "room_writing": "a room and its floor written apart: 1201室 ~ 12楼01, 12F-01, 十二楼01室",
    "basement_writing": "one basement written otherwise: B1层 ~ 负一层, 地下一层, -1层",
    "separator_writing": "one range or list written otherwise: 4~6号 ~ 4至6号, 4-6号; 3、5栋 ~ 3，5栋",
    "stem_numerals": "a stemmed number in Chinese numerals: 甲12号 ~ 甲十二号",
    "group_numerals_same": "one village group in Chinese numerals: 三组 ~ 3组",
    "lane_numerals_same": "one lane in Chinese numerals: 二百零八弄3号 ~ 208弄3号",
}


def _other_number(digits: str, rng: random.Random) -> str:
    """Another number a hand or a keyboard could write for ``digits``: two digits swapped (194 → 914), one digit
    changed (118 → 117), a digit added or a digit dropped."""
    for _ in range(20):
        kind = rng.choice(("swap", "change", "add", "drop") if len(digits) > 1 else ("change", "add"))
        i = rng.randrange(len(digits))
        if kind == "swap":
            j = rng.randrange(len(digits))
            chars = list(digits)
            chars[i], chars[j] = chars[j], chars[i]
            out = "".join(chars)
        elif kind == "change":
            out = digits[:i] + str((int(digits[i]) + rng.randrange(1, 10)) % 10) + digits[i + 1:]
        elif kind == "add":
            out = digits[:i] + str(rng.randrange(1, 10)) + digits[i:]
        else:
            out = digits[:i] + digits[i + 1:]
        if out and out.lstrip("0") != digits.lstrip("0") and not out.startswith("0"):
            return out
    return str(int(digits) + 1)


def _span(spans, text: str, label: str, pattern: re.Pattern, rng: random.Random):
    """A random span of ``label`` whose whole text ``pattern`` matches: (start, end, match), or None."""
    found = [(s, e, m) for lab, s, e in spans if lab == label and (m := pattern.fullmatch(text[s:e]))]
    return rng.choice(found) if found else None


def _writings(text: str, spans, rng: random.Random) -> dict[str, list[tuple[str, str, str]]]:
    """The writing pairs one address gives: at most one per kind, keyed by part (changed, controls, holds)."""
    out: dict[str, list] = {"changed": [], "controls": [], "holds": []}

    def put(part: str, kind: str, s: int, e: int, first: str, second: str):
        """Pair ``text`` with [s, e) written as ``first`` and as ``second`` (s == e: inserted there)."""
        out[part].append((text[:s] + first + text[e:], text[:s] + second + text[e:], kind))

    labels = {lab for lab, _, _ in spans}
    road = _span(spans, text, "roadno", _ROAD_NUMBER, rng)
    if road:
        s, e, m = road
        n = int(m[1])
        low, high = n, n + rng.randint(1, 4)
        range_mark = rng.choice(("~", "～", "至", "-", "到"))
        list_mark = rng.choice(("、", "，", ",", " "))
        merged = f"{low}{high}号"
        written = rng.choice((f"{low}{range_mark}{high}号", f"{low}{list_mark}{high}号"))
        put("changed", "separator_merged", s, e, written, merged)
        if rng.random() < 0.5:
            put("controls", "separator_writing", s, e, f"{low}~{high}号", f"{low}{rng.choice(('至', '-', '到'))}{high}号")
        else:
            put("controls", "separator_writing", s, e, f"{low}、{high}号", f"{low}{rng.choice(('，', ',', ' '))}{high}号")
        member = rng.randint(low, high)
        put("holds", "range_member", s, e, rng.choice((f"{low}至{high}号", f"{low}号-{high}号", f"{low}~{high}号")),
            f"{member}号")
        one, other = rng.sample("甲乙丙丁", 2)
        put("changed", "stem", s, e, f"{one}{n}号", f"{other}{n}号")
        put("controls", "stem_numerals", s, e, f"{one}{n}号", f"{one}{int_to_chinese(n)}号")
        lane = rng.randint(11, 999)
        put("changed", "lane_numerals", s, e, f"{int_to_chinese(lane)}弄{n}号", f"{_other_number(str(lane), rng)}弄{n}号")
        put("controls", "lane_numerals_same", s, e, f"{int_to_chinese(lane)}弄{n}号", f"{lane}弄{n}号")
    building = _span(spans, text, "houseno", _BUILDING, rng)
    if building:
        s, e, m = building
        unit = m[2] if m[2] in ("栋", "座") else rng.choice(("栋", "座"))
        one, other = rng.sample("ABCDEFGH", 2)
        put("changed", "letter_building", s, e, f"{one}{unit}", f"{other}{unit}")
        n = int(m[1])
        if rng.random() < 0.5:
            put("changed", "separator_merged", s, e, f"{n}{rng.choice(('~', '至'))}{n + 2}{m[2]}", f"{n}{n + 2}{m[2]}")
        else:
            put("changed", "separator_merged", s, e, f"{n}{rng.choice(('、', '，'))}{n + 2}{m[2]}", f"{n}{n + 2}{m[2]}")
    floor = _span(spans, text, "floorno", _FLOOR, rng)
    if floor:
        s, e, m = floor
        depth = rng.randint(1, 3)
        unit = m[2]
        others = [f"负{int_to_chinese(depth)}{unit}", f"地下{int_to_chinese(depth)}{unit}"]
        if s and _AFTER_PART.match(text[s - 1]) is None:  # -1层 is a basement, 3单元-1层 floor 1 of unit 3
            others.append(f"-{depth}{unit}")
        put("changed", "basement", s, e, rng.choice([f"B{depth}{unit}", *others]), f"{depth}{unit}")
        put("controls", "basement_writing", s, e, f"B{depth}{unit}", rng.choice(others))
    room = _span(spans, text, "roomno", _FLOOR_ROOM, rng) if "floorno" not in labels else None
    if room:
        s, e, m = room
        level, door = int(m[1]), m[2]
        writing = rng.choice((f"{level}楼{door}", f"{level}F-{door}", f"{int_to_chinese(level)}楼{door}室",
                              f"{level}层{door}室"))
        put("controls", "room_writing", s, e, text[s:e], writing)
        other = rng.choice([f for f in range(1, max(level + 5, 10)) if f != level])
        put("changed", "room_floor", s, e, text[s:e], f"{other}{rng.choice(('层', '楼'))}")
    village = next(((s, e) for lab, s, e in spans if lab == "community" and _VILLAGE.fullmatch(text[s:e])), None)
    if village and "组" not in text:  # a group inserted after the village (not beside one it has)
        _, e = village
        one, other = rng.sample(range(1, 13), 2)
        group = rng.choice(("{}组", "第{}村民小组"))
        put("changed", "group_numerals", e, e, group.format(int_to_chinese(one)), group.format(int_to_chinese(other)))
        put("controls", "group_numerals_same", e, e, group.format(int_to_chinese(one)), group.format(one))
    return out


def number_pairs(examples: list[tuple[str, list[tuple[str, int, int]]]], seed: int = 0) -> dict[str, list[tuple[str, str, str]]]:
    """The number test set from tagged addresses (``examples``: normalized text and labelled spans, as
    :func:`mgeo_index.training.tagger.load_examples` gives them): ``{"changed", "controls", "holds"}``, each a list of
    (address, its variant, kind) (see the module docstring).

    One number changed (:func:`_other_number`, kind = the element's label) and the three older controls —
    ``no_province_city``, ``chinese_numerals`` (a number in Chinese numerals), ``full_width`` — come first, one way
    round; then the writings. Only addresses that write a number, none masked (``#``), give pairs: at most one of
    each kind; the draws are seeded by the text."""
    changed, controls = [], []
    for text, spans in examples:
        rng = random.Random(f"{seed}:{text}")
        numbered = [(label, s, e) for label, s, e in spans if label in NUMBERED_LABELS and _DIGITS.search(text[s:e])]
        if numbered and "#" not in text:  # "##": digits masked in the source
            label, s, e = rng.choice(numbered)
            runs = list(_DIGITS.finditer(text, s, e))
            run = rng.choice(runs)
            changed.append((text, text[: run.start()] + _other_number(run.group(), rng) + text[run.end():], label))
            # a whole number followed by its unit, as people write one in Chinese numerals (十二号楼, not 4二百零三)
            small = [r for r in _MARKED.finditer(text, s, e) if int(r[1]) < 10_000 and not r[1].startswith("0")
                     and (r.start() == 0 or not text[r.start() - 1].isdigit())]
            if small:
                run = rng.choice(small)
                controls.append((text, text[: run.start()] + int_to_chinese(int(run[1])) + text[run.end(1):],
                                 "chinese_numerals"))
            controls.append((text, text.translate(_FULL_WIDTH), "full_width"))
            rest = "".join(text[s:e] for label, s, e in spans if label not in ("prov", "city"))
            if len(rest) >= 6 and rest != text:
                controls.append((text, rest, "no_province_city"))
    by_kind: dict[tuple[str, str], list] = {}
    for text, spans in examples:
        if "#" not in text:
            for part, rows in _writings(text, spans, random.Random(f"{seed}:writings:{text}")).items():
                for row in rows:
                    by_kind.setdefault((part, row[2]), []).append(row)
    writings: dict[str, list] = {"changed": [], "controls": [], "holds": []}
    for (part, _), rows in sorted(by_kind.items()):
        rows = random.Random(f"{seed}:{part}").sample(rows, min(len(rows), WRITINGS_PER_KIND))
        writings[part] += rows + ([(b, a, kind) for a, b, kind in rows] if part != "holds" else [])
    return {"changed": changed + writings["changed"], "controls": controls + writings["controls"],
            "holds": writings["holds"]}
