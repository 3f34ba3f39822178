"""The confidence-gated cascade: pairs the feature-only scorer decides clearly skip the network."""
import numpy as np
import pytest
import torch

from mgeo_index import settings
from mgeo_index.query import labelling
from mgeo_index.compare.features import pair_features_batch
from mgeo_index.model.cross_encoder import load_cross_encoder

A = ["北京朝阳建国路88号", "北京朝阳建国路88号", "深圳南山中山路75号", "上海徐汇漕溪北路1号", "杭州西湖文三路478号"]
B = ["北京市朝阳区建国路88号", "广州市天河区体育西路1号", "深圳市南山区中山路75号东方科技园", "上海市徐汇区漕溪北路1号",
     "北京市海淀区中关村大街27号"]


@pytest.fixture(scope="module")
def cross():
    model = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    if model.feature_head is None:
        pytest.skip("the shipped cross-encoder has no feature head")
    return model


def _with_gate(cross, min_probability: float):
    cross.gate = {"beta": cross.stack["beta"], "bias": cross.stack["bias"], "min_probability": min_probability}
    return cross


def test_skipped_pairs_keep_the_feature_only_probabilities_and_the_rest_the_networks(cross):
    saved = cross.gate
    try:
        cross.gate = None
        full = labelling.score_pairs(cross, A, B)
        features = pair_features_batch(A, B)
        _with_gate(cross, 0.9)
        alone, skipped = cross.gate_probabilities(torch.from_numpy(features))
        gated = labelling.score_pairs(cross, A, B, features=features)
        assert skipped.any() and not skipped.all()  # 广州 / 海淀 candidates are clear not-matches, the others are not
        np.testing.assert_allclose(gated[skipped], alone[skipped], atol=1e-7)
        np.testing.assert_allclose(gated[~skipped], full[~skipped], atol=1e-6)  # other batch-mates, same results
        assert (cross.decide(gated)[skipped] == cross.decide(alone)[skipped]).all()
        _with_gate(cross, 1.01)  # nothing skipped: the stacked scorer's probabilities
        np.testing.assert_allclose(labelling.score_pairs(cross, A, B), full, atol=1e-6)
    finally:
        cross.gate = saved


def test_settled_pairs_keep_the_feature_only_probabilities_whatever_the_gate_says(cross):
    saved = cross.gate
    try:
        _with_gate(cross, 1.01)  # the gate alone would leave every pair to the network
        features = pair_features_batch(A, B)
        alone, _ = cross.gate_probabilities(torch.from_numpy(features))
        full = labelling.score_pairs(cross, A, B, features=features)
        settled = np.array([False, True, False, True, True])
        got = labelling.score_pairs(cross, A, B, features=features, settled=settled)
        np.testing.assert_array_equal(got[settled], alone[settled])
        np.testing.assert_array_equal(got[~settled], full[~settled])  # the network's, the same bits in a smaller batch
        cross.gate = None  # no cascade: nothing to settle with, the mask is ignored
        np.testing.assert_array_equal(labelling.score_pairs(cross, A, B, features=features, settled=settled),
                                      labelling.score_pairs(cross, A, B, features=features))
    finally:
        cross.gate = saved


def test_gate_decisions_do_not_depend_on_batch_mates(cross):
    saved = cross.gate
    try:
        _with_gate(cross, 0.9)
        together, skip_together = cross.gate_probabilities(torch.from_numpy(pair_features_batch(A, B)))
        for i in range(len(A)):
            alone, skip_alone = cross.gate_probabilities(torch.from_numpy(pair_features_batch(A[i:i + 1], B[i:i + 1])))
            np.testing.assert_allclose(alone[0], together[i], atol=1e-6)
            assert skip_alone[0] == skip_together[i]
    finally:
        cross.gate = saved


def test_fit_gate_keeps_the_required_label_agreement():
    from mgeo_index.training.calibrate import fit_gate

    rng = np.random.default_rng(0)
    n = 2000
    feature_logits = rng.normal(size=(n, 3)) * 3
    network_logits = feature_logits + rng.normal(size=(n, 3))
    gold = np.argmax(network_logits + rng.normal(size=(n, 3)), 1)

    class Labels:
        labels = settings.LABELS
        decision_offsets = None
        gate = None

        def decide(self, probs):
            return np.argmax(np.log(probs), 1)

    model = Labels()
    stack = {"alpha": 1.0, "beta": 1.0, "bias": [0.0, 0.0, 0.0]}
    alone = {"alpha": 0.0, "beta": 1.0, "bias": [0.0, 0.0, 0.0]}
    report = fit_gate(model, stack, alone, network_logits, feature_logits, gold, agreement=0.99)
    assert report["label_agreement"] >= 0.99 and 0 < report["skipped_share"] < 1
    assert model.gate["min_probability"] == report["min_probability"]
    stricter = fit_gate(model, stack, alone, network_logits, feature_logits, gold, agreement=0.999)
    assert stricter["skipped_share"] <= report["skipped_share"]


def test_the_cascade_can_be_switched_off_to_measure_it(monkeypatch):
    from mgeo_index.model.loading import load_cross

    if load_cross(device="cpu").gate is None:
        pytest.skip("the shipped cross-encoder has no gate")
    monkeypatch.setenv("MGEO_INDEX_CASCADE", "0")
    assert load_cross(device="cpu").gate is None


def test_eval_reads_one_source_of_a_ccks_file(tmp_path):
    from mgeo_index.measure.evaluate import read_labeled_pairs

    path = tmp_path / "pairs.tsv"
    path.write_text("query_id\tquery\tcandidate\tlabel\tsplit_source\n"
                    "1\t北京朝阳建国路88号\t北京市朝阳区建国路88号\texact_match\tround2_train\n"
                    "2\t上海徐汇1号\t上海市徐汇区1号\tpartial_match\tround1_train_fold0\n", encoding="utf-8")
    assert read_labeled_pairs(path, "all", "round2_train")[0] == ["北京朝阳建国路88号"]
    assert len(read_labeled_pairs(path)[0]) == 2
