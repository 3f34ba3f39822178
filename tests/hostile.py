"""Hostile input generators (hypothesis strategies), shared by the tests of every entry point.

- :func:`hostile_text`: strings with random Unicode, control characters, NUL bytes, lone surrogates,
  emoji, mixed scripts, bidi/zero-width marks and very long runs;
- :func:`hostile_csv`: bytes of a CSV/TSV file — broken quoting, wrong column counts, NUL bytes,
  invalid UTF-8, BOMs, odd line ends, huge fields, empty files;
- :func:`hostile_json_bodies`: ``(kind, bytes)`` HTTP request bodies for a JSON API — well-formed
  requests carrying hostile strings, wrong types, missing fields, deep nesting, huge arrays, truncated
  or invalid JSON, invalid UTF-8, lone-surrogate escapes, NaN, duplicate keys, empty bodies.  Written
  for the HTTP service: post each body and check the reply with :func:`assert_clean_reply`.
"""
from __future__ import annotations

import json

from hypothesis import strategies as st

SPECIAL = [
    "", " ", "\x00", "\x07", "\x1b[31m", "\x7f", "\x85", "\ud800", "\udfff", "\udc80", "\ufeff", "\u202e", "\u200b",
    "\u00a0", "\u3000", "\r", "\n", "\r\n", '"', '""', "'", "\t", ",", ";", "|", "\\", "[/]", "[bold]", "{", "}",
    "😀", "👨\u200d👩\u200d👧", "🇨🇳", "北京市朝阳区建国路88号", "広東省", "Straße", "ﾀﾞｲﾊﾞｰ", "١٢٣", "שָׁלוֹם", "𠀋𡈽",
    "\uffff", "\U0010ffff", "NaN", "null", "-1", "0x", "１２３号", "Ⅻ", "ㄅㄆ", "%s%n", "' OR 1=1 --", "<script>",
]
ADDRESS_BITS = ["北京", "朝阳区", "建国路", "88号", "广东省", "深圳市", "南山区", "中山路", "75号", "9号楼", "3单元", "501室"]
_ANY_CHAR = st.characters(exclude_categories=())  # surrogates (Cs) and control characters (Cc) included


def hostile_text(max_size: int = 40, huge: int = 12_000) -> st.SearchStrategy[str]:
    """Hostile strings: random code points, special pieces mixed with address parts, or a long run of up
    to ``huge`` characters."""
    pieces = st.one_of(st.sampled_from(SPECIAL), st.sampled_from(ADDRESS_BITS), st.text(_ANY_CHAR, max_size=8))
    return st.one_of(
        st.text(_ANY_CHAR, max_size=max_size),
        st.lists(pieces, max_size=8).map("".join),
        st.builds(lambda s, n: s * n, st.sampled_from(["北", "😀", "a", "\x00", "\ud800", "号 ", "\u0301"]),
                  st.integers(min(300, huge), huge)),
    )


_RANGES = [(0x00, 0x1F), (0x20, 0x7E), (0x7F, 0x9F), (0x4E00, 0x9FFF), (0x3000, 0x303F), (0xFF00, 0xFFEF),
           (0xD800, 0xDFFF), (0x1F300, 0x1FAFF), (0x0590, 0x06FF), (0x0300, 0x036F), (0x20000, 0x2A6DF), (0, 0x10FFFF)]


def random_text(rnd, huge: int = 100) -> str:
    """A hostile string from a seeded ``random.Random`` (cheap: for inputs that need many strings)."""
    mode = rnd.random()
    if mode < 0.35:  # random code points from hostile ranges
        out = []
        for _ in range(rnd.randint(0, 12)):
            lo, hi = rnd.choice(_RANGES)
            out.append(chr(rnd.randint(lo, hi)))
        return "".join(out)
    if mode < 0.9:  # special pieces mixed with address parts
        return "".join(rnd.choice(SPECIAL if rnd.random() < 0.5 else ADDRESS_BITS) for _ in range(rnd.randint(0, 6)))
    return rnd.choice(["北", "😀", "a", "\x00", "\ud800", "号 ", "\u0301"]) * rnd.randint(min(300, huge), huge)


def _encode(text: str, encoding: str) -> bytes:
    if encoding == "gb18030":
        return text.encode("gb18030", "replace")
    return text.encode("utf-8", "surrogatepass")  # lone surrogates become invalid UTF-8 bytes


