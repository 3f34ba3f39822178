"""Chinese numerals → Arabic digits, for house / building / unit / floor / room numbers only.

``八十八`` → 88, ``三`` → 3, ``二〇一`` → 201 (digit by digit when there is no 十/百/千),
``一百零五`` → 105, ``两`` → 2.
"""
from __future__ import annotations

DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
UNITS = {"十": 10, "百": 100, "千": 1000}
NUMERAL_CHARS = "".join(DIGITS) + "".join(UNITS)


def chinese_to_int(text: str) -> int:
    """Value of a run of Chinese numerals below 10,000; ValueError when it is not one."""
    if not text or any(c not in DIGITS and c not in UNITS for c in text):
        raise ValueError(f"not a Chinese numeral: {text!r}")
    if not any(c in UNITS for c in text):  # 二〇一 → 201: read digit by digit
        return int("".join(str(DIGITS[c]) for c in text))
    total, digit, last_unit = 0, None, 10_000
    for char in text:
        if char in DIGITS:
            if digit:  # two non-zero digits in a row (三四十) is not a number
                raise ValueError(f"not a Chinese numeral: {text!r}")
            digit = DIGITS[char]
        else:
            unit = UNITS[char]
            if unit >= last_unit:
                raise ValueError(f"not a Chinese numeral: {text!r}")
            total += (1 if digit is None else digit) * unit  # 十二 = 1×10 + 2
            digit, last_unit = None, unit
    if digit is not None:
        total += digit
    return total
