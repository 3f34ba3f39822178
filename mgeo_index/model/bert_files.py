"""A BERT directory as it is saved (``config.json``, ``model.safetensors``), read without torch: what the torch
modules of :mod:`mgeo_index.model.bert` and the NumPy ones of :mod:`mgeo_index.model.numpy_backend` both load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WEIGHTS = "model.safetensors"
SCALE_SUFFIX = "_scale"  # beside an int8 weight: its per-output-channel scales (float32)
ACTIVATIONS = ("gelu",)  # erf GELU: what both implementations compute


class Config:
    """A model's ``config.json``, read as attributes (``hidden_size``, ``id2label`` with int keys, …)."""

    def __init__(self, values: dict):
        self.values = dict(values)
        self.__dict__.update(self.values)
        labels = self.values.get("id2label") or {0: "LABEL_0", 1: "LABEL_1"}  # transformers' default
        self.id2label = {int(key): value for key, value in labels.items()}
        self.num_labels = len(self.id2label)

    def to_dict(self) -> dict:
        return dict(self.values)

    def to_json_string(self) -> str:
        return json.dumps(self.values, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def read_config(path: str | Path) -> Config:
    return Config(json.loads((Path(path) / "config.json").read_text()))


def supports(config: Config) -> bool:
    """Whether this package computes what ``transformers`` would for ``config``: an encoder-only BERT with
    absolute positions and erf GELU."""
    return (config.values.get("model_type") == "bert" and not config.values.get("is_decoder", False)
            and not config.values.get("add_cross_attention", False)
            and config.values.get("position_embedding_type", "absolute") == "absolute"
            and config.values.get("hidden_act") in ACTIVATIONS
            and config.values.get("chunk_size_feed_forward", 0) == 0)


def read_weights(path: str | Path) -> dict[str, np.ndarray]:
    """A model directory's weights as FP32 arrays by name: FP16 / FP32 as stored, and int8 ones (a Linear weight
    stored with ``NAME_scale`` beside it) multiplied back by their scales."""
    from safetensors import safe_open

    state = {}
    with safe_open(str(Path(path) / WEIGHTS), framework="np") as weights:
        names = set(weights.keys())
        for name in names:
            if name.endswith(SCALE_SUFFIX) and name.removesuffix(SCALE_SUFFIX) in names:
                continue
            tensor = weights.get_tensor(name)
            if tensor.dtype == np.int8:
                tensor = tensor.astype(np.float32) * weights.get_tensor(name + SCALE_SUFFIX).astype(np.float32)[:, None]
            state[name] = tensor.astype(np.float32)
    return state
