"""Reduced-precision Linear layers whose results do not depend on batch-mates: the ``int8`` and ``bf16`` backends.

**int8 by rows.** Weights are quantized once, symmetrically per output channel; activations per row (one token,
one address), symmetrically, from that row's own largest magnitude. The products are summed exactly in
int32 (``torch._int_mm``: oneDNN's VNNI kernels where the CPU has them), so a row's result is the same
bits whatever rows it is computed with, in whatever order: int8 speed with FP32's batch independence.
(``torch.ao``'s dynamic quantization, used before, scaled activations per batch, so a pair's probability
moved by about 1e-3 with its batch-mates; it is deprecated in this torch.)
Rows are processed ``ROWS`` at a time so that the temporaries stay small: on the shipped cross-encoder's
forward pass over 50 pairs (2,050 tokens, one thread) that was 1.25x faster than one pass over the batch, and
the whole is 1.8x FP32 (``torch.ao``'s per-batch int8, fbgemm, fusing its quantization: 2.2x).

**bf16 in fixed tiles.** Weights are cast to bfloat16 once; activations are multiplied in bfloat16 with FP32
sums (AMX tiles where the CPU has them: 28x an FP32 GEMM of the model's shapes on an AMX core, 3.3x int8),
``TILE_ROWS`` rows per call, the last tile padded with zero rows. oneDNN picks its kernel, and so the order of
its FP32 sums, by the GEMM's shape: the 1,024 → 256 layer gave other bits for 64–200 rows than for 32 or 256
and more, so a row's result moved with its batch-mates (1e-3 on a probability under plain bf16 autocast).
Every call here has the same shape, whatever the batch, so a row gets the same bits in any batch. Outputs stay
bfloat16 (the GELU runs on them; adding the FP32 residual brings them back to FP32, so the residual stream and
LayerNorm stay FP32); attention converts them to FP32 (:mod:`mgeo_index.runtime.attention`: bf16 batched matmuls have
the same shape dependence), and layers narrower than ``MIN_FEATURES`` (the 3-label classifier) take FP32.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from mgeo_index.runtime.plan import LEVELS, MIN_FEATURES  # noqa: F401  (int8 by rows: the NumPy executor's too)

ROWS = 512
TILE_ROWS = 256  # bf16: one fixed GEMM shape; 128 rows were 1.1x slower on batches, 512 1.3x slower on one address


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


def _int8(layer: nn.Linear) -> nn.Module | None:
    return Int8Linear(layer) if min(layer.in_features, layer.out_features) >= MIN_FEATURES else None


def quantize_linears(module: nn.Module, keep: list[nn.Module] = ()) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` of ``module`` at least ``MIN_FEATURES`` wide both ways by an
    :class:`Int8Linear`, but those inside ``keep``; returns ``module``."""
    return _replace_linears(module, _int8, keep)


def quantized_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with :func:`quantize_linears` applied (``module`` unchanged)."""
    return replaced_copy(module, _int8)


def _replace_linears(module: nn.Module, replace, keep: list[nn.Module] = ()) -> nn.Module:
    kept = {id(part) for whole in keep for part in whole.modules()}
    for parent in list(module.modules()):
        if id(parent) in kept:
            continue
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and (new := replace(child)) is not None:
                setattr(parent, name, new)
    return module


def replaced_copy(module: nn.Module, replace, parts: list[nn.Module] | None = None) -> nn.Module:
    """A deep copy of ``module`` in which each ``nn.Linear`` (of ``parts``, default all of it) is ``replace(layer)``
    where that is not None, made without copying the replaced layers first (an FP32 copy of every weight, only
    to be dropped: 14 MB of a one-shot command's peak per shipped network)."""
    memo: dict[int, object] = {}
    for part in parts if parts is not None else [module]:
        for layer in part.modules():
            if isinstance(layer, nn.Linear) and (new := replace(layer)) is not None:
                memo[id(layer)] = new
    return copy.deepcopy(module, memo)


def bf16_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x @ W.T + bias`` in bfloat16 (FP32 sums) for ``x`` [..., in], a bfloat16 ``weight`` [out, in] and
    ``bias`` [out], in tiles of exactly ``TILE_ROWS`` rows (the last padded with zeros), so every GEMM has one
    shape; bfloat16 out."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    count, full = rows.shape[0], rows.shape[0] - rows.shape[0] % TILE_ROWS
    if full < count:  # the tail, padded: a copy of fewer than TILE_ROWS rows, not of the whole batch
        tail = rows.new_zeros(TILE_ROWS, rows.shape[1])
        tail[: count - full] = rows[full:]
    out = torch.empty(full + (TILE_ROWS if full < count else 0), weight.shape[0], dtype=torch.bfloat16)
    transposed = weight.t()
    for start in range(0, out.shape[0], TILE_ROWS):
        tile = rows[start : start + TILE_ROWS] if start < full else tail
        torch.addmm(bias, tile, transposed, out=out[start : start + TILE_ROWS])
    return out[:count].view(*x.shape[:-1], weight.shape[0])


class Bf16Linear(nn.Module):
    """An ``nn.Linear`` computed by :func:`bf16_matmul` (inference only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16).contiguous())
        bias = torch.zeros(linear.out_features) if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias.to(torch.bfloat16).clone())  # a zero bias adds exactly nothing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bf16_matmul(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 tiles of {TILE_ROWS} rows"


class Float32Input(nn.Module):
    """A narrow FP32 layer behind bfloat16 ones: casts its input to FP32 first."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.float())


def _bf16(layer: nn.Linear) -> nn.Module:
    wide = min(layer.in_features, layer.out_features) >= MIN_FEATURES
    return Bf16Linear(layer) if wide else Float32Input(copy.deepcopy(layer))


def bf16_linears(module: nn.Module) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` of ``module`` at least ``MIN_FEATURES`` wide both ways by a
    :class:`Bf16Linear` and wrap the narrower ones in :class:`Float32Input`; returns ``module``."""
    return _replace_linears(module, _bf16)


def bf16_copy(module: nn.Module, parts: list[nn.Module]) -> nn.Module:
    """A copy of ``module`` with :func:`bf16_linears` applied to ``parts`` of it (``module`` unchanged)."""
    return replaced_copy(module, _bf16, parts)
