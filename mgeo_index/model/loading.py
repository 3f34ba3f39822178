"""The one door to load the models: which directory (flag > environment > the model that built the
index > the bundled default; for the cross-encoder: flag > environment > the index's active adapted
version, ``mgeo-index adapt`` > the bundled default), the check that a query model is the one that built
the index, the device and the inference backend. The CLI, the Python facade, jobs, updates, the service and the
benchmarks all load models here.
"""
from __future__ import annotations

from pathlib import Path

from mgeo_index import settings
from mgeo_index.heap import release_freed


class ModelMismatch(Exception):
    """The query model is not the model the index was built with."""


def index_model_path(recorded: str | None, model: str | Path | None = None) -> Path:
    """The bi-encoder for an index: ``model`` > ``MGEO_INDEX_MODEL`` > the model that built the index
    (``recorded``, when that directory is still there) > the bundled default."""
    if model is None and settings.env("MODEL") is None and recorded and Path(recorded).is_dir():
        model = recorded
    return settings.bi_model_path(model)


def check_index_model(fingerprint: str, path: str | Path, descriptor: dict, index_dir: str | Path) -> None:
    """Refuse a query model other than the one whose fingerprint the index ``descriptor`` records."""
    if fingerprint != descriptor["model_fingerprint"]:
        recorded = descriptor.get("model_path")
        raise ModelMismatch(
            f"the index in {index_dir} was built with model {descriptor['model_fingerprint']} ({recorded}), "
            f"but the query model {path} is {fingerprint}. Query with --model {recorded} or rebuild the index "
            "with this model."
        )


def stored_bi(model: str | Path | None = None):
    """The bi-encoder in ``model`` (default: ``settings.bi_model_path``) as its files hold it: an FP32 torch module on
    the CPU, no backend applied. For a build, an update and their workers, which move and convert it where they
    embed (:func:`mgeo_index.catalog.build_tasks.encode_task`), and the benchmark, which converts a copy per
    backend."""
    from mgeo_index.model.bi_encoder import load_bi_encoder

    return load_bi_encoder(settings.bi_model_path(model))


def stored_cross(cross_model: str | Path | None = None, profile: str | None = None):
    """The cross-encoder in ``cross_model`` (default: the bundled one of ``profile``) as its files hold it, as
    :func:`stored_bi`."""
    from mgeo_index.model.cross_encoder import load_cross_encoder

    return load_cross_encoder(settings.cross_model_path(cross_model, profile))


def load_bi(model: str | Path | None = None, *, device: str | None = None, backend: str | None = None,
            apply_backend: bool = True):
    """The bi-encoder in ``model`` (default: ``settings.bi_model_path``) on ``device``, with ``backend``
    applied (``--backend`` > ``MGEO_INDEX_BACKEND`` > the device's default)."""
    path = settings.bi_model_path(model)
    if (bi := _numpy_model("BiEncoder", backend, device, path)) is not None:
        return bi
    from mgeo_index.runtime import backends

    device = settings.device(device)
    bi = stored_bi(path).to(device)
    return backends.apply(bi, backend, device=device, in_place=True) if apply_backend else bi


def load_cross(cross_model: str | Path | None = None, *, device: str | None = None, backend: str | None = None,
               profile: str | None = None):
    """The cross-encoder in ``cross_model`` (default: ``settings.cross_model_path``: the bundled one of
    ``profile``), as :func:`load_bi`."""
    path = settings.cross_model_path(cross_model, profile)
    cross = _numpy_model("CrossEncoder", backend, device, path)
    if cross is None:
        from mgeo_index.runtime import backends

        device = settings.device(device)
        cross = backends.apply(stored_cross(path).to(device), backend, device=device, in_place=True)
    if not settings.cascade():
        cross.gate = None
    return cross


def _numpy_model(kind: str, backend: str | None, device: str | None, path: str | Path):
    """The ``kind`` (``BiEncoder`` or ``CrossEncoder``) of :mod:`mgeo_index.model.numpy_backend` in ``path``, loaded
    for its plan, where the plan for ``backend`` and ``device`` runs the NumPy executor and that executor computes
    the model; otherwise None (the model loads as a torch module)."""
    from mgeo_index.runtime.plan import plan

    chosen = plan(backend, device)
    if chosen.executor != "numpy":
        return None
    from mgeo_index.model import numpy_backend

    if not numpy_backend.computes(path):
        return None
    model = getattr(numpy_backend, kind)(path, numpy_backend.kind_of(chosen))
    model.plan = chosen
    return model


