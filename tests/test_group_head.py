"""The group head: a query's candidates labelled together where a file lists them."""
import csv
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mgeo_index import settings
from mgeo_index.query.match import match_file, score_sides
from mgeo_index.measure.metrics import classification_report
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.model.forest import Forest
from mgeo_index.model.group_head import GroupHead, group_features, runs, train_booster
from mgeo_index.model.manifest import ModelError

LABELS = ["exact_match", "partial_match", "not_match"]


def test_runs_are_consecutive_equal_keys():
    assert [r.tolist() for r in runs(["a", "a", "b", "a", "c", "c"])] == [[0, 1], [2], [3], [4, 5]]
    assert runs([]) == []


def test_group_features_of_a_lone_pair_carry_no_context():
    x = group_features(np.array([[0.2, 0.7]]), ["北京市朝阳区建国路88号"], ["q"])
    assert x.shape == (1, 4 * 2 + 4)
    assert np.allclose(x[0, :2], [0.2, 0.7])
    assert np.allclose(x[0, 2:6], 0.0)  # minus the best, minus the mean
    assert np.allclose(x[0, 6:8], 1.0)  # the best of a run of one
    assert np.allclose(x[0, 8:], 0.0)  # log(1), no other candidates to resemble


def test_group_features_compare_each_pair_with_its_own_run_only():
    features = np.array([[0.9], [0.5], [0.1], [0.3]])
    candidates = ["建国路88号", "建国路88号东门", "人民路1号", "中山路2号"]
    x = group_features(features, candidates, ["q1", "q1", "q1", "q2"])
    assert np.allclose(x[:3, 1], [0.0, -0.4, -0.8])  # minus the run's best
    assert np.allclose(x[:3, 2], [0.4, 0.0, -0.4])  # minus the run's mean
    assert x[:, 3].tolist() == [1.0, 0.0, 0.0, 1.0]  # the run's best; q2 is its own run
    assert np.allclose(x[:3, 4], np.log(3)) and x[3, 4] == 0.0
    # the two 建国路88号 candidates resemble each other (2-gram Jaccard 5/7) more than SIMILAR; 人民路1号 neither
    assert x[0, 5] == pytest.approx(5 / 7) and x[0, 6] == pytest.approx(5 / 14) and x[0, 7] == 1.0 and x[2, 7] == 0.0


def _synthetic(n_groups: int, seed: int):
    """Runs of 2-5 candidates; the exact match is the run's best on feature 0, but how good it looks alone
    varies from query to query (a query-level shift), so no threshold on a pair alone finds it."""
    rng = np.random.default_rng(seed)
    features, gold, keys, candidates = [], [], [], []
    for g in range(n_groups):
        size = int(rng.integers(2, 6))
        score = rng.normal(0, 0.3, size) + rng.normal(0, 1.5)
        best = int(rng.integers(size))
        score[best] += 1.0
        for i in range(size):
            features.append([score[i], rng.normal()])
            gold.append(0 if i == best else 2)
            keys.append(f"query {g}")
            candidates.append(f"候选{g}-{i}")
    return np.array(features), np.array(gold), keys, candidates


def test_the_trees_find_the_best_of_each_run_where_pairwise_thresholds_cannot():
    features, gold, keys, candidates = _synthetic(600, seed=0)
    x = group_features(features, candidates, keys)
    alone = train_booster(features, gold, np.ones(len(gold)), rounds=100, threads=1)
    together = train_booster(x, gold, np.ones(len(gold)), rounds=100, threads=1)
    test_features, test_gold, test_keys, test_candidates = _synthetic(400, seed=1)
    test_x = group_features(test_features, test_candidates, test_keys)

    def f1(booster, inputs):
        head = GroupHead(Forest.from_texts([booster.model_to_string()]), [1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], LABELS)
        return classification_report(test_gold.tolist(), head.decide(head.probabilities(inputs, [])).tolist(),
                                     [0, 1, 2])["macro_f1"]

    assert f1(together, test_x) > f1(alone, test_features) + 0.15
    assert f1(together, test_x) > 0.6


@pytest.fixture(scope="module")
def shipped():
    cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    if cross.group_head is None:
        pytest.skip("the shipped cross-encoder has no group head")
    return cross


