"""The one door to load the models: which directory (flag > environment > the model that built the
index > the bundled default), the check that a query model is the one that built the index, the
device and the inference backend. The CLI, the Python facade, jobs, updates, the service and the
benchmarks all load models here.
"""
from __future__ import annotations

from pathlib import Path

from mgeo_index import settings


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


def load_bi(model: str | Path | None = None, *, device: str | None = None, backend: str | None = None,
            apply_backend: bool = True):
    """The bi-encoder in ``model`` (default: ``settings.bi_model_path``) on ``device``, with ``backend``
    applied (``--backend`` > ``MGEO_INDEX_BACKEND`` > the device's default)."""
    from mgeo_index import backends
    from mgeo_index.model.bi_encoder import load_bi_encoder

    device = settings.device(device)
    bi = load_bi_encoder(settings.bi_model_path(model)).to(device)
    return backends.apply(bi, backend, device=device) if apply_backend else bi


def load_cross(cross_model: str | Path | None = None, *, device: str | None = None, backend: str | None = None):
    """The cross-encoder in ``cross_model`` (default: ``settings.cross_model_path``), as :func:`load_bi`."""
    from mgeo_index import backends
    from mgeo_index.model.cross_encoder import load_cross_encoder

    device = settings.device(device)
    cross = load_cross_encoder(settings.cross_model_path(cross_model)).to(device)
    if not settings.cascade():
        cross.gate = None
    return backends.apply(cross, backend, device=device)


def load_for_index(descriptor: dict, index_dir: str | Path, *, model=None, cross_model=None, device: str | None = None,
                   backend: str | None = None, rerank: bool = True):
    """(bi-encoder, cross-encoder or None) for querying the index whose ``descriptor`` is given."""
    device = settings.device(device)
    bi = load_bi(index_model_path(descriptor.get("model_path"), model), device=device, apply_backend=False)
    check_index_model(bi.fingerprint, bi.path, descriptor, index_dir)
    cross = load_cross(cross_model, device=device, backend=backend) if rerank else None
    from mgeo_index import backends

    return backends.apply(bi, backend, device=device), cross
