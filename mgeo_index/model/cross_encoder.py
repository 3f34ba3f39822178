"""Cross-encoder: (query, candidate) → exact_match / partial_match / not_match.

A Hugging Face sequence-classification checkpoint with three labels, plus a manifest holding
the maximum pair length and the calibration temperature fitted on a held-out split.

Optionally a *stacked* scorer: a small feature head over structured agreement features
(:mod:`mgeo_index.compare.features`: which admin levels, road, number, building, POI agree, n-gram and
edit-distance similarities) whose logits are combined with the network's:
``logits = alpha * network_logits + beta * feature_logits + bias``, the three combination
parameters fitted on the held-out calibration split (they subsume the temperature).

Probabilities stay calibrated; the *label* is a decision on top of them: the label maximizing
``log p + decision_offsets``, offsets fitted on the calibration split for macro-F1 (a calibrated
model under-predicts the rare ``exact_match`` class; macro-F1 weighs all three classes equally).
Without offsets the label is the most probable one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mgeo_index.model import bert
from mgeo_index.runtime import rows
from mgeo_index.model.manifest import ModelError, check_savable, fingerprint, read_cross_manifest, save_hf_model, write_manifest
from mgeo_index.model.decision import GATE_MAX_EXACT, Scoring  # noqa: F401  (GATE_MAX_EXACT: re-exported)
from mgeo_index.model.group_head import GROUP_HEAD, LIGHTGBM_TEXTS, attach
from mgeo_index.model.tokenizer import load_tokenizer
from mgeo_index.model.tree_head import TREE_HEAD, TreeHead, load_tree_head

KIND = "cross-encoder"
FEATURE_HEAD = "feature_head.safetensors"


class FeatureHead(nn.Module):
    """(B, F) structured features → (B, 3) logits.

    Features are computed on the CPU and the stack combines on the CPU: a head moved to a GPU with its
    cross-encoder (``cross.to("cuda")``) takes CPU features and returns CPU logits all the same."""

    def __init__(self, n_features: int, hidden: int = 64, n_labels: int = 3):
        super().__init__()
        self.net = nn.Sequential(rows.Linear(n_features, hidden), nn.ReLU(), rows.Linear(hidden, hidden), nn.ReLU(),
                                 rows.Linear(hidden, n_labels))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        device = self.net[0].weight.device
        if device.type == "cpu":
            return self.net(features)
        return self.net(features.to(device)).float().cpu()


def average_heads(heads: list[FeatureHead]) -> FeatureHead:
    """One :class:`FeatureHead` whose logits are exactly the mean of ``heads``' logits: their hidden
    layers side by side (block-diagonal middle layer), so an ensemble ships and loads as a plain head."""
    first, middle, last = ([h.net[i] for h in heads] for i in (0, 2, 4))
    merged = FeatureHead(first[0].in_features, sum(layer.out_features for layer in first), last[0].out_features)
    with torch.no_grad():
        merged.net[0].weight.copy_(torch.cat([layer.weight for layer in first]))
        merged.net[0].bias.copy_(torch.cat([layer.bias for layer in first]))
        merged.net[2].weight.copy_(torch.block_diag(*[layer.weight for layer in middle]))
        merged.net[2].bias.copy_(torch.cat([layer.bias for layer in middle]))
        merged.net[4].weight.copy_(torch.cat([layer.weight for layer in last], dim=1) / len(heads))
        merged.net[4].bias.copy_(torch.stack([layer.bias for layer in last]).mean(0))
    return merged.eval()


class CrossEncoder(Scoring, torch.nn.Module):
    def __init__(self, model, tokenizer, *, max_length: int = 128, temperature: float = 1.0):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.temperature = temperature
        self.labels = tuple(model.config.id2label[i] for i in range(model.config.num_labels))
        self.fingerprint = ""
        self.path: str | None = None  # where it was loaded from or saved to
        self.feature_head = None  # FeatureHead (MLPs) or tree_head.TreeHead: (B, F) features → (B, 3) logits
        self.stack: dict | None = None  # {"alpha": float, "beta": float, "bias": [3 floats], "features": [...]}
        self.decision_offsets: list[float] | None = None  # per label, in self.labels order
        # the cascade: {"beta", "bias", "min_probability"}; a pair whose feature-only scorer (the same feature
        # head, calibrated alone) decides with at least min_probability is not given to the network
        self.gate: dict | None = None
        # a query's candidates judged together where a file lists them (mgeo_index.model.group_head)
        self.group_head = None
        # how pairs whose numbers conflict are scored (mgeo_index.model.numbers), fitted on the calibration split
        self.number_policy: dict | None = None

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        # (B, T) → logits (B, 3) in LABELS order
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits

    def head_logits(self, features: np.ndarray) -> np.ndarray:
        """The feature head's logits (B, 3) for (B, F) features."""
        with torch.inference_mode():
            return self.feature_head(torch.from_numpy(np.asarray(features, dtype=np.float32))).float().numpy()

    def _softmax(self, logits: np.ndarray, temperature: float) -> np.ndarray:
        from mgeo_index.runtime import kernels

        return kernels.softmax(torch.from_numpy(logits), temperature=temperature).numpy()

    def save(self, path: str | Path, *, half: bool = True) -> None:
        check_savable(self)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_hf_model(self.model, self.tokenizer, path, half=half)
        manifest = {"kind": KIND, "max_length": self.max_length, "temperature": self.temperature, "labels": list(self.labels)}
        save_head(self.feature_head, path)
        if self.feature_head is not None:
            manifest["stack"] = self.stack
        if self.decision_offsets is not None:
            manifest["decision_offsets"] = dict(zip(self.labels, self.decision_offsets))
        if self.gate is not None and self.feature_head is not None:
            manifest["gate"] = self.gate
        if self.number_policy is not None:
            manifest["number_policy"] = self.number_policy
        for trees in (GROUP_HEAD, LIGHTGBM_TEXTS):
            (path / trees).unlink(missing_ok=True)
        if self.group_head is not None:
            manifest["group_head"] = self.group_head.manifest()
            self.group_head.save(path)
        write_manifest(path, manifest)
        self.fingerprint = fingerprint(path)
        self.path = str(path.resolve())


