"""BERT for inference as plain torch modules: what the shipped encoders run, without importing ``transformers``.

Reads a Hugging Face BERT directory as it is saved (``config.json``, ``model.safetensors`` with the same
parameter names) and computes what ``transformers``' ``BertModel`` / ``BertForSequenceClassification`` compute
in evaluation mode, operation for operation (embeddings summed in the same order, post-LayerNorm residuals,
erf GELU, tanh pooler), so a CPU run gives the same bits as theirs with :mod:`mgeo_index.runtime.attention`.
Importing ``transformers`` costs about 4 s of a one-shot ``resolve``; torch alone is what these need.

Attention is :func:`mgeo_index.runtime.attention.attention` (the same bits whatever the batch's padded width)
unless :func:`mgeo_index.runtime.attention.use_fused` switches a model to PyTorch's fused kernel (CUDA: FP16
flash / memory-efficient attention).
Training, and checkpoints of other architectures, use ``transformers`` (:func:`supports` says which load here).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mgeo_index.model.bert_files import SCALE_SUFFIX, WEIGHTS, Config, read_config, supports  # noqa: F401  (re-exported)
from mgeo_index.model import bert_files
from mgeo_index.runtime import attention, rows

_ACTIVATIONS = {"gelu": F.gelu}  # bert_files.ACTIVATIONS, as torch functions
DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Output:
    """What the HF models return, as far as this package reads it."""

    last_hidden_state: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class Embeddings(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(embeddings + self.position_embeddings(positions))


class SelfAttention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_width = config.hidden_size // config.num_attention_heads
        self.query = rows.Linear(config.hidden_size, config.hidden_size)
        self.key = rows.Linear(config.hidden_size, config.hidden_size)
        self.value = rows.Linear(config.hidden_size, config.hidden_size)
        self.fused = False  # use_fused: PyTorch's scaled_dot_product_attention

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # hidden (B, T, H); mask additive (B, 1, 1, T) or None → (B, T, H)
        shape = (*hidden.shape[:-1], -1, self.head_width)
        query, key, value = (layer(hidden).view(*shape).transpose(1, 2) for layer in (self.query, self.key, self.value))
        if self.fused:
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=None if mask is None else mask.to(query.dtype))
            out = out.transpose(1, 2)
        else:
            out, _ = attention.attention(self, query, key, value, mask, scaling=self.head_width ** -0.5)
        return out.reshape(*hidden.shape[:-1], -1).contiguous()


class DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: BERT's attention output and feed-forward output."""

    def __init__(self, width_in: int, config: Config):
        super().__init__()
        self.dense = rows.Linear(width_in, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden) + residual)


class AttentionBlock(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.self = SelfAttention(config)
        self.output = DenseNorm(config.hidden_size, config)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(hidden, mask), hidden)


class Intermediate(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.dense = rows.Linear(config.hidden_size, config.intermediate_size)
        self.activation = _ACTIVATIONS[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden))


class Layer(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.attention = AttentionBlock(config)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        attended = self.attention(hidden, mask)
        return self.output(self.intermediate(attended), attended)


class Encoder(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, mask)
        return hidden


class Pooler(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.dense = rows.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


def additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, T) 1/0 → (B, 1, 1, T) with 0 where attended and the dtype's lowest value where padded; None when
    nothing is padded (as ``transformers`` passes it)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    keep = attention_mask[:, None, None, :].bool()
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)


