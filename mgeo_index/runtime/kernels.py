"""Row-wise kernels used on the embedding path, behind one dispatch point.

Two operations are provided, each with a Triton kernel and a torch reference:

* :func:`l2_normalize` -- ``x / max(||x||_2, eps)`` per row (the same formula as
  :func:`torch.nn.functional.normalize`), optionally writing the result in another
  dtype (e.g. a fused fp32 -> fp16 cast for the index).
* :func:`softmax` -- ``softmax(x / T)`` per row with max subtraction for stability.

Both work on 2-D tensors ``(rows, D)``; the Triton kernels process a tile of
``BLOCK_ROWS x BLOCK_COLS`` per program, where ``BLOCK_COLS`` is the next power of two
``>= D`` and the tail columns are masked, so any width works. Arithmetic is fp32
inside the kernels whatever the storage dtype (fp16, bf16 or fp32).

Backend selection (``backend=``):

* ``"auto"``   -- Triton when the tensor is on CUDA, or when ``TRITON_INTERPRET=1``
  (the Triton CPU interpreter, for tests) was set before triton was imported;
  torch otherwise (and always torch when triton is not installed).
* ``"triton"`` -- force Triton; raises ``ImportError`` (triton missing) or
  ``RuntimeError`` (no way to launch for this tensor) with an explanation.
* ``"torch"``  -- force the torch reference implementation.

The Triton kernels live in :mod:`mgeo_index.runtime.triton_kernels`, imported (guarded: this
module works where triton is missing) only when a launch may happen. ``@triton.jit``
decides at *definition* time whether a kernel runs on the interpreter, so
``TRITON_INTERPRET=1`` must be in the environment before triton is first imported for
CPU tensors to be able to use the Triton path.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Literal

import torch
import torch.nn.functional as F

__all__ = [
    "Backend",
    "available_backends",
    "l2_normalize",
    "softmax",
    "torch_l2_normalize",
    "torch_softmax",
    "triton_available",
]

Backend = Literal["auto", "triton", "torch"]

# Triton's CPU interpreter is not thread-safe (a build encodes batches on several threads: two launches at
# once failed inside the interpreter), so its launches are serialized; GPU launches are not.
_INTERPRETER_LOCK = threading.Lock()

#: Same default as ``torch.nn.functional.normalize``.
DEFAULT_EPS = 1e-12

#: Storage dtypes the Triton kernels accept for input and output.
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Widest row the Triton kernels handle (one row must fit in a single tile); wider
#: rows fall back to torch under ``backend="auto"``.
MAX_TRITON_COLS = 32768

# Tile budget (elements per program). On GPU this keeps the tile in registers; under
# the interpreter every program is a Python-level step, so bigger tiles (fewer
# programs) are much faster.
_GPU_TILE_ELEMS = 8192
_INTERPRETER_TILE_ELEMS = 65536
_MAX_BLOCK_ROWS = 64

_TRITON_INSTALL_HINT = (
    "The Triton backend needs the 'triton' package (pip install 'mgeo-index[gpu]'; it ships "
    "with CUDA builds of torch on Linux). Use backend='torch' to run without it."
)

def _interpret_env() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set right now."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _triton():
    """:mod:`mgeo_index.runtime.triton_kernels`, imported on first need (see its docstring)."""
    from mgeo_index.runtime import triton_kernels

    return triton_kernels


# --------------------------------------------------------------------------------------
# Torch reference implementations
# --------------------------------------------------------------------------------------


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half-precision storage, the input dtype otherwise (fp32/fp64)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def torch_l2_normalize(
    x: torch.Tensor, *, out_dtype: torch.dtype | None = None, eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """Reference row L2 normalization (computed in >= fp32, then cast to ``out_dtype``)."""
    _check_input(x)
    out_dtype = out_dtype or x.dtype
    y = F.normalize(x.to(_compute_dtype(x.dtype)), p=2.0, dim=1, eps=eps)
    return y.to(out_dtype)


def torch_softmax(x: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Reference row softmax of ``x / temperature`` (computed in >= fp32, output in x.dtype)."""
    _check_input(x)
    _check_temperature(temperature)
    z = x.to(_compute_dtype(x.dtype)) / temperature
    return torch.softmax(z, dim=1).to(x.dtype)


