"""The ``numpy`` backend: the shipped encoders computed with NumPy alone, so that a one-shot command starts without
importing torch (1.2–1.7 s of a 2.6 s ``resolve`` of one address).

It reads a model directory as :mod:`mgeo_index.model.bert` does (:mod:`mgeo_index.model.bert_files`:
``config.json``, ``model.safetensors`` in FP16, FP32 or int8 with scales) and computes BERT's forward pass in
evaluation mode: embeddings, post-LayerNorm residual blocks, erf GELU (the polynomial torch's CPU kernel uses), a
tanh pooler. Its Linear layers compute as the CPU's default backend does (:mod:`mgeo_index.runtime.plan`), so
that a one-shot answer stays as close as it can to the answer the same machine gives in a batch job:

- ``int8`` (VNNI CPUs): weights quantized per output channel, activations per row, as
  :mod:`mgeo_index.runtime.quant`; the int8 products are summed in FP32, which is exact (a sum of at most
  1,024 products of ±127 stays below 2²⁴), so every Linear gives torch's bits;
- ``bf16`` (AMX CPUs): inputs and weights rounded to bfloat16, FP32 sums, outputs rounded to bfloat16;
- ``fp32`` elsewhere.

Attention, LayerNorm and softmax sum in NumPy's order, not torch's: probabilities agree to about 1e-6, not to the
bit, and int8 now and then rounds an activation to the neighbouring level (up to ~5e-4 on a vector). On 2,000 CCKS
queries over the CCKS catalog against the int8 backend, 55 rankings (candidates within a few thousandths swapped)
and 6 of 19,989 labels differed, largest probability difference 0.0048 (``scripts/side_by_side.py answers
--backend numpy``), so there it is a choice (``--backend numpy``, ``MGEO_INDEX_BACKEND=numpy``). Where the default is
FP32 ``torch`` the answers are the same (2,000 queries: 0 rankings, 0 labels, probabilities within 1e-6), and a
one-shot ``resolve`` uses it unasked (:func:`mgeo_index.runtime.plan.choose`). Built for a handful of queries:
batch throughput stays with the torch backends.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mgeo_index.model import bert_files
from mgeo_index.model.decision import Scoring
from mgeo_index.runtime.plan import LEVELS, MIN_FEATURES  # int8 by rows, as runtime/quant.py computes it

NUMERICS = {"int8-rows": "int8", "bf16-tiles": "bf16"}  # a plan's numerics → how Linear layers compute here; else fp32


def kind_of(plan) -> str:
    """How :class:`Linear` layers compute under ``plan`` (:class:`mgeo_index.runtime.plan.Plan`): int8, bf16 or fp32."""
    return NUMERICS.get(plan.numerics, "fp32")


def to_bf16(x: np.ndarray) -> np.ndarray:
    """FP32 values rounded to the nearest bfloat16 (ties to even), kept as FP32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


class Linear:
    """``x @ W.T + b`` computed as ``kind`` (``fp32``, ``int8`` or ``bf16``; layers narrower than
    ``MIN_FEATURES`` always FP32)."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, kind: str = "fp32"):
        self.kind = kind if min(weight.shape) >= MIN_FEATURES else "fp32"
        self.bias = np.zeros(weight.shape[0], np.float32) if bias is None else bias.astype(np.float32)
        if self.kind == "int8":
            scale = np.maximum(np.abs(weight).max(axis=1), np.float32(1e-12)) / np.float32(LEVELS)
            self.weight = np.ascontiguousarray(np.round(weight / scale[:, None]).T, dtype=np.float32)
            self.scale = scale.astype(np.float32)
        elif self.kind == "bf16":
            self.weight = np.ascontiguousarray(to_bf16(weight).T)
            self.bias = to_bf16(self.bias)
        else:
            self.weight = np.ascontiguousarray(weight.T, dtype=np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows = x.reshape(-1, x.shape[-1])
        if self.kind == "int8":
            row_scale = np.maximum(np.abs(rows).max(axis=1, keepdims=True), np.float32(1e-12)) / np.float32(LEVELS)
            out = np.round(rows / row_scale) @ self.weight  # exact: integers below 2**24
            out *= row_scale
            # torch's addcmul fuses the product and the sum (one rounding): exact in float64, then rounded once
            out = (self.bias.astype(np.float64) + out.astype(np.float64) * self.scale).astype(np.float32)
        elif self.kind == "bf16":
            out = to_bf16(to_bf16(rows) @ self.weight + self.bias)
        else:
            out = rows @ self.weight + self.bias
        return out.reshape(*x.shape[:-1], -1)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float64)
    centred = x - mean.astype(np.float32)
    variance = np.square(centred, dtype=np.float64).mean(axis=-1, keepdims=True)
    return centred * (1.0 / np.sqrt(variance + eps)).astype(np.float32) * weight + bias


def erf(x: np.ndarray) -> np.ndarray:
    """erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): the polynomial torch's vectorized CPU kernel uses."""
    t = np.float32(1.0) / (np.float32(0.3275911) * np.abs(x) + np.float32(1.0))
    r = (((np.float32(1.061405429) * t + np.float32(-1.453152027)) * t + np.float32(1.421413741)) * t
         + np.float32(-0.284496736)) * t + np.float32(0.254829592)
    return np.sign(x) * (np.float32(1.0) - r * t * np.exp(-x * x))


