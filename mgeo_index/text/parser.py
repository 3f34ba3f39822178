"""Address parsing: normalize → element tagger (batched) → gazetteer admin chain with codes.

``parse(["北京朝阳建国路88号"])`` →
``[{"input": ..., "text": "北京朝阳建国路88号", "elements": [{"label": "prov", "text": "北京", "start": 0, "end": 2}, ...],
"admin": {"province": "北京市", "province_code": "110000", "city": ..., "district": "朝阳区", ...}}]``.
Spans index into ``text`` (the normalized address). ``redundant`` spans (noise) are left out.
A sender / receiver label before the address (寄件人宁海县…, 收货地址…) is not shown to the tagger
(it was trained on addresses alone and read the label and the county after it as noise).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import lru_cache
from itertools import groupby

from mgeo_index.text.gazetteer import DEFAULT_PATH as GAZETTEER_PATH, Gazetteer, default_gazetteer
from mgeo_index.text.normalize import normalize
from mgeo_index.text.tagger import DEFAULT_DIR as TAGGER_DIR, Tagger, default_tagger

ADMIN_LEVELS = {"prov": 1, "city": 2, "district": 3, "town": 4}
BATCH = 256  # rows of one length a batch (10,000 tagged addresses, one thread: 128 3,180, 256 3,350–3,610, 512 3,370, 1,024 3,200 a second)
# elements whose text may start with a county name the tagger did not tag (not roads: 宁海路, 昆山路)
HINT_LABELS = {"poi", "subpoi", "devzone", "community", "village", "assist", "redundant", "person"}
LABEL = re.compile(r"^(?:(?:寄件|发件|收件|收货|联系)人|(?:寄件|发件|收件|收货|发货|送货|详细|联系)?地址)+")


def tag_batched(tagger: Tagger, texts: Sequence[str], batch_size: int = BATCH) -> list[list[tuple[str, int, int]]]:
    """Tagger spans per text, in input order. Each batch holds texts of one length (as the tagger reads them:
    cut to its ``max_length``), at most ``batch_size`` of them, so the LSTM runs without packing.
    A leading sender / receiver label (``LABEL``) is cut off before tagging; spans still index
    into the whole text."""
    skip = [(m.end() if (m := LABEL.match(t)) and m.end() < len(t) else 0) for t in texts]
    width = [min(len(t) - k, tagger.cfg.max_length) for t, k in zip(texts, skip)]
    order = sorted(range(len(texts)), key=lambda i: width[i])
    out: list = [None] * len(texts)
    for _, same in groupby(order, key=lambda i: width[i]):
        same = list(same)
        for i in range(0, len(same), batch_size):
            chunk = same[i : i + batch_size]
            for j, spans in zip(chunk, tagger.tag([texts[j][skip[j]:] for j in chunk])):
                out[j] = [(label, s + skip[j], e + skip[j]) for label, s, e in spans] if skip[j] else spans
    return out


def admin_mentions(
    text: str, spans: Sequence[tuple[str, int, int]], gazetteer: Gazetteer | None = None
) -> list[tuple[str, int]]:
    """(name, level) of the admin spans. With a gazetteer, a span the tagger started one or two
    characters late is extended when that spells an official name of its level (市南区 tagged
    南区, 沙坡头区 tagged 坡头区); a span the extension swallows is dropped."""
    found = [(s, e, ADMIN_LEVELS[label]) for label, s, e in spans if label in ADMIN_LEVELS]
    if gazetteer is not None:
        extended = False
        for i, (s, e, level) in enumerate(found):
            for k in (1, 2):
                if s - k >= 0 and gazetteer.is_official(text[s - k : e], level):
                    found[i] = (s - k, e, level)
                    extended = True
                    break
        if extended:  # the tagger's spans never overlap: only an extended one can swallow another
            found = [m for m in found if not any(
                o is not m and o[0] <= m[0] and m[1] <= o[1] and o[1] - o[0] > m[1] - m[0] for o in found
            )]
    return [(text[s:e], level) for s, e, level in found]


def admin_hints(text: str, spans: Sequence[tuple[str, int, int]], gazetteer: Gazetteer) -> list[tuple[str, int]]:
    """Official county-level names at the start of other elements (进贤县向元小区 tagged as a POI,
    苏州工业园区 as a development zone): weak mentions the gazetteer uses only where the district is
    left empty."""
    hints = []
    for label, s, e in spans:
        if label in HINT_LABELS and (name := gazetteer.leading_county(text[s:e])):
            hints.append((name, 3))
    return hints


def parse(
    texts: Sequence[str], *, tagger: Tagger | None = None, gazetteer: Gazetteer | None = None
) -> list[dict]:
    """Elements and standardized admin fields of each address (see the module docstring)."""
    tagger = tagger or default_tagger()
    gazetteer = gazetteer or default_gazetteer()
    norm = [normalize(t) for t in texts]
    results = []
    for raw, text, spans in zip(texts, norm, tag_batched(tagger, norm)):
        cased = _cased(raw, text)
        results.append({
            "input": raw,
            "text": text,
            "elements": [
                {"label": label, "text": text[s:e], "start": s, "end": e}
                | ({"display": cased[s:e]} if cased is not None and cased[s:e] != text[s:e] else {})
                for label, s, e in spans if label != "redundant"
            ],
            "admin": gazetteer.resolve(
                admin_mentions(text, spans, gazetteer), text, admin_hints(text, spans, gazetteer)
            ),
        })
    return results


@lru_cache(maxsize=1)
def _cased(raw: str, text: str) -> str | None:
    """``raw`` normalized with its letters as written, when it lines up with ``text`` (its lowercase) character for
    character; None when the input has no capitals or lowercasing changed a length (İ)."""
    if not any(c.isupper() for c in raw):
        return None
    cased = normalize(raw, lower=False)
    return cased if len(cased) == len(text) and cased.lower() == text else None


def parser_version() -> str:
    """Fingerprint of the shipped tagger and gazetteer files (stored with each parsed entry)."""
    digest = hashlib.sha256(b"fp32")  # the tagger's precision: the int8 one parsed a few addresses otherwise
    for path in (TAGGER_DIR / "model.safetensors", GAZETTEER_PATH):
        digest.update(path.read_bytes())
    return f"parser-{digest.hexdigest()[:16]}"