# --------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------


def triton_available() -> bool:
    """Whether the ``triton`` package imported successfully (importing it, if nothing did yet)."""
    return _triton().triton is not None


def _triton_launchable(x: torch.Tensor) -> bool:
    """Whether the Triton kernels can be launched on this tensor's device (a CPU tensor without
    ``TRITON_INTERPRET=1`` never imports triton)."""
    if x.is_cuda:
        kernels = _triton()
        # Compiled kernels, or (interpreter mode) a working interpreter.
        return kernels.triton is not None and (not kernels.INTERPRETED or kernels.INTERPRETER_USABLE)
    # CPU tensors only run on the interpreter, which must have been active when triton
    # and the kernels were imported (and still be requested now).
    if x.device.type != "cpu" or not _interpret_env():
        return False
    kernels = _triton()
    return kernels.triton is not None and kernels.INTERPRETER_USABLE


def available_backends() -> list[str]:
    """Backends usable in this process: always ``"torch"``; ``"triton"`` when triton is
    installed and either CUDA is available or the kernels run on the interpreter."""
    names = ["torch"]
    if not (torch.cuda.is_available() or _interpret_env()):
        return names
    kernels = _triton()
    if kernels.triton is not None and (
        (torch.cuda.is_available() and (not kernels.INTERPRETED or kernels.INTERPRETER_USABLE))
        or (kernels.INTERPRETER_USABLE and _interpret_env())
    ):
        names.append("triton")
    return names


def _check_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"expected a 2-D tensor (rows, dim), got shape {tuple(x.shape)}; "
            "use x.unsqueeze(0) for a single row"
        )
    if not x.is_floating_point():
        raise TypeError(f"expected a floating-point tensor, got {x.dtype}")


def _check_temperature(temperature: float) -> None:
    t = float(temperature)
    if not (t > 0.0 and t != float("inf")):
        raise ValueError(f"temperature must be a finite positive number, got {temperature!r}")


def _resolve_backend(x: torch.Tensor, backend: str, out_dtype: torch.dtype) -> str:
    """Pick ``"triton"`` or ``"torch"`` for this call, raising for impossible requests."""
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "torch":
        return "torch"
    triton_ok = (
        x.dtype in _TRITON_DTYPES and out_dtype in _TRITON_DTYPES and x.shape[1] <= MAX_TRITON_COLS
    )
    if backend == "auto":
        return "triton" if triton_ok and _triton_launchable(x) else "torch"
    # backend == "triton": explain precisely why it cannot run.
    kernels = _triton()
    if kernels.triton is None:
        raise ImportError(f"triton could not be imported ({kernels.IMPORT_ERROR}). {_TRITON_INSTALL_HINT}")
    if x.dtype not in _TRITON_DTYPES or out_dtype not in _TRITON_DTYPES:
        raise RuntimeError(
            f"Triton backend supports float32/float16/bfloat16, got input {x.dtype} and "
            f"output {out_dtype}; use backend='torch'"
        )
    if x.shape[1] > MAX_TRITON_COLS:
        raise RuntimeError(
            f"Triton backend handles rows of at most {MAX_TRITON_COLS} elements, got {x.shape[1]}; "
            "use backend='torch'"
        )
    if not _triton_launchable(x):
        if kernels.INTERPRETED and not kernels.INTERPRETER_USABLE:
            raise RuntimeError(
                "the Triton interpreter is unusable in this process: triton was imported before "
                "TRITON_INTERPRET=1 was set, so its own library functions were compiled for GPU; "
                "set TRITON_INTERPRET=1 before anything imports triton"
            )
        raise RuntimeError(
            f"Triton backend requested for a tensor on {x.device}: Triton needs a CUDA tensor, or "
            "TRITON_INTERPRET=1 set in the environment *before* triton is imported (the interpreter is "
            "chosen when the kernels are defined)"
            + ("" if kernels.INTERPRETED else "; the kernels in this process were compiled for GPU")
        )
    return "triton"