def gelu(x: np.ndarray) -> np.ndarray:
    return x * np.float32(0.5) * (np.float32(1.0) + erf(x * np.float32(0.7071067811865476)))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class Bert:
    """BERT's forward pass in NumPy: (B, T) ids → hidden states (B, T, H), or with ``classifier`` the pooled
    sequence-classification logits (B, labels)."""

    def __init__(self, path: str | Path, *, classifier: bool, kind: str = "fp32"):
        path = Path(path)
        self.config = c = bert_files.read_config(path)
        w = bert_files.read_weights(path)
        prefix = "bert." if any(name.startswith("bert.") for name in w) else ""
        get = lambda name: w[prefix + name]  # noqa: E731
        self.eps, self.heads, self.bf16 = c.layer_norm_eps, c.num_attention_heads, kind == "bf16"
        self.word, self.position = get("embeddings.word_embeddings.weight"), get("embeddings.position_embeddings.weight")
        self.token_type = get("embeddings.token_type_embeddings.weight")
        self.embedding_norm = get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias")
        linear = lambda name: Linear(get(name + ".weight"), get(name + ".bias"), kind)  # noqa: E731
        norm = lambda name: (get(name + ".weight"), get(name + ".bias"))  # noqa: E731
        self.layers = []
        for i in range(c.num_hidden_layers):
            at = f"encoder.layer.{i}."
            self.layers.append({
                "q": linear(at + "attention.self.query"), "k": linear(at + "attention.self.key"),
                "v": linear(at + "attention.self.value"), "o": linear(at + "attention.output.dense"),
                "o_norm": norm(at + "attention.output.LayerNorm"), "in": linear(at + "intermediate.dense"),
                "out": linear(at + "output.dense"), "out_norm": norm(at + "output.LayerNorm"),
            })
        self.pooler = linear("pooler.dense") if classifier else None
        self.classifier = Linear(w["classifier.weight"], w["classifier.bias"], kind) if classifier else None

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 token_type_ids: np.ndarray | None = None) -> np.ndarray:
        batch, width = input_ids.shape
        types = np.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        hidden = layer_norm(self.word[input_ids] + self.token_type[types] + self.position[:width],
                            *self.embedding_norm, self.eps)
        mask = None if attention_mask.all() else np.where(
            attention_mask[:, None, None, :].astype(bool), np.float32(0.0), np.finfo(np.float32).min)
        head_width = hidden.shape[-1] // self.heads
        split = lambda x: x.reshape(batch, width, self.heads, head_width).transpose(0, 2, 1, 3)  # noqa: E731
        for layer in self.layers:
            q, k, v = split(layer["q"](hidden)), split(layer["k"](hidden)), split(layer["v"](hidden))
            scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(head_width ** -0.5)
            if mask is not None:
                scores = scores + mask
            attended = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(batch, width, -1)
            hidden = layer_norm(layer["o"](attended) + hidden, *layer["o_norm"], self.eps)
            inner = gelu(layer["in"](hidden))
            if self.bf16:
                inner = to_bf16(inner)
            hidden = layer_norm(layer["out"](inner) + hidden, *layer["out_norm"], self.eps)
        if self.classifier is None:
            return hidden
        pooled = np.tanh(self.pooler(hidden[:, 0]))
        return self.classifier(to_bf16(pooled) if self.bf16 else pooled)


class FeatureHead:
    """The MLP feature head (``feature_head.safetensors``: Linear, ReLU, Linear, ReLU, Linear) in FP32."""

    def __init__(self, path: Path):
        from safetensors.numpy import load_file

        state = {name: value.astype(np.float32) for name, value in load_file(str(path)).items()}
        self.layers = [Linear(state[f"net.{i}.weight"], state[f"net.{i}.bias"]) for i in (0, 2, 4)]

    def __call__(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float32)
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else np.maximum(layer(x), 0)
        return x


