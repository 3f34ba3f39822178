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


def int_to_chinese(value: int) -> str:
    """``value`` (0–9,999) in Chinese numerals as addresses write them: 88 → 八十八, 105 → 一百零五, 12 → 十二."""
    if not 0 <= value < 10_000:
        raise ValueError(f"{value} is outside 0–9,999")
    if value == 0:
        return "零"
    names = "零一二三四五六七八九"
    out, pending_zero = "", False
    for unit, unit_name in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        digit = value // unit % 10
        if digit == 0:
            pending_zero = bool(out)
            continue
        if pending_zero:
            out += "零"
            pending_zero = False
        out += ("" if unit == 10 and digit == 1 and not out else names[digit]) + unit_name
    return out
