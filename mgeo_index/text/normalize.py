"""Text normalization applied before every encode, index, parse and comparison.

Idempotent (normalize(normalize(x)) == normalize(x)) and conservative: it never drops what
distinguishes two addresses (numbers, letters, CJK). Steps, repeated until nothing changes:

1. NFKC (full-width → half-width), lowercase, control characters removed;
2. traditional → simplified Chinese (OpenCC ``t2s``, only for characters outside GB2312);
3. phone numbers removed (mobile ``1[3-9]`` + 9 digits, landline ``0AA(A)-NNNNNNN(N)``), with a
   label directly before them (电话, 手机, tel);
4. parenthesized notes that are not address parts removed: ``(电联)``, ``(收件人张三)``, ``(联系…)``;
5. a separator between two numbers kept, so that two numbers never run into a third: a range (4~6号, 4至6号,
   4到6号, 21号—23号) is written with a hyphen (4-6号, 21号-23号), a list (3、5栋, 4，6号, "4 6号", 4·6号) with 、
   (3、5栋, 4、6号);
6. punctuation without address meaning and whitespace removed (hyphens, '#', '/' and parentheses
   stay: they separate numbers such as 3-2-501, 7#, 12/f and mark sub-locations);
7. Chinese numerals written as house / building / unit / floor / room / lane / village-group numbers turned into
   digits (八十八号 → 88号, 三单元 → 3单元, 十二楼 → 12楼, 七巷 → 7巷, 六期 → 6期, 二百零八弄3号 → 208弄3号,
   三组 → 3组, 第五村民小组 → 第5村民小组); other numerals (五一路, 十里河, 一号线) stay;
8. a basement floor written one way: 负一层, 地下一层, -1层, 负1楼 → b1层, b1楼 (as B1层 is written).
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from mgeo_index import settings
from mgeo_index.text.numerals import NUMERAL_CHARS, chinese_to_int

_SPACE = re.compile(r"\s+")
_NOISE = re.compile(r"[\"'`~!！@$%^&*_=+|\\;:；：,，。、?？<>《》「」『』【】\[\]{}·…]+")
# Between two numbers (step 5): a range mark becomes a hyphen (a unit written after the first number stays:
# 21号至23号 → 21号-23号), a list mark (or a space) becomes 、, which the noise step then keeps.
_RANGE_MARK = re.compile(r"([0-9])(号|栋|幢|弄)?\s*(?:[~〜至到—–]|\s-|-\s)\s*(?=[0-9])")
_LIST_MARK = re.compile(r"(?<=[0-9])[\s、，,·*_]+(?=[0-9])")
_LIST = "、"
_KEPT_LIST = re.compile(rf"(?<=[0-9]){_LIST}(?=[0-9])")
# Control characters, and lone surrogates (from JSON "\ud800" escapes or undecodable command-line bytes),
# which no encoder or tokenizer accepts.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Invisible format characters too (zero-width spaces and joiners, BOM, bidi marks and embeddings, soft hyphen):
# 文三路\u200b478号 is 文三路478号.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                      r"\u2066-\u206f\ufeff\ufff9-\ufffb]")
_PHONE = re.compile(
    r"(?:(?:联系|收件人|收货人)?(?:电话|手机|tel|phone)(?:号码?)?[:：]?\s*)?"
    r"(?<![0-9])(?:\+?86-?)?(?:1[3-9][0-9](?:[- ]?[0-9]{4}){2}|0[0-9]{2,3}-[0-9]{7,8})(?![0-9])",
    re.IGNORECASE,  # TEL: the same steps with and without lowercasing (normalize(..., lower=False))
)
# A parenthesized note: a contact instruction or a person, never an address part.
_NOTE = re.compile(r"\((?:[^()]*?(?:电联|联系|收件人|收货人|电话|手机|快递|送货|签收|到付))[^()]*\)|\(\s*\)")
# Chinese numerals directly before a house / building / unit / floor / room suffix; not before
# 号线 (metro lines) or 号路/号街/号大道 (roads named by number), which are names.
_NUMBERED = re.compile(
    rf"(?<![{NUMERAL_CHARS}])([{NUMERAL_CHARS}]{{1,7}})"  # up to 一千二百二十七
    r"(?=号(?!线|路|街|大道)|栋|幢|座|单元|层|楼|室|户|巷|期|弄|组(?!团|合|织)|村民小组|村民组|小组)"
)
# A basement floor (step 8): 负1层, 地下1层, -1层 (not 3-1层: floor 1 of building 3), 负1楼, -1f.
# A hyphen after a building, unit or room is a separator (43-3单元-1楼: floor 1 of unit 3), not a minus.
_BASEMENT = re.compile(r"(?:负|地下|(?<![0-9a-zA-Z元栋幢座楼层室号#])-)([0-9]{1,2})(?=层|楼|[fF](?![a-zA-Z]))")


@lru_cache(maxsize=1)
def _t2s():
    import opencc

    return opencc.OpenCC("t2s")


@lru_cache(maxsize=65536)
def _is_simplified(char: str) -> bool:
    """In GB2312, the simplified-Chinese character set (乾, 昇 are; 廣, 區, 輋 are not)."""
    try:
        char.encode("gb2312")
        return True
    except UnicodeEncodeError:
        return False


def to_simplified(text: str) -> str:
    """Traditional → simplified (OpenCC t2s), keeping every character that is already simplified:
    a converted character is taken only when the original is outside GB2312 and the result is in
    it, so names such as 乾清路 or 樟輋村 are not rewritten into other words or rarer characters."""
    if text.isascii():
        return text
    converted = _t2s().convert(text)
    if converted == text:
        return text
    if len(converted) != len(text):  # a phrase changed length: convert character by character
        converted = "".join(new if len(new := _t2s().convert(c)) == 1 else c for c in text)
    return "".join(
        new if new != old and not _is_simplified(old) and _is_simplified(new) else old
        for old, new in zip(text, converted)
    )


def basic(text: str) -> str:
    """The first normalization (NFKC, lowercase, noise punctuation and spaces only; a separator between two
    numbers kept as in :func:`normalize`)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _CONTROL.sub("", text)
    return _SPACE.sub("", _drop_noise(_separators(text)))


