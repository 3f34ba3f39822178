"""The Triton kernels behind :mod:`mgeo_index.runtime.kernels` (which imports this module only when a launch may
happen: a CUDA tensor, or ``TRITON_INTERPRET=1`` for the CPU interpreter; importing triton costs about 90 MB
and 0.1 s that a CPU run never needs).

``@triton.jit`` decides at *definition* time, i.e. when this module is imported, whether a kernel runs on the
interpreter, so ``TRITON_INTERPRET=1`` must be in the environment before triton is first imported for CPU
tensors to use them. Each kernel processes a ``BLOCK_ROWS x BLOCK_COLS`` tile per program, ``BLOCK_COLS`` the
next power of two ``>= D`` with the tail columns masked; arithmetic is fp32 whatever the storage dtype.
"""
from __future__ import annotations

from typing import Any

try:  # Guarded: the module must import (and the torch path work) without triton.
    import triton
    import triton.language as tl

    IMPORT_ERROR: BaseException | None = None
except Exception as exc:  # pragma: no cover - exercised only where triton is absent
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    IMPORT_ERROR = exc


if triton is not None:

    @triton.jit
    def l2_normalize_kernel(
        x_ptr,
        y_ptr,
        n_rows,
        n_cols,
        stride_x_row,
        stride_y_row,
        eps,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        """y[r, :] = x[r, :] / max(||x[r, :]||_2, eps) for a tile of BLOCK_ROWS rows."""
        pid = tl.program_id(0)
        rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_COLS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        # 64-bit row offsets: rows * stride can exceed 2**31 for large matrices.
        rows64 = rows.to(tl.int64)
        x = tl.load(x_ptr + rows64[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        norm = tl.sqrt(tl.sum(x * x, axis=1))
        # Masked columns were loaded as 0 so they do not contribute; an all-zero row
        # gives norm 0 -> denominator eps -> output 0 (no NaN).
        denom = tl.maximum(norm, eps)
        y = x / denom[:, None]
        tl.store(
            y_ptr + rows64[:, None] * stride_y_row + cols[None, :],
            y.to(y_ptr.dtype.element_ty),
            mask=mask,
        )

    @triton.jit
    def softmax_kernel(
        x_ptr,
        y_ptr,
        n_rows,
        n_cols,
        stride_x_row,
        stride_y_row,
        temperature,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        """y[r, :] = softmax(x[r, :] / temperature) for a tile of BLOCK_ROWS rows."""
        pid = tl.program_id(0)
        rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        cols = tl.arange(0, BLOCK_COLS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        rows64 = rows.to(tl.int64)
        # Padding lanes load -inf so they vanish from both the max and the sum.
        x = tl.load(
            x_ptr + rows64[:, None] * stride_x_row + cols[None, :], mask=mask, other=float("-inf")
        )
        z = x.to(tl.float32) / temperature
        row_max = tl.max(z, axis=1)
        # Rows past the end are all -inf; give them a finite max/sum so no NaNs are
        # computed (they are never stored anyway).
        row_max = tl.where(row_mask, row_max, 0.0)
        num = tl.exp(z - row_max[:, None])
        den = tl.sum(num, axis=1)
        den = tl.where(row_mask, den, 1.0)
        y = num / den[:, None]
        tl.store(
            y_ptr + rows64[:, None] * stride_y_row + cols[None, :],
            y.to(y_ptr.dtype.element_ty),
            mask=mask,
        )

    def _is_interpreted(fn: Any) -> bool:
        return type(fn).__name__ == "InterpretedFunction"

    # jit picks interpreter vs. compiled mode when the decorator runs; remember which.
    INTERPRETED: bool = _is_interpreted(l2_normalize_kernel)
    # The interpreter also needs triton's own library functions (tl.max, tl.sum are
    # @jit functions defined when triton is first imported) to be interpreted: if
    # triton was imported before TRITON_INTERPRET=1 was set, nothing can launch.
    INTERPRETER_USABLE: bool = INTERPRETED and _is_interpreted(tl.max)
else:  # pragma: no cover
    l2_normalize_kernel = None
    softmax_kernel = None
    INTERPRETED = False
    INTERPRETER_USABLE = False
