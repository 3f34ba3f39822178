"""Profiles: the default and the accurate bundled cross-encoder, chosen by option, environment, the index or a GPU."""
import json

import pytest
import torch

from mgeo_index import settings
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.query.resolver import open_resolver
from conftest import copy_index


def _cli(*args):
    from typer.testing import CliRunner

    from mgeo_index.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_the_profile_comes_from_the_option_the_environment_the_index_then_the_device(monkeypatch):
    monkeypatch.delenv("MGEO_INDEX_PROFILE", raising=False)
    assert settings.profile("accurate", "default") == ("accurate", None)
    assert settings.profile(None, "accurate") == ("accurate", None)
    monkeypatch.setenv("MGEO_INDEX_PROFILE", "default")
    assert settings.profile(None, "accurate") == ("default", None)
    monkeypatch.delenv("MGEO_INDEX_PROFILE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert settings.profile() == ("default", None)  # never accurate silently on a CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(settings, "gpu_present", lambda: False)  # no GPU device files: torch is not even asked
    assert settings.profile() == ("default", None)
    monkeypatch.setattr(settings, "gpu_present", lambda: True)
    chosen, note = settings.profile()
    assert chosen == "accurate" and "CUDA" in note  # and it says so
    with pytest.raises(ValueError, match="default, accurate"):
        settings.profile("fast")
    assert settings.cross_model_path(None, "accurate") == settings.PROFILE_CROSS_MODELS["accurate"]


def test_the_accurate_cross_encoder_ships_calibrated_with_every_head_and_the_number_policy():
    cross = load_cross_encoder(settings.PROFILE_CROSS_MODELS["accurate"])
    default = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    assert cross.fingerprint != default.fingerprint
    assert cross.model.config.num_hidden_layers == 12 and cross.model.config.hidden_size == 384
    assert cross.feature_head is not None and cross.stack is not None and cross.decision_offsets is not None
    assert cross.number_policy is not None and cross.number_policy["pairs"] >= 50


def test_the_accurate_network_ships_its_linear_weights_in_int8_and_computes_as_the_int8_backend_would():
    """Stored int8 per output channel (half the bytes): the int8 backend's weights are the stored ones, so on it
    the network gives what the FP16 file gave; FP32 reads them back multiplied by their scales."""
    import torch
    from safetensors import safe_open

    from mgeo_index.runtime import quant
    from mgeo_index.model import bert

    directory = settings.PROFILE_CROSS_MODELS["accurate"]
    with safe_open(directory / bert.WEIGHTS, framework="pt") as weights:
        names = list(weights.keys())
        stored = {name: weights.get_tensor(name) for name in names}
    int8 = [name for name in names if stored[name].dtype == torch.int8]
    assert len(int8) == 12 * 6 + 1 and all(name + bert.SCALE_SUFFIX in stored for name in int8)  # + the pooler
    assert (directory / bert.WEIGHTS).stat().st_size < 30 * 2**20
    cross = load_cross_encoder(directory)
    query = cross.model.bert.encoder.layer[0].attention.self.query
    weight, scale = quant.quantize_weight(query.weight)
    assert torch.equal(weight.t(), stored["bert.encoder.layer.0.attention.self.query.weight"])
    torch.testing.assert_close(scale, stored["bert.encoder.layer.0.attention.self.query.weight_scale"])


def test_int8_weights_round_trip_through_a_model_directory(tiny_model_dirs, tmp_path):
    import shutil

    import torch
    from safetensors.torch import save_file

    from mgeo_index.runtime import inference
    from mgeo_index.model import bert

    shutil.copytree(tiny_model_dirs[1], tmp_path / "cross")
    dense = bert.read_weights(tmp_path / "cross")
    save_file(bert.int8_weights(dense), tmp_path / "cross" / bert.WEIGHTS)
    again = bert.read_weights(tmp_path / "cross")
    assert set(again) == set(dense)
    for name, tensor in dense.items():
        torch.testing.assert_close(again[name], tensor, atol=tensor.abs().max().item() / 100 + 1e-3, rtol=0)
    plain = load_cross_encoder(tmp_path / "cross")
    trainable = load_cross_encoder(tmp_path / "cross", trainable=True)  # transformers, weights assigned
    first, second = ["北京市朝阳区建国路88号"], ["北京朝阳建国路88号"]
    torch.testing.assert_close(torch.from_numpy(inference.network_logits(plain, first, second)),
                               torch.from_numpy(inference.network_logits(trainable, first, second)))


def test_an_index_built_for_a_profile_answers_with_it_unless_told(sample_index, tmp_path, monkeypatch):
    monkeypatch.delenv("MGEO_INDEX_PROFILE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    index_dir = copy_index(sample_index, tmp_path / "idx")
    built = _cli("build", settings.SAMPLE_CATALOG, "--index-dir", index_dir, "--id-column", "poi_id", "--profile", "accurate")
    assert built.exit_code == 0, built.output
    resolver = open_resolver(index_dir, device="cpu")
    assert resolver.profile == "accurate" and resolver.cross.path == str(settings.PROFILE_CROSS_MODELS["accurate"].resolve())
    resolver.close()
    other = open_resolver(index_dir, device="cpu", profile="default")  # the bi-encoder and index are shared
    assert other.cross.path == str(settings.DEFAULT_CROSS_MODEL.resolve())
    answers = other.resolve(["深圳南山中山路75号东方科技园9号楼"], top_k=1)
    assert answers[0][0]["source_id"] == "P0001"
    other.close()
    result = _cli("resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir, "--json", "--top-k", "1")
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["matches"][0]
    assert best["source_id"] == "P0001" and best["label"] == "exact_match"


def test_match_and_eval_take_the_profile(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\n北京朝阳建国路88号\t北京市朝阳区建国路88号\n北京朝阳建国路88号\t上海市浦东新区世纪大道100号\n",
                     encoding="utf-8")
    out = {}
    for profile in ("default", "accurate"):
        out[profile] = tmp_path / f"{profile}.tsv"
        result = _cli("match", "--file", pairs, "--out", out[profile], "--profile", profile)
        assert result.exit_code == 0, result.output
    labels = {p: [line.split("\t")[2] for line in f.read_text(encoding="utf-8").splitlines()[1:]] for p, f in out.items()}
    assert labels["accurate"] == ["exact_match", "not_match"] == labels["default"]
    assert out["accurate"].read_text(encoding="utf-8") != out["default"].read_text(encoding="utf-8")  # another model


def test_eval_pairs_measures_both_profiles_side_by_side(tmp_path):
    labelled = tmp_path / "pairs.tsv"
    labelled.write_text("addr1\taddr2\tlabel\n北京朝阳建国路88号\t北京市朝阳区建国路88号\t1\n"
                        "北京朝阳建国路88号\t上海市浦东新区世纪大道100号\t0\n深圳南山中山路75号\t深圳市南山区中山路75号\t1\n",
                        encoding="utf-8")
    result = _cli("eval", "pairs", labelled, "--both-profiles", "--json", "--pairwise")
    assert result.exit_code == 0, result.output
    reports = json.loads(result.output)
    assert set(reports) == set(settings.PROFILES) and all(r["n"] == 3 for r in reports.values())
    table = _cli("eval", "pairs", labelled, "--both-profiles", "--pairwise")
    assert table.exit_code == 0 and "accurate" in table.output and "macro-F1" in table.output
    refused = _cli("eval", "pairs", labelled, "--both-profiles", "--profile", "accurate")
    assert refused.exit_code != 0 and "--both-profiles" in refused.output
