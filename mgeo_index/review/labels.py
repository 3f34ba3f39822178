"""Labels in and out of the store as files: ``a``, ``b``, ``label`` (TSV), the form ``mgeo-index eval pairs``
reads, so a team's decisions can be measured against any model, shared, and imported elsewhere."""
from __future__ import annotations

import getpass
import io
from pathlib import Path

from mgeo_index import store
from mgeo_index.files import write_text_atomic

COLUMNS = ("a", "b", "label", "reviewer", "decision", "created_at")


def reviewer_name() -> str:
    """Who decides when no API key names them: the OS user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "unknown"


def export_labels(engine, path: str | Path, *, include_undone: bool = False, raw: bool = False) -> int:
    """Write the store's labels (active ones unless ``include_undone``) to ``path`` atomically; the row count.

    A plain TSV (:class:`mgeo_index.tables.TableWriter`), as ``eval pairs`` and ``labels import`` read it: quotes
    as they are, whitespace runs as one space, formulas neutralised unless ``raw``."""
    from mgeo_index.tables import TableWriter

    rows = store.list_labels(engine, include_undone=include_undone)
    out = io.StringIO()
    writer = TableWriter(out, "\t", plain=True, raw=raw)
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([row["query"], row["entry_address"], row["label"], row["reviewer"], row["decision"],
                         row["created_at"].isoformat(timespec="seconds")])
    write_text_atomic(path, out.getvalue())
    return len(rows)


def import_labels(engine, path: str | Path, *, catalog: str, reviewer: str | None = None) -> dict[str, int]:
    """Add the pairs of a labelled file (``a, b, label``, ``query, candidate, label`` or ``addr1, addr2, label``
    with 0/1; any encoding ``eval pairs`` reads) as labels. A ``b`` that is a live entry of ``catalog``
    (same normalized text) is linked to it, so an ``exact_match`` there is served as a confirmed answer.
    Returns counts: ``labels`` added, ``linked`` to an entry."""
    from mgeo_index.measure.evaluate import read_labeled_pairs
    from mgeo_index.settings import LABELS
    from mgeo_index.text import model_text, normalize

    a, b, gold = read_labeled_pairs(path)
    if not gold:
        raise ValueError(f"{path}: no labelled pairs in it")
    catalog_id = store.catalog_id(engine, catalog)
    ids = store.ids_by_normalized(engine, catalog_id, [normalize(x) for x in b]) if catalog_id is not None else [None] * len(b)
    rows = [{"query": x, "query_normalized": model_text(x), "entry_address": y, "entry_id": i, "label": LABELS[g]}
            for x, y, g, i in zip(a, b, gold, ids)]
    added = store.add_labels(engine, rows, reviewer=reviewer or reviewer_name())
    return {"labels": added, "linked": sum(i is not None for i in ids)}
