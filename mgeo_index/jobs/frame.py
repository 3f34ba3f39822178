"""``AddressIndex.normalize(frame)``: a normalize job over a pandas DataFrame, in memory.

The same decisions and columns as a file job (:func:`mgeo_index.jobs.policy.decide`, the
``admin_*`` columns from the parsed input), without part files or a job record; each distinct
normalized address is resolved once and its answer given to every row that has it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mgeo_index import store
from mgeo_index.jobs.parts import RESULT_PREFIX
from mgeo_index.jobs.policy import Policy, choose_catalog_columns, rejected, resolve_outcomes, result_columns
from mgeo_index.text import model_text, not_an_address

if TYPE_CHECKING:
    import pandas as pd

PANDAS_HINT = "AddressIndex.normalize needs pandas: pip install 'mgeo-index[pandas]'"


def normalize_frame(resolver, frame: "pd.DataFrame", *, address_column: str, min_probability: float | None = None,
                    margin: float | None = None, top_k: int | None = None, batch_size: int = 256,
                    name_column: str | None = None, explain: bool = False,
                    catalog_columns: str | Sequence[str] | None = None, coordinates: bool = False) -> "pd.DataFrame":
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(PANDAS_HINT) from None
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"normalize takes a pandas DataFrame, not {type(frame).__name__}")
    if address_column not in frame.columns:
        raise KeyError(f"address_column {address_column!r} is not a column of the frame (columns: {list(frame.columns)})")
    if name_column is not None and name_column not in frame.columns:
        raise KeyError(f"name_column {name_column!r} is not a column of the frame (columns: {list(frame.columns)})")
    defaults = Policy()
    policy = Policy(min_probability=defaults.min_probability if min_probability is None else min_probability,
                    margin=defaults.margin if margin is None else margin,
                    top_k=defaults.top_k if top_k is None else top_k, explain=explain, coordinates=coordinates,
                    coordinate_columns=store.catalog_coordinate_columns(resolver.engine, resolver.descriptor["catalog"]),
                    catalog_columns=choose_catalog_columns(
                        catalog_columns, store.catalog_fields(resolver.engine, resolver.descriptor["catalog"])))
    def cells(column: str) -> list[str]:
        return ["" if v is None or (isinstance(v, float) and v != v) else str(v) for v in frame[column]]

    texts = cells(address_column)
    names = cells(name_column) if name_column is not None else [""] * len(texts)
    reasons = [not_an_address(model_text(t)) for t in texts]
    valid = [reason is None for reason in reasons]
    found = iter(resolve_outcomes(resolver, [t for t, ok in zip(texts, valid) if ok], policy, batch_size,
                                  names=[n for n, ok in zip(names, valid) if ok]))
    rows = []
    for text, reason in zip(texts, reasons):
        if reason is None:
            rows.append(next(found))
        else:
            rows.append(rejected("empty address" if not text.strip() else reason))
    columns = result_columns(explain, policy.catalog_columns, coordinates)
    prefix = RESULT_PREFIX if set(columns) & set(map(str, frame.columns)) else ""
    result = pd.DataFrame([[row.get(c, "") for c in columns] for row in rows], index=frame.index, columns=list(columns))
    return pd.concat([frame, result.add_prefix(prefix)], axis=1)
