"""Address text: normalization, numerals, the administrative gazetteer and the element parser."""
from mgeo_index.text.normalize import normalize, printable

__all__ = ["normalize", "printable"]
