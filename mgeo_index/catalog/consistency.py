"""``check``: does the current generation agree with the store, file by file and id by id; and what a repair
or a comparison of two builds reads (:func:`realign`, :func:`catalog_state`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mgeo_index import settings, store
from mgeo_index.catalog.index_json import DESCRIPTOR, read_descriptor, redact
from mgeo_index.catalog.generations import catalog_name, generation_ids, ids_sha256, sha256_file
from mgeo_index.catalog.ownership import own_files
from mgeo_index.index import faiss_index, vector_store
from mgeo_index.runtime.plan import plan


@dataclass
class Report:
    catalog: str | None = None
    generation_id: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # harmless: files gc removes, entries it purges
    rebuild: bool = False  # the current generation's files cannot be reused: a repair embeds everything again
    realign: bool = False  # the Milvus alias names another collection than the current generation's

    @property
    def clean(self) -> bool:
        return not self.problems


def _sample(ids, n: int = 5) -> str:
    ids = [int(i) for i in list(ids)[:n]]
    return ", ".join(map(str, ids)) + (", …" if len(ids) == n else "")


def check(index_dir: str | Path, engine, db_url: str) -> Report:
    """Verify that the current generation is intact and agrees with the store; list exactly what is wrong."""
    index_dir = Path(index_dir)
    report = Report()
    try:
        descriptor = read_descriptor(index_dir)
    except FileNotFoundError as exc:
        report.problems.append(str(exc))
        return report
    report.catalog = descriptor.get("catalog")
    catalog_id = store.catalog_id(engine, report.catalog or "")
    if catalog_id is None:
        report.problems.append(f"catalog {report.catalog!r} named by {DESCRIPTOR} is not in the store {redact(db_url)}")
        return report
    generation = store.current_generation(engine, catalog_id)
    live = store.entry_ids(engine, catalog_id)
    report.facts["live entries in store"] = int(live.size)
    if generation is None:
        report.problems.append("the catalog has no current index generation (never built, or every build was interrupted)")
        return report
    report.generation_id = generation["id"]
    location = vector_store.location_of(generation, index_dir)
    report.facts.update({"generation": generation["id"]} | (
        {"index file": generation["index_file"]} if location is None else
        {"vector store": location.url, "collection": generation["index_file"]}
    ) | {"model": generation["model_fingerprint"], "factory": generation["index_factory"],
         "plan (vectors)": generation.get("plan") or "not recorded (built before plans were)",
         "plan (queries here)": str(plan(None, None))}
      | settings.answer_settings(store.catalog_numbers(engine, report.catalog), store.catalog_profile(engine, report.catalog)))
    mirrored = {k: descriptor.get(k) for k in ("generation_id", "index_file", "sparse_file")}
    if mirrored != {"generation_id": generation["id"], "index_file": generation["index_file"], "sparse_file": generation["sparse_file"]}:
        report.problems.append(f"{DESCRIPTOR} does not mirror the current generation {generation['id']} (it says {mirrored})")

    held = _read_vectors(index_dir, generation, location, report, engine, catalog_id)
    report.rebuild = held is None
    if held is not None:
        what = "FAISS index" if location is None else f"collection {generation['index_file']}"
        what_ids = "FAISS ids" if location is None else f"{what} ids"
        _check_ids(report, held, what, what_ids, generation_ids(index_dir, generation), live, generation, engine)
    _check_model(report, generation)
    _note_strays(report, index_dir, engine, catalog_id)
    clash = faiss_index.faiss_clash(faiss_index.faiss_builds())
    if clash:
        report.notes.append(clash)
    return report


def _read_vectors(index_dir: Path, generation: dict, location, report: Report, engine,
                  catalog_id: int) -> tuple[np.ndarray, int] | None:
    """(ids, dim) of the current generation's vectors, once its files are there and match their checksums (and,
    in a vector store, its collection is readable); None when they cannot be read (the problems say why)."""
    files_ok = True
    for name in (generation["index_file"], generation["sparse_file"]) if location is None else (generation["sparse_file"],):
        path = index_dir / name
        if not path.is_file():
            report.problems.append(f"file {name} of generation {generation['id']} is missing")
            files_ok = False
        elif sha256_file(path) != generation["checksums"].get(name):
            report.problems.append(f"file {name} does not match its recorded SHA-256 (corrupted or replaced)")
            files_ok = False
    if location is not None:
        held = _check_collection(location, generation, report, engine, catalog_id)
        return held if files_ok else None
    if not files_ok:
        return None
    index = faiss_index.load(index_dir / generation["index_file"])
    return faiss_index.index_ids(index), index.d


def _check_ids(report: Report, held: tuple[np.ndarray, int], what: str, what_ids: str, sparse_ids: np.ndarray, live: np.ndarray,
               generation: dict, engine) -> None:
    """The vectors' ids against the record, the n-gram index and the store's live entries."""
    faiss_ids, dim = held
    report.facts["vectors in index"] = int(faiss_ids.size)
    if int(faiss_ids.size) != generation["ntotal"] or dim != generation["dim"]:
        report.problems.append(f"{what} holds {faiss_ids.size} vectors of dim {dim}; "
                               f"recorded {generation['ntotal']} of dim {generation['dim']}")
        report.rebuild = True
    if ids_sha256(faiss_ids) != generation["ids_sha256"]:
        report.problems.append(f"{what_ids} do not match the recorded ids checksum")
        report.rebuild = True
    if np.unique(faiss_ids).size != faiss_ids.size:
        report.problems.append(f"{what} holds duplicate ids")
        report.rebuild = True
    if not np.array_equal(np.sort(sparse_ids), np.sort(faiss_ids)):
        report.problems.append(f"n-gram index and {what} hold different ids "
                               f"({sparse_ids.size} vs {faiss_ids.size})")
        report.rebuild = True
    unindexed = np.setdiff1d(live, faiss_ids)
    stale = np.setdiff1d(faiss_ids, live)
    if unindexed.size:
        report.problems.append(f"{unindexed.size} live entries of the store have no vector in the index "
                               f"(entry ids {_sample(unindexed)}; an interrupted write: re-run it, or --repair)")
    if stale.size:
        gone = np.setdiff1d(stale, np.fromiter(store.get_entries(engine, stale.tolist()), dtype=np.int64))
        retired = np.setdiff1d(stale, gone)
        if retired.size:
            report.problems.append(f"{retired.size} entries removed or replaced in the store are still indexed "
                                   f"(entry ids {_sample(retired)}; re-run the update, or --repair)")
        if gone.size:
            report.problems.append(f"{gone.size} indexed ids do not exist in the store at all "
                                   f"(entry ids {_sample(gone)}); --repair rebuilds the index from the store")
            report.rebuild = True


def _check_model(report: Report, generation: dict) -> None:
    """The bi-encoder that built the index, where it is on this machine, is still the one recorded."""
    from mgeo_index.model.manifest import fingerprint

    model_path = generation.get("model_path")
    if model_path and Path(model_path).is_dir():
        now = fingerprint(Path(model_path))
        if now != generation["model_fingerprint"]:
            report.problems.append(f"the model at {model_path} is now {now}, but the index was built with "
                                   f"{generation['model_fingerprint']}; --repair re-embeds with it")
    elif model_path:
        report.notes.append(f"the model that built the index ({model_path}) is not on this machine; queries need --model")


def _note_strays(report: Report, index_dir: Path, engine, catalog_id: int) -> None:
    """Files the index's builds wrote that no generation references (interrupted writes)."""
    referenced = {g[k] for g in store.list_generations(engine, catalog_id) for k in ("index_file", "sparse_file") if g.get(k)}
    strays = [p.name for p in own_files(index_dir, {b["id"] for b in store.list_builds(engine, catalog_id)})
              if p.name not in referenced]
    if strays:
        report.notes.append(f"{len(strays)} files of no generation (interrupted writes; `mgeo-index gc` removes them): "
                            + ", ".join(strays[:5]))


