"""Address text: normalization, numerals, the administrative gazetteer and the element parser."""
from mgeo_index.text.normalize import normalize

__all__ = ["normalize"]
