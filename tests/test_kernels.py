"""Triton kernels vs. torch references, run on the Triton CPU interpreter.

``@triton.jit`` decides *when the decorator runs* whether a kernel is compiled for a
GPU or executed by the interpreter, so ``TRITON_INTERPRET=1`` has to be in the
environment before ``mgeo_index.runtime.kernels`` is imported (defining the kernels). Without
it, launching on this GPU-less machine fails with "0 active drivers".

The same holds for triton's own ``@jit`` helpers (``tl.max``, ``tl.sum``), so the
variable must be set before triton is first imported in the process. It is set only
around the import and, through a module fixture, while these tests run: other test
modules keep ``backend="auto"`` on the fast torch path (the dispatcher also checks the
variable at call time).
"""
from __future__ import annotations

import os

_PREVIOUS_INTERPRET = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels import, see above

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mgeo_index.runtime.kernels as K  # noqa: E402


def _restore_interpret_env() -> None:
    if _PREVIOUS_INTERPRET is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _PREVIOUS_INTERPRET


_restore_interpret_env()

if not K.triton_available():
    pytest.skip("triton is not installed", allow_module_level=True)
if not K._triton().INTERPRETER_USABLE:
    # triton.language's own @jit helpers (tl.max, tl.sum) are also fixed at import, so
    # if anything imported triton before this module, the interpreter cannot be enabled
    # here: run with TRITON_INTERPRET=1 in the environment (or this module on its own).
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

FP32_TOL = {"atol": 1e-6, "rtol": 1e-5}
SHAPES = [(1, 7), (5, 256), (33, 130), (64, 768), (3, 1), (17, 1000)]


@pytest.fixture(autouse=True, scope="module")
def _triton_interpreter():
    """Keep TRITON_INTERPRET=1 while this module's tests run, restore it afterwards."""
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    _restore_interpret_env()


def _randn(shape: tuple[int, int], seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale


# ----------------------------------------------------------------------- l2_normalize


@pytest.mark.parametrize("shape", SHAPES)
def test_l2_normalize_matches_torch(shape: tuple[int, int]) -> None:
    x = _randn(shape, seed=shape[0] * 1000 + shape[1], scale=3.0)
    got = K.l2_normalize(x, backend="triton")
    want = K.torch_l2_normalize(x)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, want, **FP32_TOL)
    torch.testing.assert_close(got.norm(dim=1), torch.ones(shape[0]), atol=1e-5, rtol=0)


def test_l2_normalize_zero_rows_give_zeros_not_nan() -> None:
    x = _randn((4, 130))
    x[1] = 0.0
    x[3] = 0.0
    got = K.l2_normalize(x, backend="triton")
    assert not torch.isnan(got).any()
    assert torch.equal(got[1], torch.zeros(130)) and torch.equal(got[3], torch.zeros(130))
    torch.testing.assert_close(got, K.torch_l2_normalize(x), **FP32_TOL)


def test_l2_normalize_fused_fp16_output() -> None:
    x = _randn((33, 130), seed=1)
    got = K.l2_normalize(x, out_dtype=torch.float16, backend="triton")
    assert got.dtype == torch.float16
    # Same fp32 math, then one rounding to fp16 (round-to-nearest both sides).
    torch.testing.assert_close(got, K.torch_l2_normalize(x, out_dtype=torch.float16), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(got.float(), K.torch_l2_normalize(x), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_l2_normalize_half_inputs(dtype: torch.dtype) -> None:
    x = _randn((9, 100), seed=2).to(dtype)
    got = K.l2_normalize(x, backend="triton")
    assert got.dtype == dtype
    # fp32 output: no final rounding, must match the fp32 reference on the same input.
    got32 = K.l2_normalize(x, out_dtype=torch.float32, backend="triton")
    torch.testing.assert_close(got32, K.torch_l2_normalize(x, out_dtype=torch.float32), **FP32_TOL)
    # Half output: within one ulp (the interpreter truncates fp32->bf16 where GPUs round).
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(got.float(), got32, atol=ulp, rtol=ulp)


def test_l2_normalize_non_contiguous_inputs() -> None:
    base = _randn((40, 64), seed=3)
    transposed = base.t()  # column-major: copied to contiguous
    sliced = base[:, 5:55]  # contiguous rows with a row stride of 64: used in place
    assert not transposed.is_contiguous() and not sliced.is_contiguous()
    for x in (transposed, sliced, base[::2]):
        torch.testing.assert_close(K.l2_normalize(x, backend="triton"), K.torch_l2_normalize(x), **FP32_TOL)


def test_l2_normalize_matches_functional_normalize() -> None:
    x = _randn((5, 256), seed=4)
    torch.testing.assert_close(
        K.l2_normalize(x, backend="triton"), torch.nn.functional.normalize(x, dim=1), **FP32_TOL
    )


# ----------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("temperature", [1.0, 0.05, 2.5])
def test_softmax_matches_torch(shape: tuple[int, int], temperature: float) -> None:
    x = _randn(shape, seed=shape[1], scale=2.0)
    got = K.softmax(x, temperature=temperature, backend="triton")
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, K.torch_softmax(x, temperature=temperature), **FP32_TOL)
    torch.testing.assert_close(got.sum(dim=1), torch.ones(shape[0]), atol=1e-5, rtol=0)


def test_softmax_large_values_do_not_overflow() -> None:
    x = torch.tensor([[1e4, 0.0, -1e4, 1e4 - 1.0], [-1e4, -1e4, -1e4, -1e4]])
    for temperature in (1.0, 0.01):
        got = K.softmax(x, temperature=temperature, backend="triton")
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, K.torch_softmax(x, temperature=temperature), **FP32_TOL)
    torch.testing.assert_close(K.softmax(x, backend="triton")[1], torch.full((4,), 0.25), **FP32_TOL)


