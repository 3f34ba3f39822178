import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mgeo_index.index import sparse

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


def test_update_sparse_drops_and_adds_rows_like_a_rebuild():
    from mgeo_index.index.sparse import build_sparse, update_sparse

    old_texts = ["北京市朝阳区建国路88号", "上海市浦东新区世纪大道100号", "广州市天河区天河路385号", "杭州市西湖区文三路90号"]
    base = build_sparse(old_texts, [1, 2, 3, 4])
    new_texts = ["深圳市南山区深南大道10000号", "北京市朝阳区建国路99号"]
    updated = update_sparse(base, [2], new_texts, [5, 6])
    rebuilt = build_sparse([old_texts[0], old_texts[2], old_texts[3]] + new_texts, [1, 3, 4, 5, 6])
    assert sorted(updated.ids.tolist()) == [1, 3, 4, 5, 6] and updated.matrix.shape[0] == 5
    queries = ["深圳南山深南大道10000号", "广州天河天河路385号", "北京朝阳建国路99号", "杭州西湖文三路"]
    _, got = updated.search(queries, 3)
    _, want = rebuilt.search(queries, 3)
    assert got[:, 0].tolist() == want[:, 0].tolist() == [5, 3, 6, 4]
    assert 2 not in updated.search(["上海浦东世纪大道100号"], 5)[1]  # the removed entry is gone
    assert updated.search(["无关的文字"], 3)[1].tolist() == [[-1, -1, -1]]


def test_common_ngrams_alone_do_not_make_candidates_but_scores_stay_exact(monkeypatch):
    from mgeo_index.index import sparse as sp

    monkeypatch.setattr(sp, "COMMON_MIN_ENTRIES", 5)  # a small catalog where 广东省深圳市 is in every row
    texts = [f"广东省深圳市南山区中山路{i}号" for i in range(40)] + ["广东省深圳市福田区深南大道1号东方大厦",
                                                                    "广东省深圳市罗湖区人民南路2号国贸大厦"]
    index = sp.build_sparse(texts, list(range(100, 142)))
    query = "深圳福田深南大道1号东方大厦"
    scores, ids = index.search([query], 5)
    assert ids[0][0] == 140
    assert index._common[index.vocabulary["深圳"]] and not index._common[index.vocabulary["东方"]]
    # the pruned scores are the exact cosines of the candidates
    exact = index.matrix.dense() @ index._vectorize([query]).dense()[0]
    assert abs(scores[0][0] - exact[40]) < 1e-6
    # candidates only via rare n-grams: every entry returned shares one with the query (just 广东省深圳市 is not enough)
    rare = {g for g in sp.ngrams(query) if g in index.vocabulary and not index._common[index.vocabulary[g]]}
    returned = [texts[i - 100] for i in ids[0] if i >= 0]
    assert returned and all(rare & set(sp.ngrams(t)) for t in returned)
    assert "广东省深圳市罗湖区人民南路2号国贸大厦" not in returned
    # a query made only of common n-grams still searches every entry that shares one
    _, only_common = index.search(["广东省深圳市"], 3)
    assert (only_common[0] >= 0).all()
    # without pruning (nothing common) the same best answer
    index._common = np.zeros_like(index._common)
    assert index.search([query], 1)[1][0][0] == 140


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.9, 1.0]), min_size=0, max_size=300),
       k=st.integers(1, 50))
def test_top_k_is_the_stable_full_sort_with_its_ties(values, k):
    """_top sorts only what can make the top k: the same positions, in the same order, as a stable full sort,
    ties of the k-th value kept in position order (many equal scores, as short addresses give)."""
    sims = np.asarray(values, dtype=np.float32)
    assert sparse._top(sims, k).tolist() == np.argsort(-sims, kind="stable")[:k].tolist()