def _separators(text: str) -> str:
    """Step 5: a range mark between two numbers as a hyphen, a list mark as 、 (see the module docstring)."""
    return _LIST_MARK.sub(_LIST, _RANGE_MARK.sub(r"\1\2-", text))


def _drop_noise(text: str) -> str:
    """Step 6's punctuation removed, but a list mark between two numbers (3、5栋) kept."""
    if _LIST not in text:
        return _NOISE.sub("", text)
    parts = _KEPT_LIST.split(text)
    return _LIST.join(_NOISE.sub("", part) for part in parts)


def _numeral(match: re.Match) -> str:
    try:
        return str(chinese_to_int(match.group(1)))
    except ValueError:
        return match.group(1)


def normalize(text: str, *, lower: bool = True) -> str:
    """Normalized address text (see the module docstring for the steps). ``lower=False``: the same steps but
    lowercasing, for showing people their own letters (b栋 is written B栋)."""
    # Each step can expose work for another (a space inside a phone number, a note emptied by a
    # removed phone), so repeat until nothing changes: that is what makes it idempotent.
    for _ in range(6):
        before = text
        text = unicodedata.normalize("NFKC", text)
        text = text.lower() if lower else text
        text = _CONTROL.sub("", text)
        text = to_simplified(text)
        text = _PHONE.sub("", text)
        text = _NOTE.sub("", text)
        text = _separators(text)
        text = _drop_noise(text)
        text = _SPACE.sub("", text)
        text = _NUMBERED.sub(_numeral, text)  # after the spaces: 〇 八栋 is one number
        text = _BASEMENT.sub(r"b\1" if lower else r"B\1", text)
        if text == before:
            break
    return text


def model_text(text: str, *, normalized: bool = False) -> str:
    """An address as the models read it: normalized (``normalized``: ``text`` already is), cut to
    ``settings.MAX_QUERY_CHARS`` (a query, either side of a pair). Reviewers' decisions are stored under a query's
    ``model_text`` (``labels.query_normalized``)."""
    return (text if normalized else normalize(text))[: settings.MAX_QUERY_CHARS]


def with_name(address: str, name: str | None) -> str:
    """A place kept as address + name, as one text to match (the way map catalogs write a POI: 建国路88号肯德基):
    the address with its name after it, or the address alone when it has no name or already writes it."""
    if not name or not name.strip() or normalize(name) in normalize(address):
        return address
    return f"{address}{name.strip()}"


def query_key(address: str, name: str | None = None) -> str:
    """One query as the resolver reads it (:func:`model_text` of the address with its name after it), with its name
    field: the key its answer is kept under (a job's repeated rows, the service's cache)."""
    text = model_text(with_name(address, name))
    return f"{text}\x1f{name}" if name else text


def not_an_address(normalized: str) -> str | None:
    """Why a row's normalized address cannot be matched, or None: nothing left (punctuation, a phone number
    normalization removed) or only digits (+86 138-0000-0000 leaves 86: no place, street or unit to match)."""
    if not has_content(normalized):
        return "address has no letters or digits left after normalization"
    if not any(ch.isalpha() for ch in normalized):
        return f"address is only digits after normalization ({normalized[:20]}: a phone number?), no place to match"
    return None


def has_content(text: str) -> bool:
    """Whether a (normalized) address has a letter or digit: "..." (from "…") or "-" alone has nothing to match."""
    return any(ch.isalnum() for ch in text)


def printable(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD, so it can be written as UTF-8 (echoing input)."""
    return _SURROGATE.sub("\ufffd", text)


def visible(text: str) -> str:
    """:func:`printable` ``text`` with control characters (escape sequences, tabs, newlines) as visible escapes
    (``\x1b``, ``\t``): what a terminal or a one-line cell may show of input, which must not set a terminal's
    title, clear its screen or break a line."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) == "Cc" else ch
                   for ch in printable(text))
