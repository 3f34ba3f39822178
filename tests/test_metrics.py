import numpy as np
import pytest

from mgeo_index.measure.metrics import classification_report, expected_calibration_error, retrieval_report

LABELS = ("exact_match", "partial_match", "not_match")


def test_classification_report_numbers():
    gold = [0, 0, 1, 1, 2, 2, 2, 2]
    pred = [0, 1, 1, 1, 2, 2, 0, 2]
    r = classification_report(gold, pred, LABELS)
    assert r["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 3]]
    assert r["accuracy"] == pytest.approx(6 / 8)
    assert r["per_class"]["exact_match"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2})
    assert r["per_class"]["partial_match"]["f1"] == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert r["macro_f1"] == pytest.approx(np.mean([0.5, 0.8, 2 * 1 * 0.75 / 1.75]))


def test_macro_f1_ignores_a_class_absent_from_gold_and_predictions():
    r = classification_report([0, 2, 2], [0, 2, 2], LABELS)
    assert r["macro_f1"] == 1.0


def test_ece_is_zero_when_confidence_equals_accuracy():
    probs = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert expected_calibration_error(probs, [0, 1]) == 0.0
    assert expected_calibration_error(probs, [1, 1]) == pytest.approx(0.5)


def test_retrieval_report():
    ranked = np.array([[5, 1, 2], [3, 4, 5], [9, 8, 7]])
    r = retrieval_report(ranked, [5, 5, 1], ks=(1, 3))
    assert r == {"recall@1": pytest.approx(1 / 3), "recall@3": pytest.approx(2 / 3), "mrr@3": pytest.approx((1 + 1 / 3) / 3), "n": 3}


def test_retrieval_report_counts_any_of_several_gold_ids():
    ranked = np.array([[7, 5, 2], [3, 4, 5]])
    r = retrieval_report(ranked, [{5, 7}, [4, 9]], ks=(1, 3))
    assert r["recall@1"] == pytest.approx(0.5)
    assert r["recall@3"] == 1.0
    assert r["mrr@3"] == pytest.approx((1 + 1 / 2) / 2)