def _launch_config(n_rows: int, n_cols: int, interpreted: bool) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_COLS, num_warps) for a ``n_rows x n_cols`` launch."""
    triton = _triton().triton
    block_cols = triton.next_power_of_2(max(n_cols, 1))
    budget = _INTERPRETER_TILE_ELEMS if interpreted else _GPU_TILE_ELEMS
    block_rows = max(1, min(_MAX_BLOCK_ROWS, budget // block_cols))
    # Do not allocate a tile much taller than the input (both are powers of two).
    block_rows = min(block_rows, triton.next_power_of_2(n_rows))
    tile = block_rows * block_cols
    num_warps = 4 if tile <= 4096 else (8 if tile <= 16384 else 16)
    return block_rows, block_cols, num_warps


def _launch_rowwise(kernel: Any, x: torch.Tensor, out_dtype: torch.dtype, scalar: float) -> torch.Tensor:
    """Launch a row-wise kernel with signature (x, y, n_rows, n_cols, sx, sy, scalar, ...)."""
    # The kernels index rows by a row stride and columns by unit stride, so any layout
    # with contiguous rows is used as-is; anything else is copied once.
    if x.stride(1) != 1:
        x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=out_dtype, device=x.device)
    interpreted = _triton().INTERPRETED
    block_rows, block_cols, num_warps = _launch_config(n_rows, n_cols, interpreted)
    grid = (-(-n_rows // block_rows),)
    kwargs: dict[str, Any] = {"BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols}
    if not interpreted:
        kwargs["num_warps"] = num_warps
    if x.is_cuda:
        with torch.cuda.device(x.device):
            kernel[grid](x, y, n_rows, n_cols, x.stride(0), y.stride(0), scalar, **kwargs)
    else:
        with _INTERPRETER_LOCK:  # one interpreted launch at a time
            kernel[grid](x, y, n_rows, n_cols, x.stride(0), y.stride(0), scalar, **kwargs)
    return y


def l2_normalize(
    x: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """Row-wise L2 normalization of a 2-D tensor: ``x / max(||x||_2, eps)``.

    Args:
        x: ``(rows, D)`` float tensor (fp32/fp16/bf16 for Triton; torch also takes fp64).
            A single row must be passed as ``(1, D)``.
        out_dtype: dtype of the result (default ``x.dtype``); with Triton the cast is fused
            into the kernel, e.g. fp32 embeddings -> fp16 index vectors in one pass.
        backend: ``"auto"``, ``"triton"`` or ``"torch"`` (see module docstring).
        eps: lower bound on the norm; all-zero rows normalize to zeros.

    Returns:
        A new ``(rows, D)`` tensor of dtype ``out_dtype`` on ``x.device``.
    """
    _check_input(x)
    out_dtype = out_dtype or x.dtype
    chosen = _resolve_backend(x, backend, out_dtype)
    if x.numel() == 0:  # 0 rows or 0 columns: nothing to compute, never launch.
        return torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if chosen == "torch":
        return torch_l2_normalize(x, out_dtype=out_dtype, eps=eps)
    return _launch_rowwise(_triton().l2_normalize_kernel, x, out_dtype, float(eps))


def softmax(x: torch.Tensor, *, temperature: float = 1.0, backend: str = "auto") -> torch.Tensor:
    """Row-wise softmax of ``x / temperature`` for a 2-D tensor (output dtype = ``x.dtype``).

    The row maximum is subtracted before exponentiation, so large logits (e.g. 1e4) do
    not overflow. ``temperature`` must be finite and positive; values below 1 sharpen
    the distribution, above 1 flatten it.
    """
    _check_input(x)
    _check_temperature(temperature)
    chosen = _resolve_backend(x, backend, x.dtype)
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if chosen == "torch":
        return torch_softmax(x, temperature=temperature)
    return _launch_rowwise(_triton().softmax_kernel, x, x.dtype, float(temperature))