def _check_collection(location: vector_store.Location, generation: dict, report: Report, engine,
                      catalog_id: int) -> tuple[np.ndarray, int] | None:
    """(ids, dim) of the current generation's collection, or None (a problem said why); reports an alias
    naming another collection (``report.realign``) and notes collections of no generation."""
    name, catalog = generation["index_file"], report.catalog or ""
    try:
        client = vector_store.connect(location)
    except (vector_store.Unavailable, ImportError) as exc:
        report.problems.append(str(exc))
        return None
    try:
        held = None
        if not client.has_collection(name):
            report.problems.append(f"collection {name} of generation {generation['id']} is missing from {location.url}")
        else:
            held = vector_store.collection_ids(client, name), vector_store.collection_dim(client, name)
        target = vector_store.alias_target(client, catalog)
        if target != name:
            report.problems.append(f"alias {vector_store.alias_name(catalog)} names {target or 'no collection'}, not the "
                                   f"current generation's collection {name} (a write killed after its switch; "
                                   f"`check --repair` or `gc` realigns it)")
            report.realign = True
        recorded = {g["index_file"] for g in store.list_generations(engine, catalog_id) if g.get("vector_store")}
        strays = [c for c in vector_store.ours(client, catalog) if c not in recorded]
        if strays:
            report.notes.append(f"{len(strays)} collections of no generation in {location.url} (interrupted writes; "
                                f"`mgeo-index gc` drops them): " + ", ".join(strays[:5]))
        return held
    finally:
        vector_store.release(location)


def realign(engine, index_dir: Path, catalog_id: int) -> None:
    """Point the catalog's Milvus alias at its current generation's collection (the store's pointer decides)."""
    current = store.current_generation(engine, catalog_id)
    location = vector_store.location_of(current, index_dir)
    if location is not None:
        with vector_store.session(location) as client:
            vector_store.point_alias(client, catalog_name(engine, catalog_id), current["index_file"])


def catalog_state(index_dir, catalog: str | None = None) -> tuple[dict, dict, dict[int, np.ndarray]]:
    """(entries by id, parsed elements by id, vectors by id) of a built catalog: what two engines' builds of the
    same file must agree on (``research/bench_build_ray.py``, the Ray build tests)."""
    index_dir = Path(index_dir)
    engine = store.connect(settings.database_url(index_dir))
    try:
        ids = store.entry_ids(engine, store.catalog_id(engine, catalog or settings.DEFAULT_CATALOG)).tolist()
        entries = store.get_entries(engine, ids)
        elements = {i: (e["elements"], e["admin"], e["parser"]) for i, e in store.get_elements(engine, ids).items()}
    finally:
        engine.dispose()
    index = faiss_index.load(index_dir / read_descriptor(index_dir)["index_file"])
    return entries, elements, {int(i): index.reconstruct(int(i)) for i in faiss_index.index_ids(index)}
