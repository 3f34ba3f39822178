import json

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from mgeo_index import settings
from mgeo_index.runtime import inference
from mgeo_index.query import labelling
from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.model.manifest import MANIFEST, ModelError, fingerprint


def test_round_trip_keeps_outputs_and_fingerprint(tiny_model_dirs, tmp_path):
    bi = load_bi_encoder(tiny_model_dirs[0])
    before = inference.encode(bi, ["北京市朝阳区建国路88号", "人民路1号"])
    bi.save(tmp_path / "copy")
    again = load_bi_encoder(tmp_path / "copy")
    np.testing.assert_allclose(inference.encode(again, ["北京市朝阳区建国路88号", "人民路1号"]), before, atol=1e-6)
    assert again.fingerprint == bi.fingerprint == fingerprint(tiny_model_dirs[0])
    manifest = json.loads((tmp_path / "copy" / MANIFEST).read_text())
    assert manifest["kind"] == "bi-encoder" and manifest["projection_dim"] == 16
    assert {"torch", "transformers", "mgeo_index"} <= set(manifest["versions"])


def test_fingerprint_changes_with_weights(tiny_model_dirs, tmp_path):
    bi = load_bi_encoder(tiny_model_dirs[0])
    with torch.no_grad():
        bi.projection.weight.add_(0.5)
    bi.save(tmp_path / "changed")
    assert load_bi_encoder(tmp_path / "changed").fingerprint != fingerprint(tiny_model_dirs[0])


def test_plain_hugging_face_checkpoint_loads_with_mean_pooling(tiny_model_dirs, tmp_path):
    """Any BERT-style checkpoint (no mgeo-index manifest) works as a bi-encoder."""
    tokenizer = load_bi_encoder(tiny_model_dirs[0]).tokenizer
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=48, max_position_embeddings=64)
    BertModel(config).save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    bi = load_bi_encoder(tmp_path / "hf")
    assert bi.pooling == "mean" and bi.dim == 24 and bi.projection is None
    assert inference.encode(bi, ["人民路1号"]).shape == (1, 24)
    with pytest.raises(ModelError, match="labels"):
        load_cross_encoder(tmp_path / "hf")  # two default labels, not the three we need


def test_wrong_kind_and_missing_dir_are_clear_errors(tiny_model_dirs, tmp_path):
    with pytest.raises(ModelError, match="cross-encoder model, but a bi-encoder"):
        load_bi_encoder(tiny_model_dirs[1])
    with pytest.raises(ModelError, match="no config.json"):
        load_bi_encoder(tmp_path)


def test_shipped_default_models_are_trained_and_consistent():
    """The bundled models exist, are the trained ones (metrics recorded), and agree on labels."""
    bi = load_bi_encoder(settings.DEFAULT_BI_MODEL)
    cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    assert set(cross.labels) == set(settings.LABELS)
    metrics = json.loads((settings.DEFAULT_MODEL_DIR / "metrics.json").read_text())
    assert metrics["fingerprints"] == {"bi": bi.fingerprint, "cross": cross.fingerprint}
    # a trained model tells a same-place pair from a different-place pair
    probs = labelling.score_pairs(cross, ["北京市朝阳区建国路88号", "北京市朝阳区建国路88号"],
                               ["北京朝阳建国路88号", "广州市天河区中山大道西1号"])
    exact = cross.labels.index("exact_match")
    assert probs[0, exact] > probs[1, exact]


