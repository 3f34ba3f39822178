"""The numpy backend: the shipped networks computed without torch, for one-shot commands."""
import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from mgeo_index import settings
from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.runtime.plan import torch_plan
from mgeo_index.model import numpy_backend
from mgeo_index.runtime import backends, inference, quant
from mgeo_index.query import labelling

BI, CROSS = settings.bi_model_path(None), settings.cross_model_path(None, "default")
QUERIES = ["北京市朝阳区建国路88号", "杭州西湖文三路478号华星时代广场A座1201室", "深圳南山", "浙江省宁波市海曙区中山西路2号"]
CANDIDATES = ["建国路88号院", "文三路478号华星时代广场", "南山区科技园", "海曙区中山西路2号"]


def test_int8_linear_gives_the_int8_backends_bits():
    """Products of int8 values summed in FP32 are exact below 2**24: the same bits as torch's int32 sums."""
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(1024, 256)
    x = torch.randn(37, 1024, generator=gen) * 3
    weight, scale = quant.quantize_weight(layer.weight)
    expected = quant.matmul(x, weight, scale, layer.bias.detach()).numpy()
    ours = numpy_backend.Linear(layer.weight.detach().numpy(), layer.bias.detach().numpy(), "int8")
    assert np.array_equal(ours(x.numpy()), expected)


def test_bf16_rounding_is_torchs():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 100
    assert np.array_equal(numpy_backend.to_bf16(x.numpy()), x.to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("backend, tolerance", [("torch", 1e-5), ("int8", 5e-3)])
def test_networks_compute_what_the_torch_backend_computes(backend, tolerance):
    """FP32 agrees to rounding; int8 too, except where a last-bit difference before a layer rounds an activation
    to the neighbouring int8 level (one element of 4 x 256 moved by 5e-4 here)."""
    kind = numpy_backend.kind_of(torch_plan(backend))
    bi = backends.apply(load_bi_encoder(BI), backend)
    ours = numpy_backend.BiEncoder(BI, kind)
    assert np.abs(inference.encode(ours, QUERIES) - inference.encode(bi, QUERIES)).max() < tolerance
    cross = backends.apply(load_cross_encoder(CROSS), backend)
    cross.gate = None  # every pair through the network
    mine = numpy_backend.CrossEncoder(CROSS, kind)
    mine.gate = None
    theirs, got = labelling.score_pairs(cross, QUERIES, CANDIDATES), labelling.score_pairs(mine, QUERIES, CANDIDATES)
    assert np.abs(got - theirs).max() < tolerance
    assert list(mine.decide(got)) == list(cross.decide(theirs))
    assert mine.labels == cross.labels and mine.fingerprint == cross.fingerprint


def test_the_cascade_decides_as_the_torch_model_does():
    cross = backends.apply(load_cross_encoder(CROSS), "int8")
    mine = numpy_backend.CrossEncoder(CROSS, "int8")
    from mgeo_index.compare.features import pair_features_batch

    features = pair_features_batch(QUERIES * 3, CANDIDATES[::-1] * 3)
    (p_torch, d_torch), (p_numpy, d_numpy) = cross.gate_probabilities(features), mine.gate_probabilities(features)
    assert np.array_equal(d_torch, d_numpy) and np.abs(p_torch - p_numpy).max() < 1e-6


def test_match_on_the_numpy_backend_judges_a_querys_candidates_together_as_the_torch_model_does():
    """The group head is the model's, whichever backend computes the network: without it, `match --backend numpy`
    labelled each pair alone (a probability 0.007 became 0.015 on the second CCKS pair)."""
    from mgeo_index.model import group_head
    from mgeo_index.query.match import score_sides

    cross = backends.apply(load_cross_encoder(CROSS), "torch")
    mine = numpy_backend.CrossEncoder(CROSS, "fp32")
    assert mine.group_head is not None
    queries = [q for q in QUERIES for _ in CANDIDATES]
    candidates = CANDIDATES * len(QUERIES)
    (p_torch, d_torch), (p_numpy, d_numpy) = (group_head.score_groups(model, queries, candidates)
                                              for model in (cross, mine))
    assert list(d_numpy) == list(d_torch) and np.abs(p_numpy - p_torch).max() < 1e-5
    # the scorer alone (loose): the number and name policy moves conflicting pairs whichever head scored them
    grouped = score_sides(mine, queries, candidates, grouped=True, calibrated=True, numbers="loose")
    pairwise = score_sides(mine, queries, candidates, calibrated=True, numbers="loose")
    assert np.array_equal(grouped[0], p_numpy) and not np.allclose(grouped[0], pairwise[0], atol=1e-3)


def test_a_one_shot_resolve_on_the_numpy_backend_imports_no_torch_and_answers_as_the_default(sample_index):
    with open(settings.SAMPLE_CATALOG, encoding="utf-8") as fh:
        queries = [row["address"] for row in csv.DictReader(fh)][3:6]

    def run(*extra):
        done = subprocess.run(
            [sys.executable, "-c", "import sys, runpy; sys.argv = ['mgeo-index'] + sys.argv[1:]; "
             "runpy.run_module('mgeo_index.cli', run_name='__main__', alter_sys=False); ",
             "resolve", *queries, "--index-dir", str(sample_index), "--json", *extra],
            capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return [json.loads(line) for line in done.stdout.splitlines()]

    one_shot = run("--backend", "numpy")
    default = run("--backend", settings.DEFAULT_CPU_BACKEND)
    assert [[m["id"] for m in a["matches"]] for a in one_shot] == [[m["id"] for m in a["matches"]] for a in default]
    assert [[m["label"] for m in a["matches"]] for a in one_shot] == [[m["label"] for m in a["matches"]] for a in default]
    probe = ("import sys; from mgeo_index.api import AddressIndex; "
             f"idx = AddressIndex.open({str(sample_index)!r}, backend='numpy'); idx.resolve({queries[0]!r}); "
             "assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_backend_numpy_falls_back_where_it_cannot_compute_a_model(tiny_model_dirs, tmp_path):
    bi_dir, _ = tiny_model_dirs
    config = json.loads((bi_dir / "config.json").read_text())
    assert numpy_backend.computes(bi_dir) == (config.get("model_type") == "bert")
    trees = tmp_path / "trees"
    trees.mkdir()
    (trees / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_act": "gelu"}))
    (trees / "feature_head.lgb.txt").write_text("")
    assert not numpy_backend.computes(trees)
    # a torch module (a build's embedding, a model the numpy backend cannot compute) runs on the CPU's default
    assert backends.apply(load_bi_encoder(BI), "numpy").backend == settings.DEFAULT_CPU_BACKEND