class Network:
    """What both models here share: ``forward`` over NumPy inputs, and :meth:`outputs` of one batch, which
    :func:`mgeo_index.runtime.inference._run` cuts, tokenizes and puts back in order as it does for torch."""

    backend = "numpy"
    plan = None  # the plan it was loaded for (mgeo_index.model.loading sets it)
    tokenizer = None
    max_length: int

    def outputs(self, batch: dict, output: str, temperature: float) -> np.ndarray:
        """One tokenized batch's ``normalized`` rows (as torch.nn.functional.normalize), ``logits`` or
        ``probabilities`` (softmax at ``temperature``)."""
        result = self.forward(**batch)
        if output == "normalized":
            return result / np.maximum(np.linalg.norm(result, axis=1, keepdims=True), np.float32(1e-12))
        if output == "probabilities":
            return self._softmax(result, temperature)
        return result

    def _softmax(self, logits: np.ndarray, temperature: float) -> np.ndarray:
        """Row softmax of ``logits / temperature`` (the cross-encoder's, for :class:`Scoring` too)."""
        return softmax(np.asarray(logits, dtype=np.float32) / np.float32(temperature), axis=1)


class BiEncoder(Network):
    """A bi-encoder directory computed by :class:`Bert` (mean or CLS pooling, an optional projection)."""

    def __init__(self, path: str | Path, kind: str):
        from mgeo_index.model.manifest import fingerprint, read_bi_manifest
        from mgeo_index.model.tokenizer import load_tokenizer

        path = Path(path)
        spec = read_bi_manifest(path)
        self.tokenizer = load_tokenizer(path)
        self.runner = Bert(path, classifier=False, kind=kind)
        self.pooling, self.max_length = spec["pooling"], spec["max_length"]
        self.projection = None
        if spec["projection_dim"]:
            from safetensors.numpy import load_file

            state = load_file(str(path / "projection.safetensors"))
            # the int8 backend quantizes every Linear of the model; bf16 only the transformer's
            self.projection = Linear(state["weight"].astype(np.float32), state["bias"].astype(np.float32),
                                     "int8" if kind == "int8" else "fp32")
        self.dim = spec["projection_dim"] or self.runner.config.hidden_size
        self.fingerprint = fingerprint(path)
        self.path = str(path.resolve())

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids=None) -> np.ndarray:
        hidden = self.runner(input_ids, attention_mask, token_type_ids)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask[:, :, None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), np.float32(1.0))
        return pooled if self.projection is None else self.projection(pooled)


class CrossEncoder(Network, Scoring):
    """A cross-encoder directory computed by :class:`Bert` and :class:`FeatureHead`, with the label logic of
    :class:`~mgeo_index.model.decision.Scoring` (stack, cascade, offsets, number policy, the group head: read when
    ``match`` first asks for it, as the torch model does)."""

    def __init__(self, path: str | Path, kind: str):
        from mgeo_index.model.manifest import ModelError, fingerprint, read_cross_manifest
        from mgeo_index.model.tokenizer import load_tokenizer

        path = Path(path)
        read = read_cross_manifest(path)
        self.labels, self.max_length, self.temperature = read["labels"], read["max_length"], read["temperature"]
        self.tokenizer = load_tokenizer(path)
        self.runner = Bert(path, classifier=True, kind=kind)
        self.stack, self.gate, self.feature_head = read["stack"], read["gate"], None
        if self.stack is not None:
            if not (path / "feature_head.safetensors").exists():
                raise ModelError(f"{path}: the numpy backend runs feature heads of MLPs only; this model has trees: "
                                 "use another --backend")
            self.feature_head = FeatureHead(path / "feature_head.safetensors")
        self.decision_offsets, self.number_policy = read["decision_offsets"], read["number_policy"]
        if read["group_head"] is not None:
            from mgeo_index.model.group_head import attach

            attach(self, path, read["group_head"])
        self.fingerprint = fingerprint(path)
        self.path = str(path.resolve())

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids=None) -> np.ndarray:
        return self.runner(input_ids, attention_mask, token_type_ids)

    def head_logits(self, features: np.ndarray) -> np.ndarray:
        return self.feature_head(features)


def computes(path: str | Path) -> bool:
    """Whether this backend computes the model in ``path``: a BERT as :func:`mgeo_index.model.bert_files.supports`
    says, whose feature head, if any, is of MLPs (not trees)."""
    path = Path(path)
    try:
        config = bert_files.read_config(path)
    except (OSError, ValueError):
        return False
    return bert_files.supports(config) and not (path / "feature_head.lgb.txt").exists()
