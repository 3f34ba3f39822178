"""Int8 arithmetic whose results do not depend on batch-mates: the ``int8`` backend's Linear layers.

Weights are quantized once, symmetrically per output channel; activations per row (one token, one
address), symmetrically, from that row's own largest magnitude. The products are summed exactly in
int32 (``torch._int_mm``: oneDNN's VNNI kernels where the CPU has them), so a row's result is the same
bits whatever rows it is computed with, in whatever order: int8 speed with FP32's batch independence.
(``torch.ao``'s dynamic quantization, used before, scaled activations per batch, so a pair's probability
moved by about 1e-3 with its batch-mates; it is deprecated in this torch.)

Rows are processed ``ROWS`` at a time so that the temporaries stay small: on the shipped cross-encoder's
forward pass over 50 pairs (2,050 tokens, one thread) that was 1.25x faster than one pass over the batch, and
the whole is 1.8x FP32 (``torch.ao``'s per-batch int8, fbgemm, fusing its quantization: 2.2x).
"""
from __future__ import annotations

import torch
from torch import nn

ROWS = 512
LEVELS = 127.0  # symmetric int8: -127 … 127
MIN_FEATURES = 16  # narrower Linear layers (a 3-label classifier) stay FP32: they cost nothing


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [in, out], FP32 scale [out]) of a Linear weight [out, in], one scale per output channel."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / LEVELS
    return torch.round(weight / scale[:, None]).to(torch.int8).t().contiguous(), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, FP32 scale [rows, 1]) of a 2-d FP32 tensor, one scale per row (all-zero rows give zeros)."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(LEVELS)
    return torch.div(x, scale).round_().to(torch.int8), scale


def matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for FP32 ``x`` [..., in] and a :func:`quantize_weight` pair, in int8 by rows."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty(rows.shape[0], weight.shape[1], dtype=torch.float32)
    for start in range(0, rows.shape[0], ROWS):
        q, row_scale = quantize_rows(rows[start : start + ROWS].float())
        part = out[start : start + ROWS]
        part.copy_(torch._int_mm(q, weight))  # int32 → FP32 alone, then FP32 products: 1.3x faster than a mixed-type
        part.mul_(row_scale)  # multiply, and a [rows, 1] factor then [out] is 5x faster than their [rows, out] product
        if bias is None:
            part.mul_(scale)
        else:
            torch.addcmul(bias, part, scale, out=part)
    return out.reshape(*x.shape[:-1], weight.shape[1])


class Int8Linear(nn.Module):
    """An ``nn.Linear`` computed by :func:`matmul` (inference only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = quantize_weight(linear.weight)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return matmul(x, self.weight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 rows"


def quantize_linears(module: nn.Module) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` of ``module`` at least ``MIN_FEATURES`` wide both ways by an
    :class:`Int8Linear`; returns ``module``."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and min(child.in_features, child.out_features) >= MIN_FEATURES:
                setattr(parent, name, Int8Linear(child))
    return module
