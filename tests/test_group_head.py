"""The group head: a query's candidates labelled together where a file lists them."""
import csv

import numpy as np
import pytest

from mgeo_index import settings
from mgeo_index.match import match_file
from mgeo_index.metrics import classification_report
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.model.group_head import fit_group_head, group_decide, group_inputs, runs

LABELS = ("exact_match", "partial_match", "not_match")


def test_runs_are_consecutive_equal_keys():
    assert [r.tolist() for r in runs(["a", "a", "b", "a", "c", "c"])] == [[0, 1], [2], [3], [4, 5]]
    assert runs([]) == []


def _synthetic(n_groups: int, seed: int):
    """Groups of 2-5 candidates; the one exact match is the group's most probable candidate, but how probable
    varies from group to group (a query-level shift), so a threshold on each pair alone cannot find it."""
    rng = np.random.default_rng(seed)
    probs, gold, keys = [], [], []
    for g in range(n_groups):
        size = int(rng.integers(2, 6))
        shift = rng.normal(0, 1.5)
        logit_exact = rng.normal(-2.0, 0.3, size) + shift
        best = int(rng.integers(size))
        logit_exact[best] += 1.5
        for i in range(size):
            logits = np.array([logit_exact[i], 0.0, rng.normal(0.5, 0.3)])
            probs.append(np.exp(logits) / np.exp(logits).sum())
            gold.append(0 if i == best else 2)
            keys.append(f"query {g}")
    return np.array(probs), np.array(gold), keys


def test_the_group_head_finds_the_best_of_each_group_where_pairwise_thresholds_cannot():
    probs, gold, keys = _synthetic(400, seed=0)
    head = fit_group_head(probs, gold, keys, LABELS)
    test_probs, test_gold, test_keys = _synthetic(400, seed=1)
    grouped_probs, decided = group_decide(head, test_probs, test_keys, LABELS)
    pairwise = np.argmax(test_probs, 1)
    f1 = lambda pred: classification_report(test_gold.tolist(), list(pred), [0, 1, 2])["macro_f1"]  # noqa: E731
    assert f1(decided) > f1(pairwise) + 0.15
    assert f1(decided) > 0.6
    assert np.allclose(grouped_probs.sum(1), 1.0, atol=1e-5)


def test_a_group_gets_the_same_answers_whatever_else_is_in_the_file():
    probs, gold, keys = _synthetic(200, seed=2)
    head = fit_group_head(probs, gold, keys, LABELS)
    alone_probs, alone = group_decide(head, probs[:4], keys[:4], LABELS)  # the first group(s), alone
    other, _, other_keys = _synthetic(30, seed=3)
    mixed_probs, mixed = group_decide(head, np.concatenate([other, probs[:4]]), [f"x{k}" for k in other_keys] + keys[:4],
                                      LABELS)
    assert np.array_equal(mixed_probs[-4:], alone_probs) and np.array_equal(mixed[-4:], alone)


def test_group_inputs_of_a_lone_pair_carry_no_context():
    x = group_inputs(np.array([[0.2, 0.3, 0.5]]), ["q"], LABELS)
    assert np.allclose(x[0, 3:], 0.0)  # minus the best, minus the mean, ranks, others, log(1)


def test_a_head_for_other_labels_is_refused():
    probs, gold, keys = _synthetic(50, seed=4)
    head = fit_group_head(probs, gold, keys, LABELS)
    with pytest.raises(ValueError, match="labels"):
        group_decide(head, probs, keys, ("not_match", "partial_match", "exact_match"))


@pytest.fixture(scope="module")
def shipped():
    cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    if cross.group_head is None:
        pytest.skip("the shipped cross-encoder has no group head")
    return cross


def _write_pairs(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(["a", "b"])
        writer.writerows(rows)


def _read_scores(path):
    with open(path, encoding="utf-8") as fh:
        return [(r["label"], r["p_exact_match"]) for r in csv.DictReader(fh, delimiter="\t")]


QUERIES = {
    "北京朝阳建国路88号": ["北京市朝阳区建国路88号", "北京市朝阳区建国路86号", "广州市天河区体育西路1号"],
    "深圳南山中山路75号": ["深圳市南山区中山路75号东方科技园", "深圳市南山区中山路57号"],
    "杭州西湖文三路478号": ["杭州市西湖区文三路478号华星时代广场", "杭州市西湖区文二路478号", "杭州市滨江区江南大道478号",
                    "北京市海淀区中关村大街27号"],
}


def test_match_never_splits_a_query_between_chunks(shipped, tmp_path):
    rows = [(q, c) for q, candidates in QUERIES.items() for c in candidates]
    src, whole, chunked = tmp_path / "pairs.tsv", tmp_path / "whole.tsv", tmp_path / "chunked.tsv"
    _write_pairs(src, rows)
    match_file(src, whole, shipped, device="cpu")
    for size in (4, 5):  # the longest query has 4 candidates; these chunk boundaries fall inside queries
        match_file(src, chunked, shipped, device="cpu", chunk_size=size)
        assert _read_scores(chunked) == _read_scores(whole)


def test_match_labels_a_query_among_its_candidates_and_pairwise_alone(shipped, tmp_path):
    rows = [(q, c) for q, candidates in QUERIES.items() for c in candidates]
    src, grouped, pairwise = tmp_path / "pairs.tsv", tmp_path / "grouped.tsv", tmp_path / "pairwise.tsv"
    _write_pairs(src, rows)
    match_file(src, grouped, shipped, device="cpu")
    match_file(src, pairwise, shipped, device="cpu", grouped=False)
    alone = []
    for q, c in rows:  # pairwise: each row as if it were the only one in the file
        _write_pairs(tmp_path / "one.tsv", [(q, c)])
        match_file(tmp_path / "one.tsv", tmp_path / "one_out.tsv", shipped, device="cpu", grouped=False)
        alone.extend(_read_scores(tmp_path / "one_out.tsv"))
    assert _read_scores(pairwise) == alone
    labels = [label for label, _ in _read_scores(grouped)]
    assert labels[0] == "exact_match" and labels[2] == "not_match"  # 88号 itself; another city
    assert labels[-1] == "not_match"