QUERIES = {
    "北京朝阳建国路88号": ["北京市朝阳区建国路88号", "北京市朝阳区建国路86号", "广州市天河区体育西路1号"],
    "深圳南山中山路75号": ["深圳市南山区中山路75号东方科技园", "深圳市南山区中山路57号"],
    "杭州西湖文三路478号": ["杭州市西湖区文三路478号华星时代广场", "杭州市西湖区文二路478号", "杭州市滨江区江南大道478号",
                    "北京市海淀区中关村大街27号"],
}


def test_a_run_gets_the_same_answers_whatever_else_is_in_the_file(shipped):
    rows = [(q, c) for q, candidates in QUERIES.items() for c in candidates]
    a, b = [q for q, _ in rows], [c for _, c in rows]
    probs, decided, _ = score_sides(shipped, a, b, grouped=True)
    last = len(QUERIES["杭州西湖文三路478号"])
    alone_probs, alone, _ = score_sides(shipped, a[-last:], b[-last:], grouped=True)
    assert np.allclose(probs[-last:], alone_probs, atol=1e-6, rtol=0) and np.array_equal(decided[-last:], alone)
    assert np.allclose(probs.sum(1), 1.0, atol=1e-5)


def test_the_gate_labels_clear_non_matches_without_the_network_and_the_others_as_before(shipped, monkeypatch):
    from mgeo_index.model import group_head
    from mgeo_index.compare.features import pair_features_batch
    from mgeo_index.runtime import inference

    assert shipped.group_head.gate is not None  # the shipped head carries one
    rows = [(q, c) for q, candidates in QUERIES.items() for c in candidates]
    a, b = [q for q, _ in rows], [c for _, c in rows]
    network_logits, seen = inference.network_logits, []

    def counted(cross, queries, candidates, **kwargs):
        seen.extend(zip(queries, candidates))
        return network_logits(cross, queries, candidates, **kwargs)

    monkeypatch.setattr(inference, "network_logits", counted)
    gated, gated_labels = group_head.score_groups(shipped, a, b)
    head = shipped.group_head
    features = pair_features_batch(a, b)
    trees = head.tree_logits(group_features(features, b, a))
    free, settled = head.gate.judge(trees, shipped.head_logits(features), head.decision_offsets, 0)
    assert 0 < settled.sum() < len(rows)
    assert settled[b.index("广州市天河区体育西路1号")] and not settled[b.index("北京市朝阳区建国路88号")]
    assert seen == [r for r, s in zip(rows, settled) if not s]  # the network saw the unsettled pairs only
    assert np.allclose(gated[settled], free[settled], atol=1e-6, rtol=0)
    assert np.array_equal(gated_labels[settled], head.decide(free[settled]))
    assert (gated_labels[settled] != 0).all() and (gated[settled, 0] < head.gate.max_exact).all()
    monkeypatch.setattr(head, "gate", None)  # without it, the network judges every pair; the unsettled as before
    full, full_labels = group_head.score_groups(shipped, a, b)
    assert len(seen) == sum(~settled) + len(rows)
    assert np.array_equal(full[~settled], gated[~settled]) and np.array_equal(full_labels[~settled], gated_labels[~settled])


def test_the_gate_threshold_is_the_lowest_that_keeps_the_labels_on_the_share_asked():
    from mgeo_index.training.group import gate_threshold

    offsets = [0.0, 0.0, 0.0]
    # the full stack's labels: 0, 2, 2, 1; the network-free ones agree but on the last pair, sure of not_match at 0.8
    full = np.array([[0.9, 0.05, 0.05], [0.1, 0.1, 0.8], [0.1, 0.2, 0.7], [0.1, 0.8, 0.1]])
    free = np.array([[0.9, 0.05, 0.05], [0.01, 0.09, 0.9], [0.01, 0.39, 0.6], [0.01, 0.19, 0.8]])
    assert gate_threshold(full, free, offsets, 0, 0.03, 1.0) == pytest.approx(0.805)  # above the wrong pair's 0.8
    assert gate_threshold(full, free, offsets, 0, 0.03, 0.75) == 0.5  # one pair in four may move
    assert gate_threshold(full, free, offsets, 0, 0.005, 0.75) == 0.5  # nothing under the cap: nothing settles