def test_decision_offsets_choose_the_label_and_survive_save_and_load(tiny_model_dirs, tmp_path):
    cross = load_cross_encoder(tiny_model_dirs[1])
    rows = [{"exact_match": 0.30, "partial_match": 0.45, "not_match": 0.25},
            {"exact_match": 0.05, "partial_match": 0.15, "not_match": 0.80}]
    probs = np.array([[row[label] for label in cross.labels] for row in rows])
    assert [cross.labels[i] for i in cross.decide(probs)] == ["partial_match", "not_match"]  # no offsets: argmax
    cross.decision_offsets = [0.5 if label == "exact_match" else 0.0 for label in cross.labels]
    cross.save(tmp_path / "cross")
    loaded = load_cross_encoder(tmp_path / "cross")
    assert loaded.decision_offsets == cross.decision_offsets
    # log 0.30 + 0.5 > log 0.45: the offset turns the first row into exact_match; the second stays
    assert [loaded.labels[i] for i in loaded.decide(probs)] == ["exact_match", "not_match"]


def test_averaged_feature_heads_give_the_mean_of_their_logits():
    import torch

    from mgeo_index.model.cross_encoder import FeatureHead, average_heads

    torch.manual_seed(0)
    heads = [FeatureHead(7, 5).eval() for _ in range(3)]
    x = torch.randn(11, 7)
    merged = average_heads(heads)
    assert merged.net[0].out_features == 15
    with torch.no_grad():
        torch.testing.assert_close(merged(x), torch.stack([h(x) for h in heads]).mean(0), atol=1e-6, rtol=1e-5)


def _tree_head(seed: int = 0):
    """Trees fitted on a synthetic rule of 6 features (label = which third the first feature falls in)."""
    from mgeo_index.model.tree_head import train_tree_head

    rng = np.random.default_rng(seed)
    x = rng.random((600, 6)).astype(np.float32)
    y = np.minimum((x[:, 0] * 3).astype(np.int64), 2)
    return train_tree_head(x, y, seed=seed, rounds=20), x, y


def test_a_tree_head_learns_and_scores_each_row_alone():
    head, x, y = _tree_head()
    logits = head(x)
    assert logits.dtype == torch.float32 and logits.shape == (600, 3)
    assert (logits.argmax(1).numpy() == y).mean() > 0.95
    # batch independence: a row's logits are the same alone, in any batch, in any order
    order = np.random.default_rng(1).permutation(600)
    assert torch.equal(head(x[order])[np.argsort(order)], logits)
    assert torch.equal(head(torch.from_numpy(x[17:18])), logits[17:18])
    assert head(np.empty((0, 6), np.float32)).shape == (0, 3)


def test_a_tree_head_saves_with_the_cross_encoder_and_refits_on_new_labels(tiny_model_dirs, tmp_path):
    import copy

    from mgeo_index.model.cross_encoder import FEATURE_HEAD, FeatureHead
    from mgeo_index.model.tree_head import TREE_HEAD, TreeHead
    from mgeo_index.training.adapt import finetune_head

    head, x, y = _tree_head()
    cross = load_cross_encoder(tiny_model_dirs[1])
    cross.feature_head, cross.stack = FeatureHead(6).eval(), {"alpha": 0.5, "beta": 1.0, "bias": [0.0, 0.0, 0.0]}
    cross.save(tmp_path / "mlp")
    cross.feature_head = head
    cross.save(tmp_path / "mlp")  # the same directory: the trees replace the MLPs' file
    assert (tmp_path / "mlp" / TREE_HEAD).exists() and not (tmp_path / "mlp" / FEATURE_HEAD).exists()
    from mgeo_index.model.cross_encoder import load_head

    loaded = load_head(tmp_path / "mlp")
    assert isinstance(loaded, TreeHead) and torch.equal(loaded(x), head(x))
    # a refit boosts more trees on top, from a copy: the original head is untouched
    before = head(x).clone()
    flipped = 2 - y  # a new policy on the same features
    refit = finetune_head(head, x, flipped, epochs=4)
    assert refit.trees > head.trees and torch.equal(head(x), before)
    assert (refit(x).argmax(1).numpy() == flipped).mean() > (before.argmax(1).numpy() == flipped).mean()
    assert torch.equal(copy.deepcopy(refit)(x), refit(x))


