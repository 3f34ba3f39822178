"""The plan: how a model runs, chosen by one pure function of what decides it (mgeo_index.runtime.plan)."""
from __future__ import annotations

import pytest

from mgeo_index import settings
from mgeo_index.runtime.plan import ONE_SHOT_QUERIES, Plan, choose, plan, torch_plan

AMX = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})
VNNI = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})
AVX2 = frozenset({"avx", "avx2", "fma"})


@pytest.mark.parametrize("requested, device, flags, queries, computes, expected", [
    (None, "cpu", AMX, None, True, "torch/bf16-tiles/blocked"),
    (None, "cpu", VNNI, None, True, "torch/int8-rows/blocked"),
    (None, "cpu", AVX2, None, True, "torch/fp32/blocked"),
    # a one-shot where the default is FP32: the NumPy executor, the same numerics, no torch
    (None, "cpu", AVX2, 1, True, "numpy/fp32/blocked"),
    (None, "cpu", AVX2, ONE_SHOT_QUERIES, True, "numpy/fp32/blocked"),
    (None, "cpu", AVX2, ONE_SHOT_QUERIES + 1, True, "torch/fp32/blocked"),
    (None, "cpu", AVX2, 1, False, "torch/fp32/blocked"),  # a model the NumPy executor does not compute
    (None, "cpu", VNNI, 1, True, "torch/int8-rows/blocked"),  # int8 rounding: a one-shot stays on the default
    ("torch", "cpu", AVX2, 1, True, "torch/fp32/blocked"),  # asked for: no one-shot switch
    # numpy asked for: Linear layers as the CPU's default computes them
    ("numpy", "cpu", VNNI, None, True, "numpy/int8-rows/blocked"),
    ("numpy", "cpu", AMX, None, True, "numpy/bf16-tiles/blocked"),
    ("numpy", "cpu", VNNI, None, False, "torch/int8-rows/blocked"),
    ("compile", "cpu", VNNI, None, True, "torch/fp32/blocked/compiled"),
    ("onnx", "cpu", AVX2, None, True, "onnxruntime/fp32/fused"),
    ("int8", "cpu", AVX2, None, True, "torch/int8-rows/blocked"),
    # CUDA: torch in FP16 with fused attention, whatever was asked
    (None, "cuda", VNNI, 1, True, "torch/fp16/fused@cuda"),
    ("numpy", "cuda:1", AVX2, None, True, "torch/fp16/fused@cuda:1"),
])
def test_the_plan_is_a_pure_function_of_what_decides_it(requested, device, flags, queries, computes, expected):
    chosen = choose(requested, device, flags, queries=queries, numpy_computes=computes)
    assert str(chosen) == expected
    assert chosen == choose(requested, device, flags, queries=queries, numpy_computes=computes)
    assert isinstance(chosen, Plan)


def test_an_unknown_backend_is_refused_naming_where_it_came_from(monkeypatch):
    with pytest.raises(ValueError, match="backend must be one of"):
        choose("fast", "cpu", AVX2)
    with pytest.raises(ValueError, match="backend 'int8' is for the CPU; on cuda use --backend torch"):
        choose("int8", "cuda", VNNI)
    monkeypatch.setenv("MGEO_INDEX_BACKEND", "fast")
    with pytest.raises(ValueError, match="MGEO_INDEX_BACKEND must be one of"):
        plan()


def test_numpy_asked_by_flag_or_by_environment_computes_alike(monkeypatch):
    """The NumPy executor's numerics follow the CPU, not how numpy was asked for (the environment once read as
    FP32 where the flag read as int8)."""
    from mgeo_index.model import numpy_backend

    monkeypatch.setattr(settings, "cpu_flags", lambda: VNNI)
    monkeypatch.delenv("MGEO_INDEX_BACKEND", raising=False)
    by_flag = plan("numpy")
    assert numpy_backend.kind_of(torch_plan("numpy")) == numpy_backend.kind_of(torch_plan()) == "int8"
    monkeypatch.setenv("MGEO_INDEX_BACKEND", "numpy")
    assert plan() == by_flag and numpy_backend.kind_of(torch_plan()) == "int8"
    assert torch_plan().backend == "int8"  # a torch module asked to run on numpy runs on the CPU's default
    assert numpy_backend.kind_of(torch_plan("torch")) == "fp32" and numpy_backend.kind_of(torch_plan("bf16")) == "bf16"


def test_a_model_remembers_its_plan(tiny_model_dirs):
    from mgeo_index.model.loading import stored_bi
    from mgeo_index.runtime import backends

    bi = backends.apply(stored_bi(tiny_model_dirs[0]), "torch")
    assert str(bi.plan) == "torch/fp32/blocked" and bi.backend == "torch"
