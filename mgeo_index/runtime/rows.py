"""A linear layer whose result for a row does not depend on how many rows it is given.

On the CPU, PyTorch's FP32 ``linear`` (MKL's sgemm) takes another path for a few rows than for many, and its sums
come out in another order: measured on a 2-core AVX2 EPYC, every shape the shipped networks use (256 → 768, 256 →
1,024, 1,024 → 256, 384 → 1,536 …) gave other bits for 1–3 rows on one thread and for 1–11 rows (but 4 and 8) on
two, and the same bits for every count from 12 to 4,096. A cross-encoder's pooler and classifier, and the feature
head, see one row per pair, so a query scored with few pairs (one query with a small pool, or the few candidates
the network judges) got other bits than in a batch. :class:`Linear` gives a call of fewer than ``MIN_ROWS`` rows
zero rows up to ``MIN_ROWS`` and keeps the first ones: the same bits as in any larger batch
(``tests/test_inference.py``). It is an ``nn.Linear`` (the int8 and bf16 backends replace it as one; their own
products are by rows), and traced or compiled it is plain ``linear`` (an exported graph keeps its dynamic batch).
"""
from __future__ import annotations

import torch
from torch import nn

MIN_ROWS = 16


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1]
        rows = x.numel() // width if width else 0
        if rows == 0 or rows >= MIN_ROWS or x.device.type != "cpu" or torch.jit.is_tracing() \
                or torch.compiler.is_compiling():
            return super().forward(x)
        flat = x.reshape(rows, width)
        padded = torch.cat([flat, flat.new_zeros(MIN_ROWS - rows, width)])
        return super().forward(padded)[:rows].reshape(*x.shape[:-1], self.out_features)
