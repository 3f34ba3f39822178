"""``index.json``: the file in an index directory that names the catalog (and its database and vector store) and
mirrors the current generation for people and for readers of an index written before generations existed. The
store's pointer is authoritative (:mod:`mgeo_index.catalog.generations`); this module reads and writes the mirror.
"""
from __future__ import annotations

import json
from pathlib import Path

from mgeo_index import files, store
from mgeo_index.index import vector_store

DESCRIPTOR = "index.json"


def read_descriptor(index_dir: str | Path) -> dict:
    """``index.json``: which catalog (and database) this directory serves, plus the mirrored generation."""
    path = Path(index_dir) / DESCRIPTOR
    if not path.exists():
        raise FileNotFoundError(
            f"{index_dir} holds no index (no {DESCRIPTOR}); create one with `mgeo-index build CATALOG --index-dir {index_dir}`."
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise FileNotFoundError(f"{path} is not valid JSON ({exc}); `mgeo-index check --repair --index-dir {index_dir}` rewrites it.") from None


def ensure_descriptor(index_dir: Path, catalog: str, db_url: str, vector_store_url: str | None = None) -> None:
    """Write ``index.json`` naming the catalog (and a vector store other than FAISS files) before the first
    generation exists."""
    path = index_dir / DESCRIPTOR
    if not path.exists():
        vectors = vector_store.recorded(vector_store_url)
        files.write_json_atomic(path, {"catalog": catalog, "database": redact(db_url),
                                       **({"vector_store": vectors} if vectors else {})})


def redact(url: str) -> str:
    """Database URL without its password."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def descriptor_of(generation: dict, catalog: str, db_url: str) -> dict:
    """What readers need of a generation (and what ``index.json`` mirrors)."""
    return {
        "catalog": catalog,
        "generation_id": generation["id"],
        "build_id": generation["build_id"],
        "index_file": generation["index_file"],
        "sparse_file": generation["sparse_file"],
        "index_factory": generation["index_factory"],
        "dim": generation["dim"],
        "ntotal": generation["ntotal"],
        "model_fingerprint": generation["model_fingerprint"],
        "model_path": generation["model_path"],
        "database": redact(db_url),
        **({"vector_store": generation["vector_store"]} if generation.get("vector_store") else {}),
        **({"plan": generation["plan"]} if generation.get("plan") else {}),
    }


def current_descriptor(index_dir: str | Path, engine, db_url: str) -> dict:
    """The generation readers must use now, from the database pointer.

    An index directory written before generations existed (no pointer yet) is read from ``index.json``.
    """
    descriptor = read_descriptor(index_dir)
    catalog_id = store.catalog_id(engine, descriptor["catalog"])
    generation = store.current_generation(engine, catalog_id) if catalog_id is not None else None
    if generation is not None:
        return descriptor_of(generation, descriptor["catalog"], db_url)
    if descriptor.get("index_file"):
        return descriptor
    raise FileNotFoundError(
        f"{index_dir} has no complete index generation yet (an earlier build was interrupted); "
        f"re-run the build to finish it."
    )
