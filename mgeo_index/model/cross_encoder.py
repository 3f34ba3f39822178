"""Cross-encoder: (query, candidate) → exact_match / partial_match / not_match.

A Hugging Face sequence-classification checkpoint with three labels, plus a manifest holding
the maximum pair length and the calibration temperature fitted on a held-out split.

Optionally a *stacked* scorer: a small feature head over structured agreement features
(:mod:`mgeo_index.query.features`: which admin levels, road, number, building, POI agree, n-gram and
edit-distance similarities) whose logits are combined with the network's:
``logits = alpha * network_logits + beta * feature_logits + bias``, the three combination
parameters fitted on the held-out calibration split (they subsume the temperature).

Probabilities stay calibrated; the *label* is a decision on top of them: the label maximizing
``log p + decision_offsets``, offsets fitted on the calibration split for macro-F1 (a calibrated
model under-predicts the rare ``exact_match`` class; macro-F1 weighs all three classes equally).
Without offsets the label is the most probable one.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mgeo_index.model import bert
from mgeo_index.model.manifest import ModelError, fingerprint, read_manifest, save_hf_model, write_manifest
from mgeo_index.model.group_head import GROUP_HEAD, GroupHead, check_group_head, decide, load_group_head
from mgeo_index.model.tokenizer import load_tokenizer
from mgeo_index.model.tree_head import TREE_HEAD, TreeHead, load_tree_head
from mgeo_index.settings import LABELS

KIND = "cross-encoder"
FEATURE_HEAD = "feature_head.safetensors"
# The cascade leaves a pair to the network when its feature-only P(exact_match) is at least this, whatever the
# gate's confidence: candidates that might be ranked first keep the network's finer P(exact_match). Chosen on the
# 1,812 CCKS train + calibration queries (research/eval_cascade.py), as the largest cap that changed no reranked
# rank 1 against the network on every pair: 0.05 / 0.04 / 0.035 / 0.03 changed 4 / 2 / 1 / 0 of them, the network
# scoring 50 / 54 / 56 / 58% of the pairs. (Dev, 306 queries: 3 / 2 / 2 / 0.) A gate may carry its own ``max_exact``.
GATE_MAX_EXACT = 0.03


class FeatureHead(nn.Module):
    """(B, F) structured features → (B, 3) logits.

    Features are computed on the CPU and the stack combines on the CPU: a head moved to a GPU with its
    cross-encoder (``cross.to("cuda")``) takes CPU features and returns CPU logits all the same."""

    def __init__(self, n_features: int, hidden: int = 64, n_labels: int = 3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_labels))

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


class CrossEncoder(torch.nn.Module):
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

    @property
    def group_head(self) -> GroupHead | None:
        """The group head, read from its file on first use: parsing its boosters' trees takes time (0.9 s in a warm
        process, 3 s cold, for 6 × 300 trees of 63 leaves), and resolving, serving and pair-by-pair scoring never
        need it."""
        if self._group_head_loader is not None:
            self._group_head, self._group_head_loader = self._group_head_loader(), None
        return self._group_head

    @group_head.setter
    def group_head(self, head: GroupHead | None) -> None:
        self._group_head, self._group_head_loader = head, None

    def decide(self, probs: np.ndarray) -> np.ndarray:
        """Label index (in ``self.labels`` order) for each row of probabilities (see the module docstring)."""
        probs = np.asarray(probs, dtype=np.float64).reshape(-1, len(self.labels))
        return decide(probs, self.decision_offsets or [0.0] * len(self.labels))

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        # (B, T) → logits (B, 3) in LABELS order
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits

    @property
    def uses_network(self) -> bool:
        """False for a stacked scorer whose calibration gave the network no weight (``alpha`` 0): the
        transformer is then never run and the feature head scores alone."""
        return self.stack is None or self.stack["alpha"] != 0.0

    def feature_logits(self, features: torch.Tensor) -> torch.Tensor:
        """``beta · feature_head + bias``: the stacked scorer without its network term (cheap: the
        resolver prescreens its candidate pool with it before running the network)."""
        with torch.inference_mode():
            feature_logits = self.feature_head(features)
        return self.stack["beta"] * feature_logits + torch.tensor(self.stack["bias"], dtype=torch.float32)

    def gate_probabilities(self, features: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(calibrated feature-only probabilities (B, 3), whether each pair is decided without the network).

        Per pair, from its features alone: the same answer whatever it is batched with."""
        from mgeo_index.runtime import kernels

        with torch.inference_mode():
            logits = self.gate["beta"] * self.feature_head(features) + torch.tensor(self.gate["bias"], dtype=torch.float32)
        probs = kernels.softmax(logits).numpy()
        decided = self.decide(probs)
        sure = probs[np.arange(len(probs)), decided] >= self.gate["min_probability"]
        allowed = [self.labels.index(label) for label in self.gate.get("labels", self.labels)]
        # a pair that could still be the answer (feature-only P(exact_match) above GATE_MAX_EXACT) goes to the
        # network: candidates competing for rank 1 are ordered by its finer P(exact_match)
        unlikely = probs[:, self.labels.index("exact_match")] < self.gate.get("max_exact", GATE_MAX_EXACT)
        return probs, sure & np.isin(decided, allowed) & unlikely

    def stacked_logits(self, logits: torch.Tensor, first: list[str], second: list[str],
                       features: np.ndarray | None = None) -> torch.Tensor:
        """Combine network logits (B, 3) with the feature head's logits for the same pairs
        (``features``: their :func:`~mgeo_index.query.features.pair_features_batch`, when already computed)."""
        from mgeo_index.query.features import pair_features_batch

        if features is None:
            features = pair_features_batch(first, second)
        return self.stack["alpha"] * logits.float().cpu() + self.feature_logits(torch.from_numpy(features))

    def save(self, path: str | Path, *, half: bool = True) -> None:
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
        (path / GROUP_HEAD).unlink(missing_ok=True)
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
    manifest = read_manifest(path, KIND)
    config = bert.read_config(path)
    labels = tuple(config.id2label[i] for i in range(config.num_labels))
    if set(labels) != set(LABELS):
        raise ModelError(
            f"{path}: cross-encoder labels are {labels}; expected the three labels {LABELS} "
            "(set id2label in config.json)."
        )
    tokenizer = load_tokenizer(path)
    model = bert.load_network(path, classifier=True, trainable=trainable)
    cross = CrossEncoder(
        model,
        tokenizer,
        max_length=manifest.get("max_length", 128),
        temperature=float(manifest.get("temperature", 1.0)),
    )
    if stacked and manifest.get("stack"):
        from mgeo_index.query.features import FEATURE_NAMES
        from mgeo_index.text.parser import parser_version

        refit = f"refit it: python scripts/recalibrate.py --model {path}"
        if manifest["stack"].get("features") != list(FEATURE_NAMES):
            raise ModelError(f"{path}: its feature head was trained on other features than this version computes; {refit}")
        if manifest["stack"].get("parser") != parser_version():
            raise ModelError(f"{path}: its feature head was trained on the parses of {manifest['stack'].get('parser')}, "
                             f"but this version parses with {parser_version()}; {refit}")
        cross.feature_head = load_head(path)
        cross.stack = manifest["stack"]
        cross.gate = manifest.get("gate")
    if manifest.get("decision_offsets"):
        offsets = manifest["decision_offsets"]
        if set(offsets) != set(labels):
            raise ModelError(f"{path}: decision_offsets in its manifest must name the labels {labels}; found {sorted(offsets)}.")
        cross.decision_offsets = [float(offsets[label]) for label in labels]
    if manifest.get("number_policy"):
        policy = manifest["number_policy"]
        if not isinstance(policy, dict) or not {"exact_match", "partial_vs_not"} <= set(policy):
            raise ModelError(f"{path}: number_policy in its manifest must give exact_match and partial_vs_not; "
                             f"found {policy!r}.")
        cross.number_policy = policy
    if stacked and group_head and manifest.get("group_head") and cross.feature_head is not None:  # stacks the feature head's logits
        from mgeo_index.query.features import FEATURE_NAMES

        check_group_head(path, manifest["group_head"], labels, len(FEATURE_NAMES))  # refused now, read when first used
        cross._group_head_loader = partial(load_group_head, path, manifest["group_head"], labels, len(FEATURE_NAMES))
    cross.fingerprint = fingerprint(path)
    cross.path = str(path.resolve())
    return cross.eval()
