"""CPU backends give the plain-torch results (within their precision), in input order, from one setting."""
import gzip
import os
import subprocess
import sys
import json
import time

import numpy as np
import pytest
import torch

from mgeo_index import settings
from mgeo_index.measure import bench
from mgeo_index.runtime import backends, inference
from mgeo_index.query import labelling
from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.model.cross_encoder import load_cross_encoder

TEXTS = ["北京市朝阳区建国路88号", "深圳南山中山路75号东方科技园9号楼", "上海", "广州市天河区柯木塱背坪村窑屋地西街四巷1号首层",
         "杭州市西湖区文三路", "成都武侯区", "南京市鼓楼区二板桥", "天津"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MGEO_INDEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MGEO_INDEX_BACKEND", raising=False)


@pytest.mark.parametrize("name", ["bf16", "int8", "onnx"])
def test_backend_matches_plain_torch(tiny_model_dirs, name):
    bi_dir, cross_dir = tiny_model_dirs
    reference = inference.encode(load_bi_encoder(bi_dir), TEXTS)
    ref_probs = labelling.score_pairs(load_cross_encoder(cross_dir), TEXTS, TEXTS[::-1])
    bi = backends.apply(load_bi_encoder(bi_dir), name)
    cross = backends.apply(load_cross_encoder(cross_dir), name)
    assert bi.backend == cross.backend == name
    vectors = inference.encode(bi, TEXTS)
    probs = labelling.score_pairs(cross, TEXTS, TEXTS[::-1])
    tolerance = {"bf16": 3e-2, "int8": 3e-2}.get(name, 1e-4)
    assert vectors.shape == reference.shape and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-4)
    assert np.abs(vectors - reference).max() < tolerance  # same rows, same (input) order
    assert np.abs(probs - ref_probs).max() < tolerance
    # one item alone gives what it gives inside a batch (dynamic batch and sequence axes for onnx; int8 scales
    # each token's activations on its own and sums exactly, so only the FP32 parts around it differ)
    assert np.abs(inference.encode(bi, TEXTS[3]) - vectors[3]).max() < 1e-4
    assert np.abs(labelling.score_pairs(cross, TEXTS[3:4], TEXTS[4:5]) - probs[3]).max() < 1e-4


@pytest.mark.slow
def test_compile_backend_matches_plain_torch(tiny_model_dirs):
    """torch.compile (Inductor, dynamic shapes): the bi-encoder only, since compiling costs minutes here."""
    bi = load_bi_encoder(tiny_model_dirs[0])
    reference = inference.encode(bi, TEXTS)
    backends.apply(bi, "compile")
    assert np.abs(inference.encode(bi, TEXTS) - reference).max() < 1e-4
    assert np.abs(inference.encode(bi, TEXTS[:5]) - reference[:5]).max() < 1e-4  # other shapes, no recompilation


def test_onnx_export_is_cached_by_fingerprint(tiny_model_dirs):
    bi = load_bi_encoder(tiny_model_dirs[0])
    path = backends.export_onnx(bi)
    assert path.parent == settings.cache_dir() and bi.fingerprint in path.name
    stamp = path.stat().st_mtime_ns
    backends.apply(load_bi_encoder(tiny_model_dirs[0]), "onnx")
    assert path.stat().st_mtime_ns == stamp  # reused, not exported again
    assert backends.onnx_path(load_cross_encoder(tiny_model_dirs[1])) != path
    assert not list(path.parent.glob(".*.tmp"))


def test_models_never_saved_get_a_graph_of_their_own(tiny_model_dirs):
    first, second = load_bi_encoder(tiny_model_dirs[0]), load_bi_encoder(tiny_model_dirs[0])
    with torch.no_grad():
        second.projection.weight.mul_(-1.0)  # another model, as training in this process would leave it
    first.fingerprint = second.fingerprint = ""  # neither comes from saved files
    assert backends.onnx_path(first) != backends.onnx_path(second)
    same = load_bi_encoder(tiny_model_dirs[0])
    same.fingerprint = ""
    assert backends.onnx_path(same) == backends.onnx_path(first)  # the same weights reuse one graph
    for model in (first, second):
        reference = inference.encode(backends.apply(model, "torch"), TEXTS)
        assert np.abs(inference.encode(backends.apply(model, "onnx"), TEXTS) - reference).max() < 1e-4


def test_runner_is_not_part_of_the_model_state(tiny_model_dirs):
    bi = load_bi_encoder(tiny_model_dirs[0])
    keys = set(bi.state_dict())
    backends.apply(bi, "int8")
    assert set(bi.state_dict()) == keys  # saving or moving the model never sees the quantized copy
    assert bi.runner is not None and bi.runner is not bi


