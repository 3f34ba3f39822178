"""Reviewers' labels as files: labels export, labels import (the ``labels`` group)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mgeo_index import settings
from mgeo_index.cli.errors import friendly_errors
from mgeo_index.cli.options import DEFAULT_INDEX_DIR, Db, IndexDir, RawValues
from mgeo_index.cli.render import console


def labels_export(
    out: Annotated[Path, typer.Option("--out", "-o", help="TSV to write: a, b, label, reviewer, decision, created_at.")],
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    db: Db = None,
    include_undone: Annotated[bool, typer.Option(help="Also write labels that were undone.")] = False,
    raw_values: RawValues = False,
) -> None:
    """Write the labels reviewers gave (mgeo-index review) as pairs that eval pairs reads.

    Example: mgeo-index labels export --index-dir idx --out labels.tsv && mgeo-index eval pairs labels.tsv
    """
    from mgeo_index import store
    from mgeo_index.review.labels import export_labels

    with friendly_errors():
        engine = store.connect(settings.database_url(index_dir, db))
        n = export_labels(engine, out, include_undone=include_undone, raw=raw_values)
    console.print(f"wrote {n} labels to {out}")


def labels_import(
    file: Annotated[Path, typer.Argument(help="Labelled pairs: a,b,label (or query,candidate,label / addr1,addr2,0|1).")],
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    db: Db = None,
    catalog_name: Annotated[str, typer.Option("--catalog", help="Catalog whose entries the b side is linked to.")] = settings.DEFAULT_CATALOG,
    reviewer: Annotated[str | None, typer.Option(help="Whose labels these are [default: the OS user].")] = None,
) -> None:
    """Add labelled pairs to the store: an exact_match whose b is a catalog entry becomes a confirmed answer.

    Example: mgeo-index labels import team-labels.tsv --index-dir idx --reviewer ops-team
    """
    from mgeo_index import store
    from mgeo_index.review.labels import import_labels

    with friendly_errors():
        engine = store.connect(settings.database_url(index_dir, db))
        counts = import_labels(engine, file, catalog=catalog_name, reviewer=reviewer)
    console.print(f"imported {counts['labels']} labels from {file} ({counts['linked']} linked to catalog entries)")
