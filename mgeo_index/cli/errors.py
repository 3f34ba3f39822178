"""Known failures become one red line naming what to fix, and exit code 1.

Library and user text is escaped before rich prints it: rich markup would otherwise swallow any
``[...]`` in it, e.g. the extra in ``pip install 'mgeo-index[ray]'``.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer

from mgeo_index import settings
from mgeo_index.cli.render import err, escape

# Failures that are the user's to fix, as (module, class). They are recognized only when their module is
# loaded (nothing can raise one before), so catching them imports nothing: `parse` never loads the
# resolver's FAISS and transformers stack to learn what a ModelMismatch is.
_USER_ERRORS = (
    ("mgeo_index.catalog.reader", "CatalogError"),
    ("mgeo_index.model.manifest", "ModelError"),
    ("mgeo_index.model.loading", "ModelMismatch"),
    ("mgeo_index.catalog.locking", "Locked"),
    ("mgeo_index.store", "GenerationConflict"),
    ("mgeo_index.jobs", "JobError"),
    ("mgeo_index.index.vector_store", "Unavailable"),
    ("mgeo_index.compute.ray", "RayUnavailable"),
)


def print_error(message: object, label: str = "Error") -> None:
    """One red ``label:`` then ``message`` as written (no markup, no highlighting), on stderr, as one line
    (the terminal wraps it; rich would break it at 80 columns when stderr is not a terminal)."""
    err.print(f"[bold red]{label}:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


def fail(message: object, label: str = "Error") -> NoReturn:
    print_error(message, label)
    raise typer.Exit(1)


def _loaded(module: str, name: str) -> type | None:
    """Class ``module.name`` when that module is imported, else None."""
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) else None


def _is(exc: BaseException, *names: tuple[str, str]) -> bool:
    return any(cls is not None and isinstance(exc, cls) for cls in (_loaded(*name) for name in names))


# Optional modules a URL or an option needs, and the extra that installs them.
_EXTRAS = {"psycopg2": "postgres", "redis": "serve", "pyarrow": "parquet", "ray": "ray", "pymilvus": "milvus",
           "onnxruntime": "onnx", "pandas": "pandas", "matplotlib": "eval", "openpyxl": "xlsx",
           "transformers": "train", "triton": "gpu"}


def explain(exc: Exception) -> tuple[str, str] | None:
    """(label, message) of the one line a known failure is shown as; None for anything else (a bug: traceback)."""
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in _EXTRAS:
        extra = _EXTRAS[exc.name.split(".")[0]]
        return "Error", f"{exc.name.split('.')[0]} is not installed: pip install 'mgeo-index[{extra}]'"
    if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError, ImportError)) \
            or _is(exc, *_USER_ERRORS):
        return "Error", str(exc)
    if isinstance(exc, PermissionError):  # a file or directory this user or mount cannot write
        return "Error", f"cannot write {exc.filename or 'a file'}: {exc.strerror or exc}; use a writable place"
    if _is(exc, ("alembic.util.exc", "CommandError")):  # a revision this version does not know (a newer release migrated the store)
        return "Database error", (f"{exc}. The store may have been migrated by a newer mgeo-index; "
                                  "use that version, or `mgeo-index db current` to see its revision.")
    if _is(exc, ("sqlalchemy.exc", "DBAPIError")):  # cannot connect, no such database or role, …: the driver's own words
        words = str(exc.orig if exc.orig is not None else exc).strip().splitlines()
        reason = words[0] if words else type(exc.orig or exc).__name__
        return "Database error", (f"{reason}. Check --db / {settings.ENV_PREFIX}DB (URL, server, "
                                  "database, user) and that the server is running.")
    if _is(exc, ("pymilvus.exceptions", "MilvusException")):  # the Milvus server's (or Milvus Lite's) own words
        return "Vector store error", f"{exc}. Check the catalog's vector store (build --vector-store) and that it is running."
    if _is(exc, ("sqlalchemy.exc", "ArgumentError")):  # a URL SQLAlchemy cannot parse, an unknown dialect or driver
        return "Error", (f"invalid --db URL: {exc}. Expected e.g. postgresql://user@host:5432/db or "
                         "sqlite:////path/to/file.db")
    return None


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Known failures become one red line naming what to fix, and exit code 1; anything else propagates."""
    try:
        yield
    except Exception as exc:
        known = explain(exc)
        if known is None:
            raise
        print_error(known[1], known[0])
        raise typer.Exit(1) from None
