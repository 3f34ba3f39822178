import numpy as np
import pytest

from mgeo_index import sparse

TEXTS = ["北京市朝阳区建国路88号", "北京市朝阳区建国路99号", "上海市徐汇区漕溪北路1号", "广州市天河区中山大道西1号", "x"]
IDS = [10, 11, 12, 13, 14]


def test_search_ranks_the_closest_string_first(tmp_path):
    index = sparse.build_sparse(TEXTS, IDS)
    scores, ids = index.search(["朝阳区建国路88号", "漕溪北路1号", "天河中山大道西1号", "完全无关"], 3)
    assert ids[:3, 0].tolist() == [10, 12, 13]
    assert ids[0, 1] == 11  # the neighbouring house number is next
    assert (ids[3] == -1).all() and (scores[3] == 0).all()  # nothing shared: no candidates
    assert scores[0, 0] > scores[0, 1] > 0 and scores[0, 0] <= 1.0 + 1e-6
    sparse.save_atomic(index, tmp_path / "s.npz")
    again = sparse.load(tmp_path / "s.npz")
    np.testing.assert_array_equal(again.search(["朝阳区建国路88号"], 3)[1], ids[:1])
    assert [p.name for p in tmp_path.iterdir()] == ["s.npz"]


def test_identical_text_scores_one():
    index = sparse.build_sparse(TEXTS, IDS)
    scores, ids = index.search(TEXTS[:4], 1)
    assert ids[:, 0].tolist() == IDS[:4]
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)


def test_weighted_reciprocal_rank_fusion():
    dense = np.array([[1, 2, 3]])
    ngram = np.array([[3, 4, -1]])
    fused = sparse.fuse([dense, ngram], 4, weights=[0.5, 1.0])
    ids = [i for i, _ in fused[0]]
    assert ids[0] == 3  # in both lists
    assert set(ids) == {1, 2, 3, 4} and [s for _, s in fused[0]] == sorted((s for _, s in fused[0]), reverse=True)
    assert sparse.fuse([dense, ngram], 2)[0][0][1] == pytest.approx(1 / 63 + 1 / 61)