def active_cross_version(index_dir: str | Path, engine) -> tuple[dict | None, Path | None]:
    """(the store's active ``cross`` model version, its directory) or (None, None) when the index uses the
    shipped cross-encoder. A recorded directory that is gone is an error naming it and the way back."""
    from mgeo_index import store
    from mgeo_index.model.manifest import ModelError

    version = store.active_model_version(engine, "cross")
    if version is None:
        return None, None
    path = Path(version["path"])
    path = path if path.is_absolute() else Path(index_dir) / path
    if not (path / "config.json").is_file():
        raise ModelError(
            f"the index's active cross-encoder (version {version['id']}, written by `mgeo-index adapt`) is "
            f"{path}, which is missing or incomplete: restore that directory, or go back to the previous "
            f"version with `mgeo-index adapt --rollback --index-dir {index_dir}`")
    return version, path


def _store_url(index_dir: str | Path, descriptor: dict | None, db: str | None) -> str:
    """The index's store URL when the caller has no engine: ``db`` > ``MGEO_INDEX_DB`` > the URL the
    generation records (unless its password was hidden) > the directory's SQLite file."""
    recorded = (descriptor or {}).get("database")
    if db is None and settings.env("DB") is None and isinstance(recorded, str) and "***" not in recorded:
        return settings.with_driver(recorded)
    return settings.database_url(index_dir, db)


def index_cross_model(index_dir: str | Path, cross_model: str | Path | None = None, *, engine=None,
                      db: str | None = None, descriptor: dict | None = None,
                      profile: str | None = None) -> tuple[Path, dict | None]:
    """(the cross-encoder directory for an index, its active model version or None): ``cross_model`` >
    ``MGEO_INDEX_CROSS_MODEL`` > for the accurate ``profile``, its bundled cross-encoder > the store's active
    ``cross`` version (``mgeo-index adapt``, which adapts the default profile's; its path is relative to the index
    directory) > the bundled default. ``engine``: the index's store, when open."""
    if cross_model is not None or settings.env("CROSS_MODEL") is not None or profile == "accurate":
        return settings.cross_model_path(cross_model, profile), None
    if engine is None:
        from mgeo_index import store

        own = store.connect(_store_url(index_dir, descriptor, db))
        try:
            version, path = active_cross_version(index_dir, own)
        finally:
            own.dispose()
    else:
        version, path = active_cross_version(index_dir, engine)
    return (path, version) if version is not None else (settings.cross_model_path(None), None)


def load_for_index(descriptor: dict, index_dir: str | Path, *, model=None, cross_model=None, device: str | None = None,
                   backend: str | None = None, rerank: bool = True, engine=None, db: str | None = None,
                   profile: str | None = None):
    """(bi-encoder, cross-encoder or None) for querying the index whose ``descriptor`` is given; the
    cross-encoder as :func:`index_cross_model` chooses it (``engine``: the index's open store). The memory that
    loading freed is handed back (:func:`mgeo_index.heap.release_freed`)."""
    device = settings.device(device)
    bi = load_bi(index_model_path(descriptor.get("model_path"), model), device=device, backend=backend,
                 apply_backend=False)
    check_index_model(bi.fingerprint, bi.path, descriptor, index_dir)
    cross = None
    if rerank:
        path, version = index_cross_model(index_dir, cross_model, engine=engine, db=db, descriptor=descriptor,
                                          profile=profile)
        cross = load_cross(path, device=device, backend=backend)
        if version is not None and cross.fingerprint != version["fingerprint"]:
            from mgeo_index.model.manifest import ModelError

            raise ModelError(
                f"{path} is model {cross.fingerprint}, but `mgeo-index adapt` recorded version {version['id']} as "
                f"{version['fingerprint']}: the directory was changed since. Restore it, or go back to the previous "
                f"version with `mgeo-index adapt --rollback --index-dir {index_dir}`")
    if getattr(bi, "backend", None) != "numpy":
        from mgeo_index.runtime import backends

        backends.apply(bi, backend, device=device, in_place=True)
    release_freed()  # the weights as read, dropped once converted
    return bi, cross