def test_a_features_only_scorer_never_runs_the_transformer(tiny_model_dirs):
    import torch

    from mgeo_index.compare.features import pair_features_batch
    from mgeo_index.model.cross_encoder import FeatureHead

    cross = load_cross_encoder(tiny_model_dirs[1])
    torch.manual_seed(0)
    cross.feature_head = FeatureHead(len(pair_features_batch(["a"], ["b"])[0])).eval()
    cross.stack = {"alpha": 0.0, "beta": 1.3, "bias": [0.1, 0.0, -0.1]}
    assert not cross.uses_network

    def forbidden(*args, **kwargs):
        raise AssertionError("the transformer ran")

    cross.model.forward = forbidden
    a, b = ["北京市朝阳区建国路88号", "深圳南山中山路75号"], ["北京朝阳建国路88号", "广州市天河区中山大道西1号"]
    probs = labelling.score_pairs(cross, a, b)
    with torch.no_grad():
        expected = torch.softmax(1.3 * cross.feature_head(torch.from_numpy(pair_features_batch(a, b))) + torch.tensor([0.1, 0.0, -0.1]), -1)
    np.testing.assert_allclose(probs, expected.numpy(), atol=1e-6)
    cross.stack["alpha"] = 0.5
    with pytest.raises(AssertionError, match="the transformer ran"):
        labelling.score_pairs(cross, a, b)


LONG_PAIR = ("上海市浦东新区张江高科技园区碧波路690号" * 6, "浦东张江碧波路690号张江微电子港" * 7)
PAIRS = [("北京市朝阳区建国路88号", "北京朝阳建国路88号"), ("深圳", "广州市天河区中山大道西1号ＡＢ座４０８"),
         ("", "杭州西湖文三路478号"), LONG_PAIR]


@pytest.mark.parametrize("profile", settings.PROFILES)
@pytest.mark.parametrize("backend", ["torch", "int8"])
def test_plain_modules_give_the_transformers_bits(profile, backend):
    """The shipped networks as plain torch modules (what inference runs) compute the same bits as the
    ``transformers`` models they were trained as, alone and in batches, long pairs cut the same way."""
    from mgeo_index.runtime import backends

    first, second = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    plain = backends.apply(load_cross_encoder(settings.cross_model_path(None, profile)), backend)
    reference = backends.apply(load_cross_encoder(settings.cross_model_path(None, profile), trainable=True), backend)
    assert type(plain.model).__module__ == "mgeo_index.model.bert"
    assert type(reference.model).__module__.startswith("transformers.")
    np.testing.assert_array_equal(inference.network_logits(plain, first, second),
                                  inference.network_logits(reference, first, second))
    if profile == "default":
        bi = backends.apply(load_bi_encoder(settings.DEFAULT_BI_MODEL), backend)
        bi_reference = backends.apply(load_bi_encoder(settings.DEFAULT_BI_MODEL, trainable=True), backend)
        np.testing.assert_array_equal(inference.encode(bi, first + second), inference.encode(bi_reference, first + second))


def test_tokenizer_answers_as_transformers_does():
    from transformers import AutoTokenizer

    from mgeo_index.model.tokenizer import FastTokenizer, load_tokenizer

    ours, theirs = load_tokenizer(settings.DEFAULT_CROSS_MODEL), AutoTokenizer.from_pretrained(settings.DEFAULT_CROSS_MODEL)
    assert isinstance(ours, FastTokenizer) and len(ours) == len(theirs)
    first, second = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    calls = [((first, second), dict(padding=True, truncation=True, max_length=128)),
             ((first, None), dict(padding=True, truncation=True, max_length=64, pad_to_multiple_of=8)),
             (("人民路1号", None), dict(padding="max_length", truncation=True, max_length=32))]
    for args, kwargs in calls:
        mine, reference = ours(*args, **kwargs, return_tensors="pt"), theirs(*args, **kwargs, return_tensors="pt")
        assert set(mine) == set(reference)
        for key in mine:
            assert torch.equal(mine[key], reference[key]), key
    assert ours(*LONG_PAIR, max_length=128)["input_ids"].shape == (1, 128)


