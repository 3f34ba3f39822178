"""Where a generation's vectors live: the one door for the dense side of an index (write, search, verify, collect).

Two stores, chosen by ``build --vector-store URL`` and recorded per generation (``generations.vector_store``):

- **FAISS files** (the default, ``faiss``): ``index-<build>.faiss`` in the index directory (:mod:`mgeo_index.index.faiss_index`),
  loaded whole into each reader's memory.
- **Milvus** (``milvus://HOST:PORT[/DATABASE]``: a Milvus server or cluster; ``milvus-lite:///ABS/PATH.db`` or
  ``milvus-lite://REL/PATH.db``, relative to the index directory: Milvus Lite, embedded, one process at a time).
  One collection per generation, ``mgeo_<catalog>_b<build>`` (an INT64 primary key ``id`` = the entry id and a
  FLOAT_VECTOR ``vector``, inner product); the alias ``mgeo_<catalog>_current`` names the current generation's
  collection for other clients and is moved (``alter_alias``, atomic in Milvus) right after the store's pointer.
  The store's pointer stays the truth: readers search the collection their generation names, ``check`` reports
  an alias that disagrees and ``check --repair`` (or the next write, or ``gc``) realigns it. Credentials come from
  ``MGEO_INDEX_MILVUS_TOKEN`` (``user:password`` or an API key), never from the URL: the URL is recorded in the
  store and in ``index.json``. Collections named like ours that no generation of the catalog references (a write
  killed before its switch) are dropped by ``gc``, so one Milvus database must not hold two mgeo stores' catalogs
  of the same name (give each store its own ``/DATABASE``).

Writers go through a *draft* (:class:`FaissDraft`, :class:`MilvusDraft`): the next generation's vectors, started
from the current generation's (``ids``, ``remove``, ``add``), written (``write``) before the store's switch and
pointed at (``point``) after it. Readers get an index from :func:`open_index` and use :func:`search` and
:func:`stored_vectors` on it whatever the store.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mgeo_index import settings
from mgeo_index.index import faiss_index

FAISS = "faiss"
MILVUS = "milvus://"
MILVUS_LITE = "milvus-lite://"
DEFAULT_MILVUS_PORT = 19530
TOKEN_ENV = "MILVUS_TOKEN"  # MGEO_INDEX_MILVUS_TOKEN
INSERT_ROWS = 2000  # rows a Milvus insert call (≈ 6 MB of 768-d vectors; the gRPC limit is 64 MB)
READ_ROWS = 1000  # rows a query-iterator page with vectors
ID_ROWS = 10000  # rows a page of ids only (Milvus caps a query window at 16,384)
SEARCH_ROWS = 1024  # queries a search call
_NO_SCORE = -np.finfo(np.float32).max  # what FAISS puts in an empty inner-product slot

__all__ = [
    "FAISS", "Location", "parse", "recorded", "FaissDraft", "MilvusDraft", "Written", "MilvusIndex", "open_index",
    "search", "stored_vectors", "milvus_index", "collection_name", "alias_name", "collection_ids", "ours",
    "alias_target", "point_alias", "drop_collections", "session", "Unavailable",
]


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True)
class Location:
    """A Milvus vector store: ``url`` as recorded, ``uri`` what pymilvus connects to (a server's
    ``http://HOST:PORT`` or Milvus Lite's local ``….db`` path), ``db_name`` the Milvus database."""

    url: str
    uri: str
    db_name: str = ""

    @property
    def lite(self) -> bool:
        return self.url.startswith(MILVUS_LITE)


def recorded(url: str | None) -> str | None:
    """The URL as the store records it: None for the FAISS default (``None``, ``""`` or ``faiss``)."""
    if url is None or not url.strip() or url.strip().lower() == FAISS:
        return None
    return url.strip()


def parse(url: str | None, index_dir: str | Path) -> Location | None:
    """The Milvus location a ``--vector-store`` URL names; None for FAISS files. Raises ValueError for a URL
    of another form, or one carrying credentials (they go in ``MGEO_INDEX_MILVUS_TOKEN``)."""
    url = recorded(url)
    if url is None:
        return None
    if url.startswith(MILVUS_LITE):
        rest = url[len(MILVUS_LITE):]
        if not rest.endswith(".db") or rest in ("/.db", ".db"):
            raise ValueError(f"--vector-store {url!r}: a Milvus Lite file is named …/NAME.db "
                             f"(milvus-lite:///ABS/PATH.db, or milvus-lite://REL/PATH.db inside the index directory)")
        path = Path(rest) if rest.startswith("/") else Path(index_dir).resolve() / rest
        return Location(url, str(path))
    if url.startswith(MILVUS):
        from urllib.parse import urlsplit

        parts = urlsplit("http://" + url[len(MILVUS):])
        if parts.username or parts.password:
            raise ValueError(f"--vector-store: no credentials in the URL (it is recorded in the store and in "
                             f"index.json); set {settings.ENV_PREFIX}{TOKEN_ENV}=user:password (or an API key)")
        try:
            port = parts.port or DEFAULT_MILVUS_PORT
        except ValueError:
            port = None
        if not parts.hostname or port is None or parts.query or parts.fragment:
            raise ValueError(f"--vector-store {url!r}: a Milvus server is milvus://HOST:PORT or milvus://HOST:PORT/DATABASE")
        database = parts.path.strip("/")
        if "/" in database:
            raise ValueError(f"--vector-store {url!r}: one database name after HOST:PORT, not a path")
        return Location(url, f"http://{parts.hostname}:{port}", database)
    raise ValueError(f"--vector-store {url!r}: give faiss (files in the index directory, the default), "
                     f"milvus://HOST:PORT[/DATABASE] (a Milvus server) or milvus-lite:///PATH.db (Milvus Lite, embedded)")


def location_of(generation: dict | None, index_dir: str | Path) -> Location | None:
    """Where ``generation``'s vectors are (None: its FAISS file in the index directory)."""
    return parse(generation.get("vector_store"), index_dir) if generation else None


# --------------------------------------------------------------------------- connections


class Unavailable(ConnectionError):
    """The vector store cannot be opened (server unreachable, Milvus Lite file held by another process)."""


_CLIENTS: dict[tuple[str, str], list] = {}  # (uri, db_name) → [client, users]: one client a location per process
_CLIENTS_LOCK = threading.Lock()


def _pymilvus():
    try:
        import pymilvus
    except ImportError:
        raise ImportError("the Milvus vector store needs pymilvus (and milvus-lite for milvus-lite://): "
                          "pip install 'mgeo-index[milvus]'") from None
    return pymilvus


def connect(location: Location):
    """A ``MilvusClient`` for ``location``, shared within the process; :func:`release` it when done (the last
    release closes it, and for Milvus Lite stops the embedded server so another process can open the file)."""
    key = (location.uri, location.db_name)
    with _CLIENTS_LOCK:
        entry = _CLIENTS.get(key)
        if entry is None:
            pymilvus = _pymilvus()
            if location.lite:
                try:
                    import milvus_lite  # noqa: F401
                except ImportError:
                    raise ImportError("milvus-lite:// needs the milvus-lite package: pip install 'mgeo-index[milvus]'") from None
                Path(location.uri).parent.mkdir(parents=True, exist_ok=True)
                _refuse_if_held(location)
                # Milvus Lite has no server timestamp for query iterators; pymilvus warns on every one
                logging.getLogger("pymilvus.client.iterator.query_iterator").setLevel(logging.ERROR)
            try:
                client = pymilvus.MilvusClient(uri=location.uri, token=settings.env(TOKEN_ENV) or "",
                                               db_name=location.db_name, timeout=30)
            except Exception as exc:  # noqa: BLE001 - the driver's reason, with what to check
                hint = (" (Milvus Lite serves one process at a time: is the file open in another process, "
                        "e.g. a running `serve`? Use a Milvus server for concurrent readers and writers)"
                        if location.lite else "")
                raise Unavailable(f"cannot open the Milvus vector store {location.url}: {exc}{hint}") from None
            entry = _CLIENTS[key] = [client, 0]
        entry[1] += 1
        return entry[0]


def _refuse_if_held(location: Location) -> None:
    """Milvus Lite holds an exclusive ``flock`` on ``<file>/LOCK`` while a process has the file open: say so in
    one line (pymilvus would log the server's traceback and answer "Open local milvus failed")."""
    from milvus_lite.server_manager import server_manager_instance

    lock = Path(location.uri) / "LOCK"
    if not lock.is_file() or os.path.abspath(location.uri) in getattr(server_manager_instance, "_servers", {}):
        return
    try:
        import fcntl
    except ImportError:  # Windows: let Milvus Lite say it
        return
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Unavailable(f"cannot open the Milvus vector store {location.url}: {location.uri} is open in another "
                              f"process (Milvus Lite serves one process at a time: a running `serve` or writer?); use a "
                              f"Milvus server (milvus://HOST:PORT) for concurrent readers and writers") from None
        fcntl.flock(fh, fcntl.LOCK_UN)


def release(location: Location) -> None:
    key = (location.uri, location.db_name)
    with _CLIENTS_LOCK:
        entry = _CLIENTS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _CLIENTS[key]
    try:
        entry[0].close()
    finally:
        if location.lite:
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(location.uri)


@contextmanager
def session(location: Location) -> Iterator[Any]:
    """``with session(location) as client:`` a shared client, released at the end."""
    client = connect(location)
    try:
        yield client
    finally:
        release(location)


# --------------------------------------------------------------------------- Milvus names and structures


def _prefix(catalog: str) -> str:
    """``mgeo_<catalog>`` in the characters Milvus allows in a name (letters, digits, ``_``); a catalog name
    that had to be changed (or shortened) gets a hash of itself, so two catalogs never share a prefix."""
    slug = re.sub(r"[^0-9A-Za-z_]", "_", catalog)
    if slug != catalog or not slug or len(slug) > 150:
        slug = f"{slug[:150]}_{hashlib.sha1(catalog.encode('utf-8')).hexdigest()[:8]}"
    return f"mgeo_{slug}"


def collection_name(catalog: str, build_id: int) -> str:
    """The collection of the generation written by build ``build_id``."""
    return f"{_prefix(catalog)}_b{int(build_id)}"


def alias_name(catalog: str) -> str:
    """The alias naming the catalog's current collection (for clients other than mgeo-index)."""
    return f"{_prefix(catalog)}_current"


def ours(client, catalog: str) -> list[str]:
    """Collections named like the catalog's generations, referenced or not."""
    pattern = re.compile(re.escape(_prefix(catalog)) + r"_b\d+")
    return sorted(name for name in client.list_collections() if pattern.fullmatch(name))


_IVF = re.compile(r"IVF(\d+),(Flat|SQ8|PQ(\d+)(?:x8)?)", re.IGNORECASE)
_HNSW = re.compile(r"HNSW(\d+)(?:,Flat)?", re.IGNORECASE)
MILVUS_FACTORIES = "Flat, IVF<n>,Flat, IVF<n>,SQ8, IVF<n>,PQ<m> (8-bit codes), HNSW<M>"


def milvus_index(factory: str, n_rows: int, dim: int) -> tuple[str, dict[str, int]]:
    """The Milvus index (type, build params) for a FAISS factory string: ``Flat`` → FLAT, ``IVF<n>,Flat`` →
    IVF_FLAT, ``IVF<n>,SQ8`` → IVF_SQ8, ``IVF<n>,PQ<m>`` → IVF_PQ (nbits 8), ``HNSW<M>`` → HNSW (efConstruction
    40, FAISS's default); ``auto`` chooses by ``n_rows`` as for FAISS (:func:`index.auto_factory`). Other
    factories have no Milvus counterpart: ValueError."""
    structure = faiss_index.auto_factory(n_rows, dim) if factory == faiss_index.AUTO else factory.strip()
    if structure.lower() == "flat":
        return "FLAT", {}
    ivf = _IVF.fullmatch(structure)
    if ivf:
        nlist = int(ivf.group(1))
        if ivf.group(2).lower() == "flat":
            return "IVF_FLAT", {"nlist": nlist}
        if ivf.group(2).upper() == "SQ8":
            return "IVF_SQ8", {"nlist": nlist}
        return "IVF_PQ", {"nlist": nlist, "m": int(ivf.group(3)), "nbits": 8}
    hnsw = _HNSW.fullmatch(structure)
    if hnsw:
        return "HNSW", {"M": int(hnsw.group(1)), "efConstruction": 40}
    raise ValueError(f"--index {factory!r} has no Milvus counterpart; with a Milvus vector store use one of "
                     f"{MILVUS_FACTORIES}, or auto")


def _search_params(index_type: str, k: int) -> dict[str, Any]:
    """Search-time knobs, as :func:`index.make_index` sets them for FAISS: nprobe 16, efSearch 128."""
    if index_type.startswith("IVF"):
        return {"metric_type": "IP", "params": {"nprobe": faiss_index.DEFAULT_NPROBE}}
    if index_type == "HNSW":
        return {"metric_type": "IP", "params": {"ef": max(faiss_index.DEFAULT_EF_SEARCH, k)}}
    return {"metric_type": "IP", "params": {}}


def _describe(index_type: str, params: dict) -> str:
    return " ".join([index_type] + [f"{k}={v}" for k, v in params.items()])


def validate(url: str | None, index_dir: str | Path, factory: str, dim: int) -> None:
    """Refuse, before anything is stored, a vector-store URL that cannot work: a malformed one, a missing
    client library, an index factory without a Milvus counterpart."""
    location = parse(url, index_dir)
    if location is None:
        return
    _pymilvus()
    if location.lite:
        try:
            import milvus_lite  # noqa: F401
        except ImportError:
            raise ImportError("milvus-lite:// needs the milvus-lite package: pip install 'mgeo-index[milvus]'") from None
    if factory != faiss_index.AUTO:
        milvus_index(factory, 0, dim)


# --------------------------------------------------------------------------- reading collections


def collection_ids(client, name: str) -> np.ndarray:
    """Every id in collection ``name`` (int64, unordered)."""
    return np.fromiter((row["id"] for batch in _pages(client, name, ["id"], ID_ROWS) for row in batch), dtype=np.int64)


def loaded(client, name: str) -> str:
    """``name``, loaded for search and query (Milvus Lite forgets loads when its file is closed; a loaded
    collection on a server makes this a no-op)."""
    state = client.get_load_state(name).get("state")
    if getattr(state, "name", str(state)) != "Loaded":
        client.load_collection(name)
    return name


def _pages(client, name: str, fields: list[str], size: int) -> Iterator[list[dict]]:
    loaded(client, name)
    iterator = client.query_iterator(name, batch_size=size, output_fields=fields)
    try:
        while True:
            batch = iterator.next()
            if not batch:
                return
            yield batch
    finally:
        iterator.close()


def collection_dim(client, name: str) -> int | None:
    for field in client.describe_collection(name)["fields"]:
        if field["name"] == "vector":
            return int(field["params"]["dim"])
    return None


def alias_target(client, catalog: str) -> str | None:
    """The collection the catalog's alias names, or None when there is no alias."""
    alias = alias_name(catalog)
    if alias not in client.list_aliases().get("aliases", []):
        return None
    return client.describe_alias(alias).get("collection_name")


def point_alias(client, catalog: str, collection: str) -> None:
    """Make the catalog's alias name ``collection`` (``alter_alias``: one atomic step for its readers)."""
    alias = alias_name(catalog)
    if alias in client.list_aliases().get("aliases", []):
        client.alter_alias(collection, alias)
    else:
        client.create_alias(collection, alias)


def drop_collections(client, names: Sequence[str]) -> list[str]:
    dropped = []
    for name in names:
        if client.has_collection(name):
            client.drop_collection(name)
            dropped.append(name)
    return dropped


# --------------------------------------------------------------------------- writing: drafts


@dataclass
class Written:
    """A draft on disk (or in Milvus): ``name`` is what the generation records as ``index_file`` (the FAISS
    file, or the collection), ``path`` the FAISS file whose SHA-256 is recorded (None for a collection)."""

    name: str
    ntotal: int
    ids: np.ndarray
    path: Path | None
    structure: str
    where: str  # for people: the file, or the store and collection


class FaissDraft:
    """The next generation as a FAISS index in memory, started from the current one (``base``) or empty,
    written as ``index-<build>.faiss``."""

    location = None

    def __init__(self, index_dir: Path, build_id: int, base, *, dim: int, factory: str, n_live: int, device: str):
        self.index_dir, self.build_id, self.factory = index_dir, build_id, factory
        self.reused = base is not None
        if base is None:
            structure = faiss_index.auto_factory(n_live, dim) if factory == faiss_index.AUTO else factory
            base = faiss_index.make_index(dim, structure)
        if device.startswith("cuda"):
            base = faiss_index.to_gpu(base)  # no-op without a FAISS GPU build; saved back on the CPU
        self.index = base

    def ids(self) -> np.ndarray:
        return faiss_index.index_ids(self.index)

    def remove(self, ids: np.ndarray) -> None:
        if ids.size:
            self.index = faiss_index.remove(self.index, ids)

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
        """Add the newly embedded vectors; returns the probe tuning of a new auto IVF index ({} otherwise)."""
        faiss_index.add(self.index, vectors, ids)
        if self.factory == faiss_index.AUTO and len(ids) == int(self.index.ntotal):  # a new IVF index: probe enough lists
            return faiss_index.tune_nprobe(self.index, vectors)
        return {}

    def write(self) -> Written:
        name = f"index-{self.build_id}.faiss"
        faiss_index.save_atomic(self.index, self.index_dir / name)
        return Written(name, int(self.index.ntotal), faiss_index.index_ids(self.index), self.index_dir / name,
                       faiss_index.describe(self.index).get("factory") or "", str(self.index_dir / name))

    def point(self, catalog: str) -> None:
        """Nothing to point: readers follow the store's pointer to the file."""

    def close(self) -> None:
        pass


class MilvusDraft:
    """The next generation as a new collection ``mgeo_<catalog>_b<build>``: the base collection's rows minus
    the removed ones (copied through this client with a query iterator), plus the newly embedded ones;
    flushed, indexed and loaded by :meth:`write`. A collection left by a killed attempt of the same build is
    dropped first; those of other killed builds are dropped by ``gc``."""

    def __init__(self, location: Location, catalog: str, build_id: int, base: str | None, *, dim: int, factory: str,
                 n_live: int):
        self.location, self.catalog = location, catalog
        self.index_type, self.params = milvus_index(factory, n_live, dim)
        self.client = connect(location)
        try:
            self.name = collection_name(catalog, build_id)
            drop_collections(self.client, [self.name])
            pymilvus = _pymilvus()
            schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("id", pymilvus.DataType.INT64, is_primary=True)
            schema.add_field("vector", pymilvus.DataType.FLOAT_VECTOR, dim=int(dim))
            # Strong: a search or check right after the switch sees every row written (Bounded, the default, may not)
            self.client.create_collection(self.name, schema=schema, consistency_level="Strong")
            self.base = base if base and self.client.has_collection(base) else None
        except BaseException:
            release(location)
            raise
        self._base_ids: np.ndarray | None = None
        self._removed = np.empty(0, np.int64)
        self._added: list[np.ndarray] = []

    @property
    def reused(self) -> bool:
        return self.base is not None

    def forget_base(self) -> None:
        """Start from nothing (the base collection does not hold what its generation recorded)."""
        self.base, self._base_ids = None, None

    def ids(self) -> np.ndarray:
        if self.base is None:
            return np.empty(0, np.int64)
        if self._base_ids is None:
            self._base_ids = collection_ids(self.client, self.base)
        return self._base_ids

    def remove(self, ids: np.ndarray) -> None:
        self._removed = np.union1d(self._removed, ids)

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
        self._insert(vectors, ids)
        self._added.append(np.asarray(ids, np.int64))
        return {}

    def _insert(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        for start in range(0, len(ids), INSERT_ROWS):
            rows = [{"id": int(i), "vector": v.tolist()}
                    for i, v in zip(ids[start : start + INSERT_ROWS], vectors[start : start + INSERT_ROWS])]
            self.client.insert(self.name, rows)

    def write(self) -> Written:
        kept = [np.empty(0, np.int64)]
        if self.base is not None:  # the base's rows, but the removed ones
            for batch in _pages(self.client, self.base, ["id", "vector"], READ_ROWS):
                ids = np.fromiter((row["id"] for row in batch), dtype=np.int64, count=len(batch))
                keep = ~np.isin(ids, self._removed)
                if keep.any():
                    vectors = np.asarray([row["vector"] for row, k in zip(batch, keep) if k], dtype=np.float32)
                    self._insert(vectors, ids[keep])
                    kept.append(ids[keep])
        self.client.flush(self.name)
        index_params = self.client.prepare_index_params()
        index_params.add_index("vector", index_type=self.index_type, metric_type="IP", params=self.params)
        self.client.create_index(self.name, index_params)
        self.client.load_collection(self.name)
        ids = np.concatenate(kept + self._added)
        return Written(self.name, int(ids.size), ids, None, _describe(self.index_type, self.params),
                       f"{self.location.url} collection {self.name}")

    def point(self, catalog: str) -> None:
        point_alias(self.client, catalog, self.name)

    def close(self) -> None:
        release(self.location)


# --------------------------------------------------------------------------- reading: search


class MilvusIndex:
    """A generation's collection, read like a FAISS index: ``d``, ``ntotal``, ``search(queries, k)`` →
    (scores, ids) padded as FAISS pads, ``vectors(ids)``. :meth:`close` releases the connection."""

    def __init__(self, location: Location, collection: str, *, dim: int, ntotal: int, factory: str):
        self.location, self.collection, self.d, self.ntotal = location, collection, int(dim), int(ntotal)
        self.index_type, _ = milvus_index(factory, ntotal, dim)
        self.client = connect(location)
        try:
            loaded(self.client, collection)
        except BaseException:
            release(location)
            raise
        self._closed = False

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores = np.full((len(queries), k), _NO_SCORE, dtype=np.float32)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        params = _search_params(self.index_type, k)
        for start in range(0, len(queries), SEARCH_ROWS):
            hits = self.client.search(self.collection, data=queries[start : start + SEARCH_ROWS].tolist(), limit=k,
                                      search_params=params, output_fields=["id"])
            for row, found in enumerate(hits, start):
                for col, hit in enumerate(list(found)[:k]):
                    ids[row, col], scores[row, col] = int(hit["id"]), float(hit["distance"])
        return scores, ids

    def vectors(self, ids: Sequence[int]) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        wanted = sorted({int(i) for i in ids})
        for start in range(0, len(wanted), READ_ROWS):
            for row in self.client.query(self.collection, ids=wanted[start : start + READ_ROWS], output_fields=["id", "vector"]):
                out[int(row["id"])] = np.asarray(row["vector"], dtype=np.float32)
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            release(self.location)


def open_index(descriptor: dict, index_dir: str | Path, *, gpu: bool = False):
    """The index a reader searches for the generation ``descriptor`` names: its FAISS file (on the GPU with
    ``gpu``; search parameters set) or its Milvus collection."""
    location = parse(descriptor.get("vector_store"), index_dir)
    if location is None:
        # search only: an IVF index's lists stay in the (shared) page cache, not in this process's memory
        index = faiss_index.load(Path(index_dir) / descriptor["index_file"], gpu=gpu, mmap=True)
        faiss_index.set_search_params(index, nprobe=faiss_index.DEFAULT_NPROBE, ef_search=faiss_index.DEFAULT_EF_SEARCH)
        return index
    return MilvusIndex(location, descriptor["index_file"], dim=descriptor["dim"], ntotal=descriptor["ntotal"],
                       factory=descriptor["index_factory"])


def search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (scores, ids) of each query row, as :func:`index.search` returns them, whatever the store (a
    :class:`MilvusIndex` has the ``d``, ``ntotal`` and ``search`` that function uses)."""
    return faiss_index.search(index, queries, k)


def stored_vectors(index, ids: Sequence[int]) -> dict[int, np.ndarray | None]:
    """The stored vector of each id (None where the index cannot give it back: an IVF index without a direct
    map, a GPU index, an id not in it)."""
    if isinstance(index, MilvusIndex):
        found = index.vectors(ids)
        return {int(i): found.get(int(i)) for i in ids}
    out: dict[int, np.ndarray | None] = {}
    for i in ids:
        try:
            out[int(i)] = index.reconstruct(int(i))
        except RuntimeError:
            out[int(i)] = None
    return out


def close(index) -> None:
    """Release what a reader's index holds (a Milvus connection; nothing for a FAISS index in memory)."""
    if isinstance(index, MilvusIndex):
        index.close()
