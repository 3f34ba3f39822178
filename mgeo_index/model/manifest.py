"""The small mgeo-index manifest stored beside Hugging Face model files, and model fingerprints."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "mgeo_index.json"
# Files whose bytes define what a model computes; the fingerprint covers exactly these.
_FINGERPRINT_FILES = (
    "config.json", "model.safetensors", "tokenizer.json", "projection.safetensors", "feature_head.safetensors",
    "feature_head.lgb.txt", "group_head.lgb.txt.gz", MANIFEST
)


def quiet_transformers() -> None:
    """No per-load progress bars or load reports from transformers on our users' terminals."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


class ModelError(Exception):
    """A model directory is missing, incomplete or of the wrong kind."""


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from mgeo_index import __version__

    try:
        transformers = version("transformers")  # what the package metadata says: importing it takes seconds
    except PackageNotFoundError:
        transformers = "not installed"
    return {"mgeo_index": __version__, "torch": torch.__version__, "transformers": transformers}


def write_manifest(path: str | Path, manifest: dict) -> None:
    data = {**manifest, "versions": versions()}
    (Path(path) / MANIFEST).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n")


def read_manifest(path: str | Path, kind: str) -> dict:
    """Read the manifest; a plain Hugging Face checkpoint without one gets defaults for ``kind``."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelError(
            f"{path} is not a model directory (no config.json). Pass a directory written by "
            "`mgeo-index train` or a Hugging Face checkpoint saved with save_pretrained()."
        )
    file = path / MANIFEST
    manifest = json.loads(file.read_text()) if file.exists() else {"kind": kind}
    if manifest.get("kind", kind) != kind:
        raise ModelError(f"{path} holds a {manifest['kind']} model, but a {kind} model is needed here.")
    return manifest


# JSON keys that record how or when a file was written, not what the model computes: a fast
# tokenizer serializes the padding/truncation state of its last call, configs carry versions.
_VOLATILE_KEYS = {"padding", "truncation", "transformers_version", "versions", "dtype", "torch_dtype", "_name_or_path"}


def fingerprint(path: str | Path, files: tuple[str, ...] = _FINGERPRINT_FILES) -> str:
    """A short content hash of what defines the model's outputs (weights, vocabulary, settings); ``files``:
    hash these of the directory's files instead (e.g. the network's alone)."""
    path = Path(path)
    digest = hashlib.sha256()
    for name in files:
        file = path / name
        if not file.exists():
            continue
        digest.update(name.encode())
        if name.endswith(".json"):
            content = {k: v for k, v in json.loads(file.read_text()).items() if k not in _VOLATILE_KEYS}
            digest.update(json.dumps(content, sort_keys=True, ensure_ascii=False).encode())
            continue
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def save_hf_model(model, tokenizer, path: Path, *, half: bool) -> None:
    """save_pretrained of a transformer (FP16 on disk when ``half``; the model stays FP32) + its tokenizer."""
    try:
        (model.half() if half else model).save_pretrained(path)
    finally:
        model.float()
    save_tokenizer(tokenizer, path)


def save_tokenizer(tokenizer, path: Path) -> None:
    """Save without the padding/truncation state left behind by the last batch call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_padding()
        backend.no_truncation()
    tokenizer.save_pretrained(path)
