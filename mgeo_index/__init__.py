"""mgeo-index: Chinese address entity resolution.

    from mgeo_index import AddressIndex, parse

    with AddressIndex.open("idx") as idx:
        matches = idx.resolve("北京朝阳建国路88号", top_k=5)

Importing the package is cheap: the encoder stack loads when an index is opened.
"""
__version__ = "0.1.0"

__all__ = ["AddressIndex", "Element", "Match", "MatchResult", "Parse", "__version__", "match_pairs", "parse"]

_LAZY = {"AddressIndex": "mgeo_index.api", "parse": "mgeo_index.api", "match_pairs": "mgeo_index.api",
         **dict.fromkeys(("Match", "MatchResult", "Parse", "Element"), "mgeo_index.query.results")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mgeo_index' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
