"""Text normalization applied before every encode, index and comparison.

Kept deliberately conservative: it must be idempotent (normalize(normalize(x)) == normalize(x))
and must never drop information that distinguishes two addresses (numbers, letters, CJK).
"""
from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")
# Punctuation that carries no address meaning; hyphens, '#', '/' and parentheses are kept
# because they separate numbers (3-2-501, 7#, 12/F) and mark sub-locations.
_NOISE = re.compile(r"[\"'`~!！@$%^&*_=+|\\;:；：,，。、?？<>《》「」『』【】\[\]{}·…]+")
# Control characters, and lone surrogates (from JSON "\ud800" escapes or undecodable command-line bytes),
# which no encoder or tokenizer accepts.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def normalize(text: str) -> str:
    """NFKC (full-width → half-width), lowercase, drop control chars, lone surrogates, noise punctuation and spaces."""
    # Removing a character can let its neighbours compose differently under NFKC (a + space +
    # combining accent), so repeat until nothing changes: that is what makes it idempotent.
    for _ in range(4):
        before = text
        text = unicodedata.normalize("NFKC", text).lower()
        text = _CONTROL.sub("", text)
        text = _NOISE.sub("", text)
        text = _SPACE.sub("", text)
        if text == before:
            break
    return text


def printable(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD, so it can be written as UTF-8 (echoing input)."""
    return _SURROGATE.sub("\ufffd", text)
