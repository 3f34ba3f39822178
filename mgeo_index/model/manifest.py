"""The small mgeo-index manifest stored beside Hugging Face model files, and model fingerprints."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "mgeo_index.json"
# Files whose bytes define what a model computes; the fingerprint covers exactly these.
_FINGERPRINT_FILES = (
    "config.json", "model.safetensors", "tokenizer.json", "projection.safetensors", "feature_head.safetensors",
    "feature_head.lgb.txt", "group_head.safetensors", "group_head.lgb.txt.gz", MANIFEST
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


def check_savable(model) -> None:
    """Refuse (ValueError) to save a model converted in place for inference
    (:func:`mgeo_index.runtime.backends.apply` with ``in_place``, as the inference loaders do): its Linear layers hold
    int8 or bfloat16 weights in another layout, and its FP32 weights are gone."""
    converted = model.__dict__.get("converted")
    if converted:
        raise ValueError(f"this model was loaded for the {converted} backend only (its FP32 weights were dropped); "
                         f"load it from its directory ({model.path}) to save it")


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


#: How many tokens an encoder reads at most when its manifest does not say (a plain Hugging Face checkpoint): its
#: tokenizer's limit, up to this.
DEFAULT_MAX_LENGTH = 128
TOKENIZER_CONFIG = "tokenizer_config.json"


def stated_limit(settings: dict) -> int:
    """The token limit tokenizer settings state (``model_max_length``); 10**12 (no limit) where they state none."""
    stated = settings.get("model_max_length")
    return int(min(stated if isinstance(stated, (int, float)) else 10**12, 10**12))


def tokenizer_limit(path: str | Path) -> int:
    """The token limit a model directory's tokenizer states (``tokenizer_config.json``, :func:`stated_limit`), read
    without loading the tokenizer."""
    file = Path(path) / TOKENIZER_CONFIG
    return stated_limit(json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {})


def read_bi_manifest(path: str | Path) -> dict:
    """What a bi-encoder directory's manifest says, with the defaults a plain Hugging Face checkpoint gets:
    ``pooling`` (mean), ``projection_dim`` (None: no projection) and ``max_length`` (its tokenizer's limit, up to
    :data:`DEFAULT_MAX_LENGTH`). Both backends' loaders and the jobs read it here. Imports no torch."""
    manifest = read_manifest(path, "bi-encoder")
    pooling = manifest.get("pooling", "mean")
    if pooling not in ("mean", "cls"):
        raise ModelError(f"{path}: pooling must be 'mean' or 'cls' in its manifest, not {pooling!r}")
    max_length = manifest.get("max_length") or min(tokenizer_limit(path), DEFAULT_MAX_LENGTH)
    return {"pooling": pooling, "projection_dim": manifest.get("projection_dim") or None, "max_length": int(max_length)}


def read_cross_manifest(path: str | Path, *, stacked: bool = True, group_head: bool = True) -> dict:
    """What a cross-encoder directory's manifest and config say, checked (:class:`ModelError` naming what to do
    otherwise): ``labels`` (config order), ``max_length``, ``temperature``, ``stack`` / ``gate`` (None without
    a feature head or with ``stacked=False``), ``decision_offsets`` (in label order), ``number_policy`` and
    ``group_head`` (its manifest entry, for :func:`mgeo_index.model.group_head.check_group_head`; None without one
    or with ``group_head=False``). Imports no torch."""
    from mgeo_index.model.bert_files import read_config
    from mgeo_index.settings import LABELS

    path = Path(path)
    manifest = read_manifest(path, "cross-encoder")
    config = read_config(path)
    labels = tuple(config.id2label[i] for i in range(config.num_labels))
    if set(labels) != set(LABELS):
        raise ModelError(
            f"{path}: cross-encoder labels are {labels}; expected the three labels {LABELS} "
            "(set id2label in config.json)."
        )
    out = {"labels": labels, "max_length": manifest.get("max_length", DEFAULT_MAX_LENGTH),
           "temperature": float(manifest.get("temperature", 1.0)), "stack": None, "gate": None,
           "decision_offsets": None, "number_policy": None, "group_head": None}
    if stacked and manifest.get("stack"):
        from mgeo_index.compare.features import FEATURE_NAMES
        from mgeo_index.text.parser import parser_version

        refit = f"refit it: python scripts/recalibrate.py --model {path}"
        if manifest["stack"].get("features") != list(FEATURE_NAMES):
            raise ModelError(f"{path}: its feature head was trained on other features than this version computes; {refit}")
        if manifest["stack"].get("parser") != parser_version():
            raise ModelError(f"{path}: its feature head was trained on the parses of {manifest['stack'].get('parser')}, "
                             f"but this version parses with {parser_version()}; {refit}")
        out["stack"], out["gate"] = manifest["stack"], manifest.get("gate")
    if manifest.get("decision_offsets"):
        offsets = manifest["decision_offsets"]
        if set(offsets) != set(labels):
            raise ModelError(f"{path}: decision_offsets in its manifest must name the labels {labels}; found {sorted(offsets)}.")
        out["decision_offsets"] = [float(offsets[label]) for label in labels]
    if manifest.get("number_policy"):
        policy = manifest["number_policy"]
        if not isinstance(policy, dict) or not {"exact_match", "partial_vs_not"} <= set(policy):
            raise ModelError(f"{path}: number_policy in its manifest must give exact_match and partial_vs_not; "
                             f"found {policy!r}.")
        out["number_policy"] = policy
    if group_head and out["stack"] is not None and manifest.get("group_head"):  # stacks the feature head's logits
        out["group_head"] = manifest["group_head"]
    return out
