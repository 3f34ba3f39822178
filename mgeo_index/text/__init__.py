"""Address text: normalization, numerals, the administrative gazetteer and the element parser."""
from mgeo_index.text.normalize import has_content, model_text, normalize, printable, query_key, with_name

__all__ = ["has_content", "model_text", "normalize", "printable", "query_key", "with_name"]
