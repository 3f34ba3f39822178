import numpy as np
from hypothesis import given, settings as hsettings, strategies as st

from mgeo_index.compare.features import FEATURE_NAMES, compare_elements, explain, explain_parsed, extract_elements, pair_features_batch, without_admin


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


def _parsed(text, elements, **admin):
    fields = {f"{k}{x}": None for k in ("province", "city", "district", "town") for x in ("", "_code")}
    fields.update(inferred=[], ambiguous=[], lon=None, lat=None)
    fields.update(admin)
    out, pos = [], 0
    for label, span in elements:
        start = text.index(span, pos)
        out.append({"label": label, "text": span, "start": start, "end": start + len(span)})
        pos = start + len(span)
    return {"text": text, "elements": out, "admin": fields}


def test_explain_parsed_compares_admin_codes_inferred_levels_included():
    q = _parsed("南山中山路75号1号楼", [("district", "南山"), ("road", "中山路"), ("roadno", "75号"), ("houseno", "1号楼")],
                province="广东省", province_code="440000", city="深圳市", city_code="440300",
                district="南山区", district_code="440305", inferred=["province", "city"])
    c = _parsed("深圳市南山区中山路75号院2号楼东方科技园", [("city", "深圳市"), ("district", "南山区"), ("road", "中山路"),
                                          ("roadno", "75号院"), ("houseno", "2号楼"), ("poi", "东方科技园")],
                province="广东省", province_code="440000", city="深圳市", city_code="440300",
                district="南山区", district_code="440305", inferred=["province"])
    rows = explain_parsed(q, c)
    assert list(rows) == ["province", "city", "district", "road", "roadno", "poi", "building"]
    assert rows["city"] == {"state": "agree", "query": "深圳市", "candidate": "深圳市",
                            "text": "city agrees: 深圳市 (inferred for the query)"}
    assert rows["district"]["query"] == "南山区"  # the standard name, not the short form written
    assert rows["roadno"]["state"] == "agree"  # 75号 ~ 75号院: the numbers
    assert rows["building"] == {"state": "differ", "query": "1号楼", "candidate": "2号楼", "text": "building differs: 1号楼 vs 2号楼"}
    assert rows["poi"]["state"] == "only_b"
    other = _parsed("南京市鼓楼区中山路75号", [("city", "南京市"), ("district", "鼓楼区"), ("road", "中山路"), ("roadno", "75号")],
                    province="江苏省", province_code="320000", city="南京市", city_code="320100",
                    district="鼓楼区", district_code="320106", inferred=["province"])
    assert explain_parsed(other, c)["city"]["state"] == "differ"
    assert explain_parsed(other, c)["road"]["state"] == "agree"


def test_explain_parses_both_addresses():
    rows = explain("北京市朝阳区建国路88号3单元", "朝阳区建国路88号5单元")
    assert rows["district"]["state"] == "agree" and rows["district"]["candidate"] == "朝阳区"
    assert rows["roadno"]["state"] == "agree"
    assert rows["unit"]["state"] == "differ"


def test_road_numbers_on_another_road_are_shown_differing():
    """Two numbers on two different roads name two doors: the explanation says so (it said "roadno agrees: 75号"
    when the candidate wrote 190号 on another road), while the same number on both stays agreeing."""
    rows = explain("深圳市南山区中山路75号东方科技园9号楼", "深圳市南山区科技南路190号东方大厦")
    assert rows["road"]["state"] == "differ"
    assert rows["roadno"] == {"state": "differ", "query": "75号", "candidate": "190号",
                              "text": "roadno differs: 75号 vs 190号 (on another road)"}
    assert explain("深圳市南山区中山路75号", "深圳市南山区科技南路75号")["roadno"]["state"] == "agree"
    assert explain("深圳市南山区中山路75号", "深圳市南山区中山路190号")["roadno"]["text"] == "roadno differs: 75号 vs 190号"


def test_identical_addresses_have_maximal_similarity():
    (row,) = pair_features_batch(["北京市朝阳区建国路88号"], ["北京市朝阳区建国路88号"])
    f = dict(zip(FEATURE_NAMES, row))
    assert f["ratio"] == f["jaccard2"] == f["numbers_jaccard"] == f["len_ratio"] == 1.0
    assert f["roadno_agree"] == 1.0 and f["roadno_differ"] == f["roadno_only_a"] == 0.0
    assert f["b_in_a"] == f["a_in_b"] == 1.0
    # the parsed comparison: the same rows explain_parsed shows
    assert f["district_parsed_agree"] == f["road_parsed_agree"] == f["roadno_parsed_agree"] == 1.0
    assert f["roadno_parsed_ratio"] == 1.0 and f["centroids_known"] == 1.0 and f["centroid_log_km"] == 0.0


def test_parsed_features_see_inferred_admin_levels_and_distance():
    a, b, c = "深圳南山中山路75号", "广东省深圳市南山区中山路75号", "杭州市西湖区中山路75号"
    same, far = (dict(zip(FEATURE_NAMES, row)) for row in pair_features_batch([a, a], [b, c]))
    assert same["city_parsed_agree"] == 1.0  # 深圳 resolves to 深圳市 on both sides
    assert same["province_parsed_agree"] == 1.0  # inferred for the query
    assert far["city_parsed_differ"] == 1.0 and far["roadno_parsed_agree"] == 1.0
    assert same["centroid_log_km"] == 0.0 < 0.7 < far["centroid_log_km"] <= 1.0  # Shenzhen–Hangzhou ≈ 1,000 km
    # given parses are used as they are; missing ones are parsed in the same batch
    from mgeo_index.text.parser import parse

    np.testing.assert_array_equal(pair_features_batch([a], [c], parse([a]), parse([c])), pair_features_batch([a], [c]))


@given(st.text(max_size=40), st.text(max_size=40))
@hsettings(max_examples=200, deadline=None)
def test_features_are_finite_and_bounded_for_any_text(a, b):
    (f,) = pair_features_batch([a], [b])
    assert f.shape == (len(FEATURE_NAMES),) and f.dtype == np.float32
    assert np.isfinite(f).all() and (f >= 0).all() and (f <= 1).all()


def test_without_admin_keeps_what_lies_below_the_town():
    assert without_admin("江苏省南京市鼓楼区幕府山街道中央北路五塘村74号") == "中央北路五塘村74号"
    assert without_admin("北京市朝阳区") == "北京市朝阳区"  # nothing left below: the text itself
    assert without_admin("中山路88号") == "中山路88号"