@pytest.mark.parametrize("name", ["int8", "bf16"])
def test_a_model_loaded_for_inference_is_converted_in_place_and_answers_as_the_copy(name, tmp_path):
    """The loaders convert the shipped models themselves (their FP32 Linear weights dropped) and give the bits a
    converted copy gives; the feature head, which the model computes itself, stays FP32. Such a model refuses to be
    saved (its layers hold int8 / bfloat16 weights in another layout) and is left as it was."""
    from torch import nn

    from mgeo_index.model import loading
    from mgeo_index.compare.features import pair_features_batch
    from mgeo_index.runtime import quant

    copied_bi = backends.apply(load_bi_encoder(settings.bi_model_path()), name)
    copied_cross = backends.apply(load_cross_encoder(settings.cross_model_path()), name)
    bi, cross = loading.load_bi(device="cpu", backend=name), loading.load_cross(device="cpu", backend=name)
    assert (bi.backend, bi.runner, cross.backend, cross.runner) == (name, None, name, None)

    def wide_fp32(module):
        return [m for m in module.modules() if isinstance(m, nn.Linear) and min(m.in_features, m.out_features) >= quant.MIN_FEATURES]

    assert wide_fp32(copied_bi.encoder) and not wide_fp32(bi.encoder) and not wide_fp32(cross.model)
    assert wide_fp32(cross.feature_head) and all(a is not b for a, b in zip(wide_fp32(cross.feature_head), wide_fp32(copied_cross.feature_head)))
    assert np.array_equal(inference.encode(bi, TEXTS), inference.encode(copied_bi, TEXTS))
    features = pair_features_batch(TEXTS, TEXTS[::-1])
    assert np.array_equal(labelling.score_pairs(cross, TEXTS, TEXTS[::-1], features=features),
                          labelling.score_pairs(copied_cross, TEXTS, TEXTS[::-1], features=features))
    assert np.array_equal(cross.head_logits(features), copied_cross.head_logits(features))
    assert backends.apply(bi, name) is bi and bi.runner is None  # the same backend again: nothing to redo
    with pytest.raises(ValueError, match="load it again to run it on torch"):
        backends.apply(bi, "torch")
    for model in (bi, cross):
        with pytest.raises(ValueError, match="load it from its directory"):
            model.save(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()
    assert np.array_equal(labelling.score_pairs(cross, TEXTS, TEXTS[::-1], features=features),
                          labelling.score_pairs(copied_cross, TEXTS, TEXTS[::-1], features=features))


def test_default_cpu_backend_follows_the_cpus_instructions():
    assert settings.default_cpu_backend(frozenset({"avx2", "avx512_vnni", "amx_bf16", "amx_int8"})) == "bf16"
    assert settings.default_cpu_backend(frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})) == "int8"
    assert settings.default_cpu_backend(frozenset({"avx2", "avx_vnni"})) == "int8"
    # without VNNI torch._int_mm has no fast kernel (0.03x FP32 on an AVX2-only EPYC): FP32
    assert settings.default_cpu_backend(frozenset({"avx", "avx2", "fma"})) == "torch"
    assert settings.default_cpu_backend(frozenset()) == "torch"


def test_setting_precedence(monkeypatch):
    from mgeo_index.runtime.plan import choose, plan

    monkeypatch.delenv("MGEO_INDEX_BACKEND", raising=False)
    assert plan().backend == settings.DEFAULT_CPU_BACKEND
    assert choose("torch", "cuda", settings.cpu_flags()).backend == "torch"
    monkeypatch.setenv("MGEO_INDEX_BACKEND", "onnx")
    assert plan().backend == "onnx"
    assert plan("int8").backend == "int8"


def test_unknown_backend_and_cpu_backend_on_cuda_are_refused(tiny_model_dirs):
    bi = load_bi_encoder(tiny_model_dirs[0])
    with pytest.raises(ValueError, match="torch, bf16, compile, int8, onnx"):
        backends.apply(bi, "tensorrt")
    with pytest.raises(ValueError, match="use --backend torch"):
        backends.apply(bi, "int8", device="cuda")


