"""Which files in an index directory are a build's own: a build never replaces or deletes a file it did not write
(``--force`` included), and never writes a catalog whose current generation another index directory serves.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from mgeo_index.catalog.index_json import DESCRIPTOR

class NotAnIndexDirectory(ValueError):
    """A build asked to write into a directory that holds someone else's files."""


# What mgeo-index writes into an index directory besides index.json: the SQLite store (and its WAL files), the
# writer lock, the build's rejected rows, each generation's files and the temporary files of atomic writes.
_OWN_FIXED = {".writer.lock", "rejects.tsv"}
_OWN_FILE = re.compile(r"(?:index|sparse)-(\d+)\.(?:faiss|npz)")
_OWN_TEMP = re.compile(r"\.(?:(?:index|sparse)-(\d+)\.(?:faiss|npz)|index\.json)\.[^/]+\.tmp")


def check_writable_here(index_dir: Path, force: bool = False) -> None:
    """Refuse to build into a directory mgeo-index did not make: one that holds files and no ``index.json`` of
    ours (a JSON object naming a catalog), unless ``force``; and, even with ``force``, one whose files bear the names
    a build writes (``index.json``, ``rejects.tsv``, ``index-1.faiss`` …): a file this catalog's builds did not write
    is never replaced or deleted, whatever its name. A directory holding only what an interrupted first build left
    (the store, the lock) is ours."""
    if not index_dir.is_dir():
        return
    names = sorted(p.name for p in index_dir.iterdir())
    descriptor = index_dir / DESCRIPTOR
    if descriptor.is_file():
        try:
            ours = isinstance(mine := json.loads(descriptor.read_text(encoding="utf-8")), dict) and "catalog" in mine
        except (ValueError, UnicodeDecodeError):
            ours = False
        if ours:
            return
    from mgeo_index.settings import DB_FILENAME

    def shown(found: list[str]) -> str:
        return ", ".join(found[:5]) + (" …" if len(found) > 5 else "")

    clashing = [n for n in names if n in _OWN_FIXED - {".writer.lock"} or n == DESCRIPTOR or _OWN_FILE.fullmatch(n)
                or _OWN_TEMP.fullmatch(n)]
    if clashing:
        raise NotAnIndexDirectory(
            f"--index-dir {index_dir} holds files mgeo-index did not write under the names a build writes "
            f"({shown(clashing)}); a build never writes over them (--force neither): move those, or build into a new "
            "or empty directory")
    foreign = [n for n in names if n != ".writer.lock" and not n.startswith(DB_FILENAME)]
    if foreign and not force:
        raise NotAnIndexDirectory(
            f"--index-dir {index_dir} holds files mgeo-index did not write ({shown(foreign)}); build into a new or "
            "empty directory, or pass --force to write the index there anyway (index.json, mgeo.db, rejects.tsv and "
            "the index files are then written beside them; nothing else is touched)")


def own_files(index_dir: Path, build_ids: set[int]) -> list[Path]:
    """The files in ``index_dir`` that builds ``build_ids`` wrote (their generations' files and unfinished
    temporary files) or that an atomic ``index.json`` write left: what clean-up may delete, and nothing else."""
    out = []
    for path in sorted(index_dir.iterdir()):
        m = _OWN_FILE.fullmatch(path.name) or _OWN_TEMP.fullmatch(path.name)
        if m and path.is_file() and (m.group(1) is None or int(m.group(1)) in build_ids):
            out.append(path)
    return out


class ServedElsewhere(ValueError):
    """The catalog's current generation lives in another index directory (a shared database)."""


def ensure_served_here(index_dir: Path, catalog: str, generation: dict | None) -> None:
    """Refuse to write catalog ``catalog`` from ``index_dir`` when its current ``generation`` (the database's
    pointer) has no files in it: the catalog is served from another index directory sharing this database,
    and a write from here would move its readers' pointer to files they cannot see. (A generation whose
    vectors are in a vector store keeps its n-gram file in the directory that wrote it.)"""
    if generation is None:
        return
    local = generation["sparse_file"] if generation.get("vector_store") else generation["index_file"]
    if local and (Path(index_dir) / local).exists():
        return
    raise ServedElsewhere(
        f"catalog {catalog!r} in this database is served from another index directory: its current generation "
        f"({local}) is not in {index_dir}. Write it from that directory, or give this one a "
        f"catalog of its own (--catalog NAME); if this is that directory and its files were lost, run "
        f"`mgeo-index check --repair --index-dir {index_dir}`"
    )
