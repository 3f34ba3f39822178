"""Self-attention whose result for a sequence does not depend on how wide its batch is padded.

PyTorch's fused CPU attention (``scaled_dot_product_attention``) blocks its reductions over the keys by the
batch's padded width, so a sequence's hidden states move in their last bits with the lengths of its batch-mates
(FP32: up to 2.4e-7 on a probability). Int8 by rows (:mod:`mgeo_index.runtime.quant`) then rounds an activation the
other way now and then, and the move grows: scoring 1,500 CCKS dev pairs in one call and again in two halves
moved 1.6% of the network's probabilities by more than 1e-6, up to 3.9e-3 (vectors: 2.7% of addresses, up to
6.8e-4). Here the keys are padded to the next multiple of ``KEY_BLOCK`` (masked, so their weights are exactly 0)
and attention is the plain matmul → softmax → matmul, whose reductions then see the same values in the same
places whatever the batch's width: the same bits alone or in any batch (``tests/test_attention.py``), at about
the fused kernel's speed at address lengths.

:mod:`mgeo_index.model.bert`'s plain modules attend with it; :func:`use` switches a ``transformers`` model to it; :func:`mgeo_index.runtime.backends.apply` does so for every CPU
backend that runs the module itself (``torch``, ``bf16``, ``compile``, ``int8``).
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

NAME = "mgeo_index_blocked_keys"
KEY_BLOCK = 16  # 16 FP32 lanes of an AVX-512 register; widths that are multiples of it gave identical bits


def attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
              scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """``softmax(q kᵀ · scaling + mask) v`` over keys padded to a multiple of ``KEY_BLOCK``; the signature of
    ``transformers``' attention functions (``query`` / ``key`` / ``value``: batch, heads, positions, head width;
    ``attention_mask``: additive, or None without padding). Returns (batch, positions, heads, head width)."""
    if query.dtype == torch.bfloat16:  # the bf16 backend's projections: attend in FP32, whose sums keep their order
        query, key, value = query.float(), key.float(), value.float()  # (bf16 batched matmuls' move with the shape)
    batch, _, width, head_width = key.shape
    scaling = head_width ** -0.5 if scaling is None else scaling
    low = torch.finfo(query.dtype).min
    if attention_mask is None:
        attention_mask = torch.zeros(batch, 1, 1, width, dtype=query.dtype, device=query.device)
    elif attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros_like(attention_mask, dtype=query.dtype).masked_fill_(~attention_mask, low)
    pad = -width % KEY_BLOCK
    if pad:
        key, value = F.pad(key, (0, 0, 0, pad)), F.pad(value, (0, 0, 0, pad))
        attention_mask = F.pad(attention_mask, (0, pad), value=low)
    weights = torch.softmax(torch.matmul(query, key.transpose(2, 3)) * scaling + attention_mask, dim=-1)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, eager_mask)  # an additive float mask, None where nothing is padded


def use(model: torch.nn.Module) -> torch.nn.Module:
    """Make the transformer inside ``model`` attend with :func:`attention`: the plain modules of
    :mod:`mgeo_index.model.bert` (their own default), or a ``transformers`` model (its outermost one)."""
    use_fused(model, False)
    hf = sys.modules.get("transformers")  # a transformers model exists only where transformers was imported
    for part in model.modules():
        if hf is not None and isinstance(part, hf.PreTrainedModel):
            _register()
            part.set_attn_implementation(NAME)
            break
    return model


def use_fused(model: torch.nn.Module, fused: bool = True) -> torch.nn.Module:
    """Attend with PyTorch's fused ``scaled_dot_product_attention`` (``fused``: CUDA's FP16 kernels, the ONNX graph)
    or with :func:`attention`, in every attention layer of :mod:`mgeo_index.model.bert` inside ``model`` (those with
    a ``fused`` switch)."""
    for part in model.modules():
        if hasattr(part, "fused"):
            part.fused = fused
    return model


def is_transformer(module: torch.nn.Module) -> bool:
    """A transformer network: a model that has a config and saves in the Hugging Face layout (the plain BERTs of
    :mod:`mgeo_index.model.bert` and ``transformers`` models alike)."""
    return hasattr(module, "config") and callable(getattr(module, "save_pretrained", None))