@st.composite
def hostile_csv(draw, header: list[str] | None = None, max_rows: int = 10, delimiters: str = ",\t;|") -> bytes:
    """Bytes of a delimited file: a plausible or hostile header, then rows of random width and quoting
    (content from a seeded ``random.Random`` drawn from hypothesis, so examples stay reproducible)."""
    rnd = draw(st.randoms(use_true_random=False))
    delimiter = rnd.choice(delimiters)
    columns = header or rnd.choice([["poi_id", "name", "address", "city"], ["address"], ["id", "address"],
                                    ["地址", "名称"], ["a", "b"], None])
    if columns is None:
        columns = [random_text(rnd) for _ in range(rnd.randint(1, 5))]
    line_end = rnd.choice(["\n", "\r\n", "\r"])
    encoding = rnd.choice(["utf-8", "utf-8", "gb18030"])

    broken = rnd.random() < 0.25  # a file with some quotes never closed (they swallow the lines after them)

    def field(value: str) -> str:
        style = rnd.random()
        if style < 0.15:
            return '"' + value.replace('"', '""') + '"'
        if broken and style < 0.2:
            return '"' + value
        return value

    lines = [delimiter.join(columns if header else [field(c) for c in columns])]  # a given header stays intact
    for _ in range(rnd.randint(0, max_rows)):
        width = max(0, len(columns) + rnd.choice([0, 0, 0, 0, -1, 1, 2, -len(columns)]))
        lines.append(delimiter.join(field(random_text(rnd)) for _ in range(width)))
    text = line_end.join(lines) + rnd.choice([line_end, "", line_end * 3])
    data = rnd.choice([b"", b"", b"\xef\xbb\xbf"]) + _encode(text, encoding)
    if rnd.random() < 0.3:  # raw garbage somewhere: NUL, invalid UTF-8, a truncated multi-byte character
        at = rnd.randint(0, len(data))
        data = data[:at] + rnd.choice([b"\x00", b"\xff\xfe", b"\xe5\x8c", b"\x80", b"\x00" * 64]) + data[at:]
    if rnd.random() < 0.05:  # degenerate files: empty, only a BOM, only blank lines, one NUL
        return rnd.choice([b"", b"\xef\xbb\xbf", b"\n\n", b"\x00"])
    return data


_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), hostile_text(20))
_JSON_VALUES = st.recursive(_JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                   st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                            max_leaves=12)


@st.composite
def hostile_json_bodies(draw, field: str = "queries") -> tuple[str, bytes]:
    """``(kind, body)``: a request body for a JSON endpoint taking a list of addresses in ``field``."""
    kind = draw(st.sampled_from(["strings", "strings", "wrong_types", "missing", "nested", "huge_array", "truncated",
                                 "not_utf8", "surrogate_escape", "nan", "duplicate_keys", "empty", "not_json", "scalar"]))
    def dump(obj) -> bytes:
        return json.dumps(obj, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")

    if kind == "strings":
        body = dump({field: draw(st.lists(hostile_text(), max_size=20)), "top_k": draw(st.integers(-5, 5000))})
    elif kind == "wrong_types":
        body = dump({field: draw(_JSON_VALUES), "top_k": draw(_JSON_VALUES)})
    elif kind == "missing":
        body = dump(draw(st.dictionaries(st.text(max_size=8), _JSON_VALUES, max_size=3)))
    elif kind == "nested":
        depth = draw(st.integers(50, 5000))
        body = (b"[" * depth) + b"]" * depth
    elif kind == "huge_array":
        body = dump({field: ["北京朝阳建国路88号"] * draw(st.integers(1001, 20000))})  # over any sane batch limit
    elif kind == "truncated":
        full = dump({field: draw(st.lists(hostile_text(), min_size=1, max_size=5))})
        body = full[: draw(st.integers(0, max(0, len(full) - 1)))]
    elif kind == "not_utf8":
        body = b'{"' + field.encode() + b'": ["\xff\xfe\x80 \xe5\x8c"]}'
    elif kind == "surrogate_escape":
        body = ('{"' + field + '": ["\\ud800", "a\\udfffb", "\\ud83d"]}').encode()
    elif kind == "nan":
        body = ('{"' + field + '": ["x"], "top_k": NaN, "limit": Infinity}').encode()
    elif kind == "duplicate_keys":
        body = ('{"' + field + '": ["a"], "' + field + '": [1, 2]}').encode()
    elif kind == "empty":
        body = draw(st.sampled_from([b"", b" ", b"\n", b"\xef\xbb\xbf"]))
    elif kind == "scalar":
        body = dump(draw(_JSON_SCALARS))
    else:
        body = draw(st.binary(max_size=200))
    return kind, body


def assert_clean_reply(status: int, body: bytes) -> None:
    """What any reply to a hostile request must be: a 2xx with JSON, or a 4xx JSON error naming the
    problem — never a 5xx (a traceback), never a non-JSON body."""
    assert status < 500, f"server error {status}: {body[:500]!r}"
    payload = json.loads(body.decode("utf-8"))
    if status >= 400:
        assert isinstance(payload, dict) and (payload.get("detail") or payload.get("error")), payload