def test_pruned_search_scores_every_candidate_exactly(monkeypatch):
    """The pruned path (rare n-grams' entries, scored as a matrix-vector product) returns the exact cosine top k
    among the entries sharing a rare n-gram."""
    monkeypatch.setattr(sparse, "COMMON_MIN_ENTRIES", 3)
    texts = [f"浙江省杭州市西湖区文{i % 7}路{i}号" for i in range(60)] + ["浙江省杭州市上城区解放路1号"]
    index = sparse.build_sparse(texts, list(range(1000, 1061)))
    pruned = 0
    for query in ["杭州西湖文3路17号", "杭州文5路号", "上城解放路", "杭州市西湖区文", "西湖文2路33号", "杭州上城解放路1号"]:
        scores, ids = index.search([query], 8)
        q = index._vectorize([query])
        exact = index.matrix.dense() @ q.dense()[0]
        rare = [c for c in q.indices if not index._common[c]]
        if rare and len(rare) < len(q.indices):  # rare and common n-grams: the pruned path
            pruned += 1
            candidates = np.unique(np.concatenate([np.flatnonzero(index.matrix.dense()[:, c]) for c in rare]))
        else:  # only rare or only common ones: every entry sharing one
            candidates = np.flatnonzero(exact > 0)
        found = ids[0][ids[0] >= 0] - 1000
        assert len(found) == min(8, len(candidates)) and set(found) <= set(candidates)
        np.testing.assert_allclose(scores[0][: len(found)], exact[found], rtol=1e-5)  # exact cosines, best first
        assert (np.diff(scores[0][: len(found)]) <= 1e-7).all()
        left_out = np.setdiff1d(candidates, found)
        assert not left_out.size or exact[left_out].max() <= scores[0][len(found) - 1] + 1e-6  # none better left out
    assert pruned >= 2


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.sampled_from([1, 3, 8, 20]))
def test_bounded_pruned_search_equals_scoring_every_candidate(seed, k):
    """The bound (a candidate's rare n-grams' part plus at most its common part) spares exact scores only of
    entries that cannot make the top k: ids, scores and tie order are those of scoring every candidate
    (``BOUND_SLACK`` infinite keeps them all), on catalogs with many shared and repeated n-grams."""
    rng = np.random.default_rng(seed)
    roads, pois = ["文三路", "文二路", "天目山路", "教工路", "学院路"], ["大厦", "花园", "小区", "公寓", "中心"]
    texts = [f"浙江省杭州市西湖区{roads[rng.integers(5)]}{rng.integers(1, 40)}号{roads[rng.integers(5)][:2]}"
             f"{pois[rng.integers(5)]}{rng.integers(1, 9)}幢" for _ in range(150)]
    index = sparse.build_sparse(texts, list(range(150)))
    queries = [texts[i][rng.integers(0, 8):] for i in rng.integers(0, 150, 6)] + ["西湖区文三路", "杭州天目山路大厦"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sparse, "COMMON_MIN_ENTRIES", 10)  # read once, on the first search
        got = index.search(queries, k)
        patch.setattr(sparse, "BOUND_SLACK", np.inf)  # read on every search
        every = index.search(queries, k)
    np.testing.assert_array_equal(got[1], every[1])
    np.testing.assert_array_equal(got[0], every[0])
    assert got[1].shape == (len(queries), k)


def test_the_bound_leaves_most_candidates_unscored(monkeypatch):
    """Where a query's rare n-grams are each in many entries, few of those can make the top k."""
    monkeypatch.setattr(sparse, "COMMON_MIN_ENTRIES", 100)
    texts = [f"广东省深圳市南山区科技园{i % 50}栋{i}室" for i in range(400)]
    index = sparse.build_sparse(texts, list(range(400)))
    kept = []
    original = index._can_make_top
    monkeypatch.setattr(index, "_can_make_top", lambda rows, *rest: kept.append((rows.size, len(r := original(rows, *rest)))) or r)
    assert index.search(["深圳南山科技园12栋312室"], 5)[1][0][0] == 312
    assert kept and kept[0][0] > 100 and kept[0][1] < kept[0][0] / 4
