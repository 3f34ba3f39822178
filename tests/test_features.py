import numpy as np
from hypothesis import given, settings as hsettings, strategies as st

from mgeo_index.features import FEATURE_NAMES, compare_elements, explain, extract_elements, pair_features, without_admin


def test_extracts_admin_road_number_building_poi():
    assert extract_elements("北京市朝阳区建国路88号") == {
        "province": "北京市", "district": "朝阳区", "road": "建国路", "roadno": "88号"}
    e = extract_elements("人民中路2段70号1栋1单元1层成都时代凯悦假日酒店")
    assert (e["road"], e["roadno"], e["building"], e["unit"], e["floor"]) == ("人民中路2段", "70号", "1栋", "1单元", "1层")
    assert e["poi"] == "成都时代凯悦假日酒店"


def test_compare_uses_cores_of_elements():
    a = extract_elements("北京朝阳区建国路88号3栋")
    b = extract_elements("北京市朝阳区建国路88号5栋")
    states = compare_elements(a, b)
    assert states["district"] == states["road"] == states["roadno"] == "agree"
    assert states["building"] == "differ"


def test_explain_rows_say_what_differs():
    rows = explain("二道街228号1号楼", "二七区二道街228号院2号楼")
    assert rows["roadno"]["state"] == "agree"
    assert rows["building"] == {"state": "differ", "query": "1号楼", "candidate": "2号楼", "text": "building differs: 1号楼 vs 2号楼"}
    assert rows["district"]["state"] == "only_b"


def test_identical_addresses_have_maximal_similarity():
    f = dict(zip(FEATURE_NAMES, pair_features("北京市朝阳区建国路88号", "北京市朝阳区建国路88号")))
    assert f["ratio"] == f["jaccard2"] == f["numbers_jaccard"] == f["len_ratio"] == 1.0
    assert f["roadno_agree"] == 1.0 and f["roadno_differ"] == f["roadno_only_a"] == 0.0
    assert f["b_in_a"] == f["a_in_b"] == 1.0


@given(st.text(max_size=40), st.text(max_size=40))
@hsettings(max_examples=200, deadline=None)
def test_features_are_finite_and_bounded_for_any_text(a, b):
    f = pair_features(a, b)
    assert f.shape == (len(FEATURE_NAMES),) and f.dtype == np.float32
    assert np.isfinite(f).all() and (f >= 0).all() and (f <= 1).all()


def test_without_admin_keeps_what_lies_below_the_town():
    assert without_admin("江苏省南京市鼓楼区幕府山街道中央北路五塘村74号") == "中央北路五塘村74号"
    assert without_admin("北京市朝阳区") == "北京市朝阳区"  # nothing left below: the text itself
    assert without_admin("中山路88号") == "中山路88号"