def test_a_group_head_of_an_earlier_kind_is_refused_naming_the_refit(shipped, tmp_path):
    copy = tmp_path / "cross"
    shutil.copytree(settings.DEFAULT_CROSS_MODEL, copy)
    manifest = json.loads((copy / "mgeo_index.json").read_text())
    manifest["group_head"] = {"labels": LABELS, "mean": [0.0] * 13, "weights": [[0.0] * 3] * 13}  # the earlier regression
    (copy / "mgeo_index.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="recalibrate.py --model .* --decision-only"):
        load_cross_encoder(copy)
    assert load_cross_encoder(copy, group_head=False).group_head is None  # what the refit loads


def test_a_saved_group_head_loads_back_the_same(shipped, tmp_path):
    shipped.save(tmp_path / "cross")
    again = load_cross_encoder(tmp_path / "cross")
    rows = [(q, c) for q, candidates in QUERIES.items() for c in candidates]
    x = group_features(np.random.default_rng(0).random((len(rows), 135)), [c for _, c in rows], [q for q, _ in rows])
    assert np.array_equal(again.group_head.tree_logits(x), shipped.group_head.tree_logits(x))
    assert again.group_head.manifest() == shipped.group_head.manifest()
    shipped_trees = Path(shipped.path) / "group_head.safetensors"
    assert (tmp_path / "cross" / "group_head.safetensors").read_bytes() == shipped_trees.read_bytes()  # the same bytes


def test_a_group_head_kept_as_lightgbm_texts_reads_as_before(tmp_path):
    """Model folders written before the trees were arrays hold the boosters' LightGBM model texts, gzipped: they
    load, and score as LightGBM does."""
    pytest.importorskip("lightgbm")
    copy = tmp_path / "cross"
    shutil.copytree(settings.DEFAULT_CROSS_MODEL, copy)
    rng = np.random.default_rng(2)
    x = group_features(rng.random((300, 135)), [f"候选{i % 7}" for i in range(300)], [f"query {i // 4}" for i in range(300)])
    gold = rng.integers(0, 3, len(x))
    boosters = [train_booster(x, gold, np.ones(len(x)), seed=seed, rounds=5, threads=1) for seed in (0, 1)]
    texts = "\n# mgeo-index: next booster\n".join(b.model_to_string() for b in boosters)
    (copy / "group_head.safetensors").unlink()
    (copy / "group_head.lgb.txt.gz").write_bytes(gzip.compress(texts.encode("utf-8")))
    manifest = json.loads((copy / "mgeo_index.json").read_text())
    manifest["group_head"] |= {"file": "group_head.lgb.txt.gz", "boosters": 2}
    (copy / "mgeo_index.json").write_text(json.dumps(manifest))
    head = load_cross_encoder(copy).group_head
    reference = sum(np.asarray(b.predict(x, raw_score=True), dtype=np.float64) for b in boosters) / 2
    assert head.forest.boosters == 2 and np.array_equal(head.tree_logits(x), reference)


def _write_pairs(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(["a", "b"])
        writer.writerows(rows)


def _read_scores(path):
    with open(path, encoding="utf-8") as fh:
        return [(r["label"], r["p_exact_match"]) for r in csv.DictReader(fh, delimiter="\t")]


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
    together = _read_scores(pairwise)  # the same labels; probabilities up to the GEMMs' rounding at another batch size
    assert [label for label, _ in together] == [label for label, _ in alone]
    assert np.allclose([float(p) for _, p in together], [float(p) for _, p in alone], atol=1e-5)
    labels = [label for label, _ in _read_scores(grouped)]
    assert labels[0] == "exact_match" and labels[2] == "not_match"  # 88号 itself; another city
    assert labels[-1] == "not_match"


def test_without_the_cascade_the_network_judges_every_pair(shipped, monkeypatch):
    from mgeo_index.model import group_head
    from mgeo_index.runtime import inference

    rows = [(q, c) for q, candidates in QUERIES.items() for c in candidates]
    network_logits, seen = inference.network_logits, []
    monkeypatch.setattr(inference, "network_logits",
                        lambda cross, queries, *args, **kwargs: seen.extend(queries) or network_logits(cross, queries, *args, **kwargs))
    monkeypatch.setenv("MGEO_INDEX_CASCADE", "0")
    group_head.score_groups(shipped, [q for q, _ in rows], [c for _, c in rows])
    assert len(seen) == len(rows)