def test_softmax_reference_equals_torch_softmax() -> None:
    x = _randn((6, 33), seed=5)
    torch.testing.assert_close(K.torch_softmax(x, temperature=0.5), torch.softmax(x / 0.5, dim=1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softmax_half_inputs(dtype: torch.dtype) -> None:
    x = _randn((9, 100), seed=6).to(dtype)
    got = K.softmax(x, temperature=0.7, backend="triton")
    assert got.dtype == dtype
    want = K.torch_softmax(x.float(), temperature=0.7)
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(got.float(), want, atol=ulp, rtol=ulp)


def test_softmax_non_contiguous_input() -> None:
    x = _randn((30, 20), seed=7).t()
    torch.testing.assert_close(K.softmax(x, backend="triton"), K.torch_softmax(x), **FP32_TOL)


# ---------------------------------------------------------------- edge cases, dispatch


@pytest.mark.parametrize("fn", [K.l2_normalize, K.softmax])
@pytest.mark.parametrize("backend", ["triton", "torch", "auto"])
def test_empty_input(fn, backend: str) -> None:
    for shape in ((0, 16), (3, 0)):
        got = fn(torch.empty(shape, dtype=torch.float16), backend=backend)
        assert got.shape == shape and got.dtype == torch.float16
    got = K.l2_normalize(torch.empty(0, 16), out_dtype=torch.bfloat16, backend=backend)
    assert got.shape == (0, 16) and got.dtype == torch.bfloat16


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="2-D"):
        K.l2_normalize(torch.ones(8))
    with pytest.raises(ValueError, match="2-D"):
        K.softmax(torch.ones(2, 3, 4))
    with pytest.raises(TypeError, match="floating"):
        K.softmax(torch.ones(2, 3, dtype=torch.int64))
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            K.softmax(torch.ones(2, 3), temperature=bad)
    with pytest.raises(ValueError, match="backend"):
        K.l2_normalize(torch.ones(2, 3), backend="cuda")


def test_auto_backend_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(2, 8)
    assert K._resolve_backend(x, "auto", x.dtype) == "triton"
    assert "triton" in K.available_backends()
    # fp64 is not a Triton dtype: auto falls back, forcing Triton explains why.
    x64 = x.double()
    assert K._resolve_backend(x64, "auto", x64.dtype) == "torch"
    torch.testing.assert_close(K.l2_normalize(x64), K.torch_l2_normalize(x64))
    with pytest.raises(RuntimeError, match="float32/float16/bfloat16"):
        K.l2_normalize(x64, backend="triton")
    # Without the interpreter a CPU tensor cannot run Triton.
    monkeypatch.delenv("TRITON_INTERPRET")
    assert K._resolve_backend(x, "auto", x.dtype) == "torch"
    assert K.available_backends() == ["torch"] or torch.cuda.is_available()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        K.softmax(x, backend="triton")
    torch.testing.assert_close(K.softmax(x), torch.full((2, 8), 0.125))


def test_missing_triton_gives_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(K._triton(), "triton", None)
    monkeypatch.setattr(K._triton(), "IMPORT_ERROR", ImportError("No module named 'triton'"))
    x = torch.ones(2, 8)
    with pytest.raises(ImportError, match="pip install"):
        K.l2_normalize(x, backend="triton")
    assert K._resolve_backend(x, "auto", x.dtype) == "torch"
    assert K.available_backends() == ["torch"]


def test_half_enabled_interpreter_gives_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Kernels defined for the interpreter but triton itself imported without it.
    monkeypatch.setattr(K._triton(), "INTERPRETER_USABLE", False)
    x = torch.ones(2, 8)
    assert K._resolve_backend(x, "auto", x.dtype) == "torch"
    with pytest.raises(RuntimeError, match="imported before TRITON_INTERPRET=1"):
        K.softmax(x, backend="triton")


def test_block_config_covers_all_rows() -> None:
    for rows, cols in [(1, 7), (33, 130), (64, 768), (1000, 5)]:
        block_rows, block_cols, _ = K._launch_config(rows, cols, interpreted=False)
        assert block_cols >= cols and block_cols & (block_cols - 1) == 0
        assert block_rows & (block_rows - 1) == 0 and block_rows * block_cols <= max(8192, block_cols)
    assert K._launch_config(1000, 256, interpreted=True)[0] > 1  # several rows per program


# ----------------------------------------------------------------------------- property


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 70),
    temperature=st.floats(0.05, 20.0),
    scale=st.sampled_from([1e-3, 1.0, 50.0]),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(rows: int, cols: int, temperature: float, scale: float, seed: int) -> None:
    x = _randn((rows, cols), seed=seed, scale=scale)
    torch.testing.assert_close(K.l2_normalize(x, backend="triton"), K.torch_l2_normalize(x), **FP32_TOL)
    sm = K.softmax(x, temperature=temperature, backend="triton")
    torch.testing.assert_close(sm, K.torch_softmax(x, temperature=temperature), **FP32_TOL)
    torch.testing.assert_close(sm.sum(dim=1), torch.ones(rows), atol=1e-5, rtol=0)