class Transformer(nn.Module):
    """What the two models below share: the config, saving in the Hugging Face layout."""

    config: Config

    def save_pretrained(self, path: str | Path) -> None:
        """``config.json`` and ``model.safetensors`` under the same names ``transformers`` reads."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()}
        dtype = next(iter(state.values())).dtype
        values = {**self.config.values, "dtype": str(dtype).removeprefix("torch.")}
        (path / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        save_file(state, path / "model.safetensors", metadata={"format": "pt"})


class Bert(Transformer):
    """``BertModel`` without its pooler: (B, T) ids → ``Output(last_hidden_state=(B, T, H))``."""

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> Output:
        hidden = self.embeddings(input_ids, token_type_ids)
        return Output(last_hidden_state=self.encoder(hidden, additive_mask(attention_mask, hidden.dtype)))


class _BertWithPooler(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config)


class BertClassifier(Transformer):
    """``BertForSequenceClassification``: (B, T) ids → ``Output(logits=(B, labels))``."""

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.bert = _BertWithPooler(config)
        self.classifier = rows.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> Output:
        hidden = self.bert.embeddings(input_ids, token_type_ids)
        hidden = self.bert.encoder(hidden, additive_mask(attention_mask, hidden.dtype))
        return Output(logits=self.classifier(self.bert.pooler(hidden)))


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """:func:`mgeo_index.model.bert_files.read_weights` as FP32 tensors."""
    return {name: torch.from_numpy(array) for name, array in bert_files.read_weights(path).items()}


def int8_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` for storage with its Linear weights (2-d, at least 16 wide both ways, not embeddings) in int8 per
    output channel, the scheme the ``int8`` backend computes with (:func:`mgeo_index.runtime.quant.quantize_weight`): on that
    backend the network computes as from the FP16 file; half the bytes. Everything else FP16."""
    from mgeo_index.runtime import quant

    out = {}
    for name, tensor in state.items():
        if tensor.dim() == 2 and "embeddings" not in name and min(tensor.shape) >= quant.MIN_FEATURES:
            weight, scale = quant.quantize_weight(tensor)
            out[name], out[name + SCALE_SUFFIX] = weight.t().contiguous(), scale.float().contiguous()
        else:
            out[name] = tensor.detach().half().contiguous()
    return out


def load(path: str | Path, *, classifier: bool) -> Transformer:
    """The BERT in ``path`` (:func:`supports` its config), FP32, in evaluation mode (:func:`read_weights`)."""
    path = Path(path)
    config = read_config(path)
    # (built on the CPU: initializing on the meta device would import torch._dynamo, 1.2 s; the random weights
    # are dropped when the file's are assigned)
    model = BertClassifier(config) if classifier else Bert(config)
    stored = read_weights(path)
    state = {}
    for name in model.state_dict():
        source = name if name in stored else _unprefixed(name, stored.keys())
        if source is None:
            from mgeo_index.model.manifest import ModelError

            what = "sequence-classification model" if classifier else "BERT encoder"
            raise ModelError(f"{path / WEIGHTS} has no weight {name}: it is not a {what}")
        state[name] = stored[source]
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def load_network(path: str | Path, *, classifier: bool, trainable: bool = False) -> nn.Module:
    """The network of a model directory, FP32: a plain module (:func:`load`) where :func:`supports` its config and
    it is not to be trained; otherwise the ``transformers`` model (training: dropout, gradient-friendly attention;
    other architectures). ``classifier``: the sequence-classification model, else the encoder without pooler."""
    if not trainable and supports(read_config(path)):
        return load(path, classifier=classifier)
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    from mgeo_index.model.manifest import quiet_transformers

    quiet_transformers()
    if _has_int8(path):  # transformers reads FP16 / FP32 files only: build the model, then assign the weights
        config = AutoConfig.from_pretrained(path)
        model = (AutoModelForSequenceClassification.from_config(config, dtype=torch.float32) if classifier
                 else AutoModel.from_config(config, add_pooling_layer=False, dtype=torch.float32))
        missing, unexpected = model.load_state_dict(read_weights(path), strict=False)
        if unexpected or [name for name in missing if not name.endswith("position_ids")]:
            from mgeo_index.model.manifest import ModelError

            raise ModelError(f"{path / WEIGHTS} does not fit its config.json: missing {missing}, unexpected {unexpected}")
        return model.float()
    if classifier:
        return AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    return AutoModel.from_pretrained(path, dtype=torch.float32, add_pooling_layer=False)


def _has_int8(path: str | Path) -> bool:
    from safetensors import safe_open

    with safe_open(Path(path) / WEIGHTS, framework="pt") as weights:
        return any(name.endswith(SCALE_SUFFIX) for name in weights.keys())


def _unprefixed(name: str, names) -> str | None:
    """A BertModel checkpoint saved with a ``bert.`` prefix (from a pre-training head) or without one."""
    for candidate in (name.removeprefix("bert."), "bert." + name):
        if candidate in names:
            return candidate
    return None