def save_head(head, directory: Path) -> None:
    """Write ``head`` (trees or MLPs; None: none) into a model directory, replacing whichever head was there."""
    for name in (FEATURE_HEAD, TREE_HEAD):
        (directory / name).unlink(missing_ok=True)
    if isinstance(head, TreeHead):
        head.save(directory / TREE_HEAD)
    elif head is not None:
        save_file({k: v.detach().float().contiguous() for k, v in head.state_dict().items()}, directory / FEATURE_HEAD)


def load_head(directory: Path):
    """The feature head saved in a model directory: trees (:mod:`~mgeo_index.model.tree_head`) or MLPs."""
    if (directory / TREE_HEAD).exists():
        return load_tree_head(directory / TREE_HEAD)
    if not (directory / FEATURE_HEAD).exists():
        raise ModelError(f"{directory}: its manifest names a stacked scorer but neither {FEATURE_HEAD} nor {TREE_HEAD} "
                         "is there; copy the whole model directory again")
    state = load_file(directory / FEATURE_HEAD)
    head = FeatureHead(state["net.0.weight"].shape[1], state["net.0.weight"].shape[0])
    head.load_state_dict(state)
    return head.eval()


def load_cross_encoder(path: str | Path, *, stacked: bool = True, group_head: bool = True,
                       trainable: bool = False) -> CrossEncoder:
    """Load a cross-encoder directory; ``stacked=False`` leaves out its feature head, stack and group head (the
    network alone, e.g. to fit a new head after the features changed); ``group_head=False`` its group head (to fit
    a new one); ``trainable``: the network as a ``transformers`` model, to train it (otherwise a BERT runs as
    :mod:`mgeo_index.model.bert`'s plain modules: the same outputs, a faster start)."""
    path = Path(path)
    read = read_cross_manifest(path, stacked=stacked, group_head=group_head)
    tokenizer = load_tokenizer(path)
    model = bert.load_network(path, classifier=True, trainable=trainable)
    cross = CrossEncoder(model, tokenizer, max_length=read["max_length"], temperature=read["temperature"])
    if read["stack"] is not None:
        cross.feature_head = load_head(path)
        cross.stack, cross.gate = read["stack"], read["gate"]
    cross.decision_offsets, cross.number_policy = read["decision_offsets"], read["number_policy"]
    if read["group_head"] is not None:
        attach(cross, path, read["group_head"])
    cross.fingerprint = fingerprint(path)
    cross.path = str(path.resolve())
    return cross.eval()
