"""Address text: normalization, numerals, the administrative gazetteer and the element parser."""
from mgeo_index.text.normalize import (
    has_content, model_text, normalize, not_an_address, printable, query_key, visible, with_name,
)

__all__ = ["has_content", "model_text", "normalize", "not_an_address", "printable", "query_key", "visible", "with_name"]