def test_synthesized_catalog_is_distinct_deterministic_and_sized(tmp_path):
    data = tmp_path / "data"
    (data / "catalog").mkdir(parents=True)
    with gzip.open(data / "catalog" / "ccks2021_poi_candidates.tsv.gz", "wt", encoding="utf-8") as fh:
        fh.write("text\tfreq\n鼓楼区二板桥\t24\n朝阳区建国路88号\t3\n")
    with gzip.open(data / "catalog" / "shenzhen_standard_addresses.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("光明区上村莲塘兆豪工业园\n鼓楼区二板桥\n")
    for i, name in enumerate(("tagged_addresses_swei412.jsonl.gz", "tagged_addresses_ncap2019.jsonl.gz")):
        with gzip.open(data / "catalog" / name, "wt", encoding="utf-8") as fh:
            fh.write(json.dumps({"text": f"浙江省杭州市文{i}路1号"}, ensure_ascii=False) + "\n")
    assert len(bench.base_addresses(data)) == 5  # the duplicate across files counted once
    first = bench.synthesize_catalog(data, 40, tmp_path / "a.tsv").read_text(encoding="utf-8").splitlines()
    again = bench.synthesize_catalog(data, 40, tmp_path / "b.tsv").read_text(encoding="utf-8").splitlines()
    assert first == again and first[0] == "id\taddress" and len(first) == 41
    rows = [line.split("\t") for line in first[1:]]
    assert len({a for _, a in rows}) == 40 and len({i for i, _ in rows}) == 40
    assert rows[0][1] == "鼓楼区二板桥" and rows[5][1].startswith("鼓楼区二板桥") and rows[5][1] != "鼓楼区二板桥"


@pytest.mark.slow
def test_bench_build_measures_the_child_process(tmp_path):
    catalog = tmp_path / "c.tsv"
    catalog.write_text("id\taddress\n" + "".join(f"r{i}\t北京市朝阳区建国路{i}号\n" for i in range(30)), encoding="utf-8")
    result = bench.bench_build(catalog, tmp_path / "idx", backend="torch")
    assert result["rows"] == 30 and result["rows_per_s"] > 0
    assert 0 < result["cpu_seconds"] and result["rows_per_cpu_s"] >= result["rows_per_s"] * 0.5  # the child's own CPU time
    assert 100 < result["peak_rss_mib"] < 4096  # the child's own peak, not the parent's
    assert (tmp_path / "idx" / "index.json").is_file()
    assert result["structure"] == "Flat" and result["recall_at_10_vs_flat"] == 1.0  # auto: a small catalog stays Flat
    assert result["vectors_mib"] > 0 and result["ngrams_mib"] > 0 and result["store_mib"] > 0
    resolved = bench.bench_built_resolve(tmp_path / "idx", catalog, queries=12, backend="torch")
    assert resolved["queries"] == 12 and resolved["catalog_size"] == 30 and 0 < resolved["p50_ms"] <= resolved["p99_ms"]
    assert resolved["resolver_rss_mib"] > 0


def test_chosen_structure_reads_the_build_summary():
    line = "index     auto: IVF4096,SQ8 (nprobe 16: recall@10 0.983 of exact search on 1000 catalog vectors)  \n"
    assert bench.chosen_structure(line) == {"structure": "IVF4096,SQ8", "nprobe": 16, "recall_at_10_vs_flat": 0.983,
                                            "recall_queries": 1000}
    assert bench.chosen_structure("index   auto: Flat\n") == {"structure": "Flat", "recall_at_10_vs_flat": 1.0}
    assert bench.chosen_structure("index   Flat\n") == {}  # a factory named on the command line: nothing chosen


def test_linear_share_counts_the_int8_and_fp32_gemms_only():
    x = torch.randn(512, 64)
    wide = torch.randn(512, 4096)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
    with torch.inference_mode():
        assert bench.linear_share(lambda: torch.nn.functional.gelu(wide)) is None  # elementwise work is not counted
        for model in (layer, backends._quantized(layer)):
            share = bench.linear_share(lambda model=model: model(x))
            assert share is not None and 0 < share < 1
            calls, linear_us, wall_us = bench.gemm_profile(lambda model=model: model(x))
            assert sum(calls.values()) == 2 and 0 < linear_us <= wall_us  # the two Linear layers' GEMMs, nothing else

            def diluted_call(model=model):  # the same GEMMs beside a lot of GELU: the GELU is not counted
                model(x)
                for _ in range(20):
                    torch.nn.functional.gelu(wide)

            diluted_calls, _, diluted_wall_us = bench.gemm_profile(diluted_call)
            assert diluted_calls == calls and diluted_wall_us > 0
    assert bench.linear_share(lambda: np.ones(10_000).cumsum()) is None  # no Linear ran (e.g. ONNX Runtime)


def test_a_cpu_backend_leaves_the_other_blas_libraries_one_thread(tiny_model_dirs):
    """numpy's OpenBLAS, its idle threads spinning, took the cores from torch's: once a model gets a CPU backend,
    every BLAS loaded but torch's and FAISS's runs on one thread, and torch keeps its threads (a fresh process: the
    limit is process-wide)."""
    code = """
import json, sys
import faiss, numpy
from threadpoolctl import threadpool_info
import torch
from mgeo_index.runtime import backends
from mgeo_index.model.bi_encoder import load_bi_encoder

def blas(of_faiss=False):
    return [i["num_threads"] for i in threadpool_info()
            if i["user_api"] == "blas" and "torch" not in i["filepath"] and ("faiss" in i["filepath"]) == of_faiss]

before = blas(), torch.get_num_threads(), blas(of_faiss=True)
backends.apply(load_bi_encoder(sys.argv[1]), "int8")
print(json.dumps([before, (blas(), torch.get_num_threads(), blas(of_faiss=True))]))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code, str(tiny_model_dirs[0])], env=env | {"OPENBLAS_NUM_THREADS": "2"},
                         capture_output=True, text=True, check=True).stdout
    before, after = json.loads(out.strip().splitlines()[-1])
    (blas_before, torch_before, faiss_before), (blas_after, torch_after, faiss_after) = before, after
    assert blas_before and min(blas_before) == 2  # numpy's own, at least
    assert blas_after == [1] * len(blas_before)
    assert torch_after == torch_before
    assert faiss_after == faiss_before  # FAISS's batch searches keep their BLAS threads
