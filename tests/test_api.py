"""The public Python API (mgeo_index.AddressIndex, parse, result types): what the README's Python
section promises, on the sample catalog with the shipped models."""
import json
import subprocess
import sys

import pytest

import mgeo_index
from mgeo_index import AddressIndex, Match, MatchResult, Parse, parse
from mgeo_index.query.resolver import open_resolver


@pytest.fixture(scope="module")
def idx(sample_index):
    with AddressIndex.open(sample_index, device="cpu") as opened:
        yield opened


def test_package_exports_the_facade_and_importing_it_is_cheap():
    assert {"AddressIndex", "Match", "MatchResult", "Parse", "parse"} <= set(mgeo_index.__all__)
    code = "import sys, mgeo_index; assert 'torch' not in sys.modules and 'faiss' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_resolve_one_query_gives_matches_and_many_give_lists(idx):
    one = idx.resolve("北京朝阳建国路88号", top_k=3)
    assert 1 <= len(one) <= 3 and all(isinstance(m, Match) for m in one)
    assert one[0].reranked and one[0].label in ("exact_match", "partial_match", "not_match")
    assert abs(sum(one[0].probabilities.values()) - 1) < 1e-4
    many = idx.resolve(["北京朝阳建国路88号", "上海徐汇漕溪北路1号"], top_k=3)
    assert len(many) == 2 and [m.id for m in many[0]] == [m.id for m in one]


def test_match_to_dict_is_exactly_the_resolvers_json(idx, sample_index):
    queries = ["北京朝阳建国路88号", "深圳南山中山路75号"]
    resolver = open_resolver(sample_index, device="cpu")
    try:
        raw = resolver.resolve(queries, top_k=4, explain=True)
    finally:
        resolver.engine.dispose()
    typed = idx.resolve(queries, top_k=4, explain=True)
    assert [[m.to_dict() for m in ms] for ms in typed] == raw
    assert json.dumps([m.to_dict() for m in typed[0]], ensure_ascii=False) == json.dumps(raw[0], ensure_ascii=False)
    assert [Match.from_dict(m) for m in raw[1]] == typed[1]
    plain = idx.resolve("北京朝阳建国路88号", rerank=False, top_k=2)
    assert not plain[0].reranked and set(plain[0].to_dict()) == {"id", "source_id", "address", "score", "fields"}


def test_match_one_pair_and_many(idx):
    result = idx.match("北京朝阳建国路88号", "北京市朝阳区建国路88号", explain=True)
    assert isinstance(result, MatchResult) and result.label in result.probabilities
    assert result.probability == result.probabilities[result.label]
    assert result.explain["road"]["state"] == "agree"
    pairs = idx.match([("北京朝阳建国路88号", "北京市朝阳区建国路88号"), ("北京朝阳建国路88号", "上海市徐汇区漕溪北路1号")])
    # a pair's probabilities do not move with its batch-mates (test_answers_do_not_depend_on_batch_mates_or_top_k below)
    assert pairs[0].label == result.label and pairs[0].explain is None
    assert pairs[0].probability == pytest.approx(result.probability, abs=1e-6)
    assert pairs[1].label == "not_match"
    with pytest.raises(TypeError):
        idx.match("北京朝阳建国路88号")


def test_parse_returns_typed_parses_with_the_cli_json():
    from mgeo_index.text.parser import parse as parse_dicts

    one = parse("北京朝阳建国路八十八号三单元")
    assert isinstance(one, Parse) and one.text == "北京朝阳建国路88号3单元"
    assert one.admin["district"] == "朝阳区" and one.get("road") == ["建国路"]
    assert one.to_dict() == parse_dicts(["北京朝阳建国路八十八号三单元"])[0]
    assert Parse.from_dict(one.to_dict()) == one
    assert [p.text for p in parse(["上海徐汇", "深圳南山"])] == ["上海徐汇", "深圳南山"]


def test_normalize_a_dataframe_like_a_job(idx):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"shop": ["a", "b", "c", "d"],
                          "addr": ["北京朝阳建国路88号", "", "北京朝阳建国路88号", "……"]}, index=[10, 11, 12, 13])
    out = idx.normalize(frame, address_column="addr")
    assert list(out.index) == [10, 11, 12, 13] and list(out["shop"]) == ["a", "b", "c", "d"]
    assert out.loc[11, "status"] == "rejected" and out.loc[13, "status"] == "rejected"
    assert out.loc[10, "status"] in ("matched", "ambiguous", "unmatched")
    same = ["status", "match_id", "label", "probability", "alternatives", "admin_district"]
    assert out.loc[10, same].tolist() == out.loc[12, same].tolist()  # the same address: one answer
    assert out.loc[10, "admin_district"] == "朝阳区"
    best = idx.resolve("北京朝阳建国路88号")[0]
    assert out.loc[10, "probability"] == best.probability
    clash = idx.normalize(frame.rename(columns={"shop": "status"}), address_column="addr")
    assert "mgeo_status" in clash.columns and list(clash["status"]) == ["a", "b", "c", "d"]
    with pytest.raises(KeyError, match="addr2"):
        idx.normalize(frame, address_column="addr2")


def test_add_and_remove_reopen_on_the_new_generation(sample_index_copy, tmp_path):
    delta = tmp_path / "delta.csv"
    delta.write_text("poi_id,name,address,city\nnew-1,中关村,北京市海淀区中关村大街27号,北京市\n", encoding="utf-8")
    with AddressIndex.open(sample_index_copy, device="cpu") as idx:
        before = len(idx)
        idx.add(delta)
        assert len(idx) == before + 1
        assert idx.resolve("北京海淀中关村大街27号", top_k=1)[0].source_id == "new-1"
        idx.remove(["new-1"])
        assert len(idx) == before and idx.check().clean


QUERIES = ["北京朝阳建国路88号", "深圳南山中山路75号东方科技园9号楼", "上海徐汇漕溪北路1号", "杭州西湖文三路478号华星时代广场A座",
           "广州市天河区柯木塱背坪村窑屋地西街四巷1号首层", "北京海淀东风路127号东方大厦"]


def test_answers_do_not_depend_on_batch_mates_or_top_k(idx):
    """The default backend is batch-independent: the same query gets the same candidates, labels and
    probabilities (within 1e-6) alone, in any batch, and each (query, entry) pair the same probabilities
    whatever --top-k sets the candidate pool to."""
    alone = [idx.resolve(q, top_k=5) for q in QUERIES]
    together = idx.resolve(QUERIES, top_k=5)
    reordered = idx.resolve(QUERIES[::-1] + QUERIES[:2], top_k=5)[: len(QUERIES)][::-1]
    for one, *others in zip(alone, together, reordered):
        for other in others:
            assert [m.id for m in one] == [m.id for m in other]
            assert [m.label for m in one] == [m.label for m in other]
            for a, b in zip(one, other):
                assert max(abs(a.probabilities[k] - b.probabilities[k]) for k in a.probabilities) <= 1e-6
                assert abs(a.score - b.score) <= 1e-6
    deeper = idx.resolve(QUERIES, top_k=20)
    shared = 0
    for few, many in zip(together, deeper):
        by_id = {m.id: m for m in many}
        for m in few:
            if m.id in by_id:
                shared += 1
                assert m.label == by_id[m.id].label
                assert max(abs(m.probabilities[k] - by_id[m.id].probabilities[k]) for k in m.probabilities) <= 1e-6
    assert shared >= len(QUERIES) * 3
