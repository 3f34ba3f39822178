"""A catalog's coordinate columns: recognized by name, checked as numbers in range.

Coordinates are taken as the catalog gives them, in its own coordinate system (WGS-84, GCJ-02, BD-09: nothing is
converted). ``build`` rejects a row whose coordinate cell is not a number in range; ``normalize --coordinates``
gives a matched row its entry's coordinates.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Catalog columns read as coordinates, by name (case and spaces aside).
LON_NAMES = ("lon", "lng", "long", "longitude", "经度")
LAT_NAMES = ("lat", "latitude", "纬度")


def coordinate(value: Any, low: float, high: float) -> float | None:
    """A coordinate cell as a number in [low, high]; None for an empty cell; ValueError for anything else."""
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    number = float(text)  # ValueError: not a number
    if not low <= number <= high or number != number:
        raise ValueError(f"{text} is out of range ({low:g} to {high:g})")
    return number


def coordinate_names(columns: Sequence[str]) -> tuple[str | None, str | None]:
    """(longitude column, latitude column) among ``columns``, by name (:data:`LON_NAMES`, :data:`LAT_NAMES`)."""
    def find(names: tuple[str, ...]) -> str | None:
        return next((c for c in columns if c.strip().casefold() in names), None)

    return find(LON_NAMES), find(LAT_NAMES)