def test_a_copied_or_pickled_tokenizer_still_tokenizes():
    import copy
    import pickle

    from mgeo_index.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(settings.DEFAULT_BI_MODEL)
    for other in (copy.deepcopy(tokenizer), pickle.loads(pickle.dumps(tokenizer))):
        assert torch.equal(other("人民路1号")["input_ids"], tokenizer("人民路1号")["input_ids"])


def test_a_cross_encoder_checkpoint_without_a_classifier_is_refused_clearly(tiny_model_dirs, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model_dirs[1], tmp_path / "cross")
    weights = load_file(tmp_path / "cross" / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("classifier")}, tmp_path / "cross" / "model.safetensors")
    with pytest.raises(ModelError, match="no weight classifier.weight: it is not a sequence-classification model"):
        load_cross_encoder(tmp_path / "cross")


def test_resolving_imports_nothing_it_does_not_use(tmp_path):
    """One-shot commands start without ``transformers`` (seconds of imports; the shipped models run as plain
    torch modules with the ``tokenizers`` library), and a CPU resolve loads neither triton, torch's compiler
    nor Alembic (a store at the newest schema)."""
    import os
    import subprocess
    import sys

    catalog = tmp_path / "catalog.csv"
    catalog.write_text("id,address\n1,杭州市西湖区文三路478号\n2,北京市朝阳区建国路88号\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    steps = [(["build", str(catalog), "--index-dir", str(tmp_path / "idx")], ["transformers"]),
             (["resolve", "杭州西湖文三路478号", "--index-dir", str(tmp_path / "idx"), "--explain"],
              ["transformers", "triton", "torch._dynamo", "alembic"])]
    for args, unused in steps:
        code = f"""
import sys
from typer.testing import CliRunner
from mgeo_index.cli import app
result = CliRunner().invoke(app, {args!r})
assert result.exit_code == 0, result.output
print([name for name in {unused!r} if name in sys.modules])
"""
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip().splitlines()[-1] == "[]", (args[0], result.stdout)


@pytest.mark.parametrize("stated, expected", [(512, 128), (48, 48), (None, 128)])
def test_a_checkpoint_without_a_manifest_reads_its_tokenizers_limit_without_loading_it(tiny_model_dirs, tmp_path,
                                                                                        stated, expected):
    """One reading of a bi-encoder directory (read_bi_manifest): what jobs record, both backends' loaders use."""
    import shutil

    from mgeo_index.model.bi_encoder import load_bi_encoder
    from mgeo_index.model.manifest import MANIFEST, TOKENIZER_CONFIG, read_bi_manifest

    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dirs[0], plain)
    (plain / MANIFEST).unlink()
    settings_file = plain / TOKENIZER_CONFIG
    config = json.loads(settings_file.read_text())
    config.pop("model_max_length", None)
    if stated is not None:
        config["model_max_length"] = stated
    settings_file.write_text(json.dumps(config))
    spec = read_bi_manifest(plain)
    assert spec == {"pooling": "mean", "projection_dim": None, "max_length": expected}
    assert load_bi_encoder(plain).max_length == expected
    assert read_bi_manifest(tiny_model_dirs[0]) == {"pooling": "mean", "projection_dim": 16, "max_length": 64}


def test_a_manifest_with_an_unknown_pooling_is_refused_naming_it(tiny_model_dirs, tmp_path):
    import shutil

    from mgeo_index.model.manifest import MANIFEST, ModelError, read_bi_manifest

    odd = tmp_path / "odd"
    shutil.copytree(tiny_model_dirs[0], odd)
    manifest = json.loads((odd / MANIFEST).read_text())
    (odd / MANIFEST).write_text(json.dumps({**manifest, "pooling": "max"}))
    with pytest.raises(ModelError, match="pooling must be 'mean' or 'cls'.*'max'"):
        read_bi_manifest(odd)
