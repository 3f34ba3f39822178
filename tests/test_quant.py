"""Row-wise int8 and tiled bf16 arithmetic: close to FP32, and a row's result never depends on its batch-mates."""
import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from mgeo_index.runtime import quant


def _linear(n_in: int, n_out: int, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out).eval()


def test_matmul_is_the_exact_product_of_the_quantized_operands():
    linear = _linear(96, 40)
    x = torch.randn(quant.ROWS + 100, 96) * 3  # more rows than one chunk
    weight, scale = quant.quantize_weight(linear.weight)
    assert weight.dtype == torch.int8 and weight.shape == (96, 40) and weight.abs().max() <= 127
    got = quant.matmul(x, weight, scale, linear.bias.detach())
    # the reference in float64: dequantized rows times dequantized weights, summed exactly
    q, row_scale = quant.quantize_rows(x)
    exact = (q.double() @ weight.double()) * (row_scale.double() * scale.double()) + linear.bias.double()
    assert torch.allclose(got.double(), exact, rtol=1e-6, atol=1e-5)
    with torch.no_grad():
        reference = linear(x)
    error = (got - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.02  # int8, not FP32, but close to it


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 1200), pick=st.integers(0, 10_000), scale=st.floats(1e-3, 1e3))
def test_a_row_gives_the_same_bits_in_any_batch(rows, pick, scale):
    layer = quant.Int8Linear(_linear(64, 48, seed=1))
    torch.manual_seed(rows)
    batch = torch.randn(rows, 64) * scale
    i = pick % rows
    alone = layer(batch[i : i + 1])
    assert torch.equal(layer(batch)[i : i + 1], alone)
    assert torch.equal(layer(torch.cat([batch, batch * 7])[i : i + 1]), alone)  # other batch-mates, other chunks
    assert torch.equal(layer(batch.reshape(rows, 1, 64))[i], alone)  # leading dimensions are rows too


def test_zero_rows_and_narrow_layers():
    layer = quant.Int8Linear(_linear(32, 20))
    out = layer(torch.zeros(3, 32))
    assert torch.allclose(out, layer.bias.expand(3, -1))  # an all-zero row (padding) gives the bias, no NaN
    model = torch.nn.Sequential(_linear(32, 64), torch.nn.GELU(), _linear(64, 3))
    quant.quantize_linears(model)
    assert isinstance(model[0], quant.Int8Linear) and isinstance(model[2], torch.nn.Linear)  # a 3-label head stays FP32
    assert "int8 rows" in repr(model[0])


def test_quantized_model_keeps_its_answers():
    torch.manual_seed(3)
    model = torch.nn.Sequential(_linear(64, 256, 4), torch.nn.GELU(), _linear(256, 64, 5)).eval()
    x = torch.randn(50, 64)
    with torch.no_grad():
        reference = model(x).numpy()
        got = quant.quantize_linears(model)(x).numpy()
    assert np.corrcoef(reference.ravel(), got.ravel())[0, 1] > 0.999
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 63))  # shapes are still checked


def test_bf16_matmul_is_close_to_fp32_and_keeps_the_shape():
    linear = _linear(96, 40)
    layer = quant.Bf16Linear(linear)
    assert layer.weight.dtype == torch.bfloat16 and "bf16 tiles" in repr(layer)
    x = torch.randn(quant.TILE_ROWS + 30, 3, 96)  # leading dimensions are rows, more than one tile
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (quant.TILE_ROWS + 30, 3, 40)
    with torch.no_grad():
        reference = linear(x)
    error = (got.float() - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.02  # bf16 inputs, FP32 sums
    unbiased = torch.nn.Linear(96, 40, bias=False)
    assert torch.equal(quant.Bf16Linear(unbiased)(torch.zeros(2, 96)), torch.zeros(2, 40, dtype=torch.bfloat16))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 1200), pick=st.integers(0, 10_000))
def test_bf16_row_gives_the_same_bits_in_any_batch(rows, pick):
    """The 1,024 → 256 shape of the shipped models' output layers is the one whose oneDNN kernel, and so its sum
    order, changes with the row count (64–200 rows against 32 or 256): plain ``F.linear`` in bf16 fails this."""
    layer = quant.Bf16Linear(_linear(1024, 256, seed=2))
    torch.manual_seed(rows)
    batch = torch.randn(rows, 1024)
    i = pick % rows
    alone = layer(batch[i : i + 1])
    assert torch.equal(layer(batch)[i : i + 1], alone)
    assert torch.equal(layer(torch.cat([batch, batch * 3])[i : i + 1]), alone)


def test_bf16_linears_keep_narrow_layers_fp32():
    model = torch.nn.Sequential(_linear(32, 64), torch.nn.GELU(), _linear(64, 3))
    quant.bf16_linears(model)
    assert isinstance(model[0], quant.Bf16Linear) and isinstance(model[2], quant.Float32Input)
    out = model(torch.randn(5, 32))
    assert out.dtype == torch.float32 and out.shape == (5, 3)


def test_a_quantized_copy_leaves_the_model_and_computes_as_an_in_place_one():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_linear(32, 64), torch.nn.ReLU(), _linear(64, 3))
    before = [p.clone() for p in model.parameters()]
    x = torch.randn(5, 32)
    for copied, in_place in ((quant.quantized_copy(model), quant.quantize_linears(copy.deepcopy(model))),
                             (quant.bf16_copy(model, [model]), quant.bf16_linears(copy.deepcopy(model)))):
        assert type(copied[0]) is type(in_place[0]) and type(copied[2]) is type(in_place[2])
        assert torch.equal(copied(x), in_place(x))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert isinstance(model[0], torch.nn.Linear) and isinstance(model[2], torch.nn.Linear)
