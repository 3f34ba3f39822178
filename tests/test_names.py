"""Names decide among places at one door: two names that share nothing are two places; their variants are one."""
import csv
import time

import numpy as np
import pytest

from mgeo_index.measure.name_set import CONFLICT_KINDS, CONTROL_KINDS, name_pairs
from mgeo_index.model import numbers
from mgeo_index.compare.conflicts import conflicts, number_conflicts
from mgeo_index.compare.features import explain
from mgeo_index.compare.names import name_conflict, name_of
from mgeo_index.settings import LABELS
from mgeo_index.text.parser import parse


def _conflicts(a: str, b: str) -> dict:
    return conflicts(*parse([a, b]))


@pytest.mark.parametrize("a, b, names", [
    ("民和路与飞虹路交叉口西100米名仕之家", "民和路与飞虹路交叉口西100米21世纪不动产", ("名仕之家", "21世纪不动产")),
    ("泰西路10号南京浦口三河汽车修理厂", "泰西路10号果唯伊(泰西路店)", ("南京浦口三河汽车修理厂", "果唯伊")),
    ("中山路32号国土局", "中山路32号溧水区建筑工程局", ("国土局", "建筑工程局")),
    # a legal form in common is no name in common: two companies at one door
    ("北院大道38号润彩塑模有限公司", "北院大道38号台州溢豪模具有限公司", ("润彩塑模有限公司", "台州溢豪模具有限公司")),
    ("月罗公路340号高仓电气有限公司", "月罗公路340号上海六丰汽车销售有限公司", ("高仓电气有限公司", "上海六丰汽车销售有限公司")),
    # one mall, two shops in it: the sub-places decide
    ("浦东新区证大大拇指广场希莉娅", "浦东新区证大大拇指广场阿玛施", ("希莉娅", "阿玛施")),
    ("海岸城购物中心星巴克", "海岸城购物中心麦当劳", ("星巴克", "麦当劳")),
])
def test_two_names_that_share_nothing_at_one_door_are_two_places(a, b, names):
    found = _conflicts(a, b)
    assert found == {"name": names}
    assert _conflicts(b, a) == {"name": names[::-1]}


@pytest.mark.parametrize("a, b", [
    ("文明路564号肯德基(万达店)", "文明路564号肯德基"),  # a branch in parentheses
    ("文明路564号肯德基万达店", "文明路564号肯德基(万达分店)"),  # 店 / 分店
    ("上海市江田东路200号美维科技", "江田东路200号上海美维电子有限公司"),  # a company's names
    ("燕城大道与迎宾路交汇处时代·天悦", "燕城大道与迎宾路交汇处时代天悦"),  # punctuation
    ("建国路88号ＳＯＨＯ现代城", "建国路88号soho现代城"),  # width
    ("建国路88号", "建国路88号21世纪不动产"),  # a name on one side only
    ("中山门大街99号北门", "中山门大街99号炒饭王"),  # a gate is no name
    ("五合路6号南京东森物流有限公司", "五合路6号东森物流"),  # a company with and without its legal form
    ("海岸城购物中心星巴克", "海岸城购物中心星巴克(南山店)"),  # one shop of one mall, its branch written
    ("鸿博家园2期b区1号楼", "鸿博家园2期(小红门八号路)鸿博家园2期b区1号楼"),  # a phase and a zone name no shop
    ("福建农林大学北区", "建新镇福建农林大学北苑5号楼"),  # sides of a campus
])
def test_name_variants_and_one_sided_names_are_no_conflict(a, b):
    assert "name" not in _conflicts(a, b)


def test_a_name_field_is_the_name_and_the_text_around_it_still_counts():
    qa, qb = parse(["民和路与飞虹路交叉口西100米", "民和路与飞虹路交叉口西100米21世纪不动产"])
    assert name_of(qa) == ""
    assert name_conflict({**qa, "name": "名仕之家"}, qb) == ("名仕之家", "21世纪不动产")
    assert name_conflict({**qa, "name": "21世纪不动产(民和店)"}, qb) is None
    assert name_conflict({**qa, "name": "北门"}, qb) is None  # nothing left to tell a place


def test_the_explanation_shows_both_names_and_the_pair_features_do_not_read_them():
    rows = explain("文明路564号名仕之家", "文明路564号21世纪不动产")
    assert rows["name"]["state"] == "differ" and rows["name"]["text"] == "name differs: 名仕之家 vs 21世纪不动产"
    assert number_conflicts(*parse(["文明路564号名仕之家", "文明路564号21世纪不动产"])) == {}


def test_a_name_conflict_never_raises_the_probability_of_the_same_place():
    class _Cross:
        labels = list(LABELS)
        number_policy = {"exact_match": 0.04, "partial_vs_not": 0.0}
        decision_offsets = None

    probs = np.array([[0.002, 0.1, 0.898], [0.9, 0.05, 0.05]])
    out, labels = numbers.apply(_Cross(), probs, np.array([2, 0]), np.array([True, True]), "strict")
    exact = LABELS.index("exact_match")
    assert out[0, exact] == pytest.approx(0.002) and out[1, exact] == pytest.approx(0.04)
    assert np.allclose(out.sum(axis=1), 1.0) and (labels != exact).all()


def test_name_pairs_pair_entries_at_one_door_and_write_names_otherwise():
    entries = ["文明路564号名仕之家", "文明路564号21世纪不动产", "文明路564号顺丰窗帘", "文明路564号顺丰家具",
               "文明路564号名仕之家(东门)", "建国路88号肯德基(万达店)", "建国路88号时代·天悦"]
    pairs = name_pairs(entries, parse(entries))
    changed = {(a, b): kind for a, b, kind in pairs["changed"]}
    assert changed[("文明路564号名仕之家", "文明路564号21世纪不动产")] == "name_other"
    assert changed[("文明路564号21世纪不动产", "文明路564号名仕之家")] == "name_other"  # both ways round
    assert changed[("文明路564号顺丰窗帘", "文明路564号顺丰家具")] == "name_shared"
    assert ("文明路564号名仕之家", "文明路564号名仕之家(东门)") not in changed  # one name holds the other
    controls = {(a, b): kind for a, b, kind in pairs["controls"]}
    assert controls[("建国路88号肯德基(万达店)", "建国路88号肯德基")] == "branch_dropped"
    assert controls[("建国路88号肯德基(万达店)", "建国路88号肯德基万达店")] == "branch_unbracketed"
    assert controls[("建国路88号时代·天悦", "建国路８８号时代天悦")] == "name_width"
    assert {k for _, _, k in pairs["changed"]} <= set(CONFLICT_KINDS)
    assert {k for _, _, k in pairs["controls"]} <= set(CONTROL_KINDS)
    assert name_pairs(entries, parse(entries)) == pairs  # seeded
    for a, b, _ in pairs["controls"]:
        assert "name" not in _conflicts(a, b)


@pytest.fixture(scope="module")
def shops_index(tmp_path_factory):
    from mgeo_index.catalog.build import build

    root = tmp_path_factory.mktemp("names")
    catalog = root / "catalog.csv"
    rows = ["福田区文明路564号名仕之家", "福田区文明路564号21世纪不动产", "福田区文明路564号顺丰窗帘",
            "福田区建国路88号肯德基(万达店)", "南山区科苑路15号星巴克"]
    with open(catalog, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "address"])
        writer.writerows((f"S{i}", address) for i, address in enumerate(rows))
    build(catalog, root / "idx", id_column="id", device="cpu")
    return root / "idx", rows


def test_at_one_door_the_shop_named_comes_first_and_its_neighbours_are_not_the_place(shops_index):
    from mgeo_index.query.resolver import open_resolver

    index_dir, rows = shops_index
    resolver = open_resolver(index_dir, device="cpu")
    try:
        named, = resolver.resolve(["福田区文明路564号名仕之家"], top_k=3)
        neighbours, = resolver.resolve(["福田区文明路564号链家地产"], top_k=3, explain=True)
    finally:
        resolver.close()
    assert named[0]["address"] == rows[0] and named[0]["label"] == "exact_match"
    assert all(m["label"] != "exact_match" for m in named[1:])
    assert all(m["label"] != "exact_match" for m in neighbours)  # a shop the catalog lacks: none of its neighbours
    other = next(m for m in neighbours if m["address"] == rows[1])
    assert other["explain"]["name"]["state"] == "differ"


def _cli(*args):
    from typer.testing import CliRunner

    from mgeo_index.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


SHOPS = [("P1", "福田区文明路564号", "名仕之家"), ("P2", "福田区文明路564号", "21世纪不动产"),
         ("P3", "福田区文明路564号", "顺丰窗帘"), ("P4", "南山区科苑路15号", "星巴克(科技园店)"),
         ("P5", "南山区科苑路15号星巴克(科技园店)", "星巴克")]


@pytest.fixture(scope="module")
def named_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("named")
    catalog = root / "shops.csv"
    with open(catalog, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["poi_id", "address", "name", "category"])
        writer.writerows((i, address, name, "shop") for i, address, name in SHOPS)
    built = _cli("build", catalog, "--index-dir", root / "idx", "--id-column", "poi_id", "--name-column", "name",
                 "--device", "cpu")
    assert built.exit_code == 0, built.output
    assert "name 'name'" in built.output
    return root


def test_a_catalog_kept_as_name_and_address_matches_shop_by_shop(named_index):
    """Three shops at one door: each by its name comes first as exact_match, its neighbours never; an entry whose
    address already writes its name is stored once, not with the name twice."""
    import json

    out = _cli("resolve", "文明路564号", "文明路564号", "文明路564号链家地产", "--name", "名仕之家", "--name",
               "21世纪不动产", "--name", "", "--index-dir", named_index / "idx", "-k", "3", "--json", "--device", "cpu")
    assert out.exit_code == 0, out.output
    first, second, unnamed = [json.loads(line) for line in out.output.splitlines()]
    assert first["name"] == "名仕之家" and "name" not in unnamed
    for answer, shop in ((first, "P1"), (second, "P2")):
        best, *rest = answer["matches"]
        assert best["source_id"] == shop and best["label"] == "exact_match"
        assert best["name"] == dict((i, n) for i, _, n in SHOPS)[shop] and best["address"] == "福田区文明路564号"
        assert all(m["label"] != "exact_match" for m in rest if m["address"] == "福田区文明路564号")


def test_a_named_query_against_a_shop_of_another_name_explains_both_names(named_index):
    from mgeo_index.api import AddressIndex

    with AddressIndex.open(named_index / "idx", device="cpu") as idx:
        matches = idx.resolve("福田区文明路564号", names="链家地产", top_k=5, explain=True)
        plain = idx.resolve(["福田区文明路564号链家地产"], top_k=5)[0]
        with pytest.raises(ValueError, match="2 queries but 1 names"):
            idx.resolve(["a", "b"], names=["c"])
    assert all(m.label != "exact_match" for m in matches)
    other = next(m for m in matches if m.source_id == "P2")
    assert other.name == "21世纪不动产" and other.explain["name"]["state"] == "differ"
    assert other.explain["name"]["text"] == "name differs: 链家地产 vs 21世纪不动产"
    assert all(m.label != "exact_match" for m in plain if m.source_id in ("P1", "P2", "P3"))


def test_resolve_refuses_names_that_do_not_pair_with_its_queries(named_index):
    out = _cli("resolve", "文明路564号", "--name", "a", "--name", "b", "--index-dir", named_index / "idx")
    assert out.exit_code == 2 and "once per query" in out.output


def test_normalize_with_a_name_column_ties_each_store_to_its_shop(named_index, tmp_path):
    stores = tmp_path / "stores.csv"
    with open(stores, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["store", "addr", "shop"])
        writer.writerows([("s1", "福田区文明路564号", "名仕之家"), ("s2", "福田区文明路564号", "21世纪不动产"),
                          ("s3", "福田区文明路564号", "名仕之家"), ("s4", "福田区文明路564号", "链家地产")])
    out = tmp_path / "out.csv"
    ran = _cli("normalize", stores, "--index-dir", named_index / "idx", "--out", out, "--address-column", "addr",
               "--id-column", "store", "--name-column", "shop", "--device", "cpu")
    assert ran.exit_code == 0, ran.output
    with open(out, encoding="utf-8", newline="") as fh:
        rows = {r["store"]: r for r in csv.DictReader(fh)}
    assert (rows["s1"]["match_id"], rows["s1"]["label"]) == ("P1", "exact_match")
    assert (rows["s2"]["match_id"], rows["s2"]["label"]) == ("P2", "exact_match")
    assert rows["s3"]["match_id"] == "P1"  # a repeat: one answer
    assert rows["s4"]["label"] != "exact_match" and rows["s4"]["status"] != "matched"


def test_the_service_takes_a_name_with_its_query(named_index):
    from fastapi.testclient import TestClient

    from mgeo_index.service.app import ServeConfig, create_app

    with TestClient(create_app(ServeConfig(index_dir=named_index / "idx", device="cpu"))) as client:
        deadline = time.monotonic() + 300
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        one = client.post("/v1/resolve", json={"query": "福田区文明路564号", "name": "21世纪不动产", "top_k": 3})
        many = client.post("/v1/resolve", json={"queries": ["福田区文明路564号", "福田区文明路564号"],
                                                "names": ["名仕之家", None], "top_k": 3})
        unpaired = client.post("/v1/resolve", json={"queries": ["福田区文明路564号"], "names": ["a", "b"]})
        misplaced = client.post("/v1/resolve", json={"query": "福田区文明路564号", "names": ["a"]})
    assert one.status_code == 200 and one.json()["name"] == "21世纪不动产"
    assert one.json()["matches"][0]["source_id"] == "P2" and one.json()["matches"][0]["name"] == "21世纪不动产"
    named, plain = many.json()["results"]
    assert named["matches"][0]["source_id"] == "P1" and "name" not in plain
    assert unpaired.status_code == 422 and misplaced.status_code == 422


def test_a_name_column_is_read_checked_and_kept_by_a_rebuild(tmp_path):
    from mgeo_index.catalog.reader import CatalogError, read_catalog

    path = tmp_path / "c.csv"
    path.write_text("id,address,name\n1,文明路564号,名仕之家\n2,文明路564号,\n3,文明路564号,名仕\x07之家\n"
                    "4,文明路564号名仕之家,名仕之家\n", encoding="utf-8")
    reader = read_catalog(path, id_column="id", name_column="NAME")
    (rows, rejects), = list(reader.chunks())
    assert reader.name_column == "name"
    assert [(r.source_id, r.name, r.text) for r in rows] == [
        ("1", "名仕之家", "文明路564号名仕之家"), ("2", None, "文明路564号"), ("4", "名仕之家", "文明路564号名仕之家")]
    assert [r.line for r in rejects] == [4] and "control character" in rejects[0].reason and "'name'" in rejects[0].reason
    with pytest.raises(CatalogError, match="also the address"):
        read_catalog(path, address_column="address", name_column="address")


def test_normalize_explains_each_answer_with_both_values_and_review_reads_its_output(named_index, tmp_path):
    import json

    from mgeo_index.review.queue import _job_rows

    stores = tmp_path / "stores.csv"
    stores.write_text("store,addr,shop\ns1,福田区文明路564号,名仕之家\ns4,福田区文明路564号,链家地产\ns5,,x\n",
                      encoding="utf-8")
    out = tmp_path / "out.csv"
    ran = _cli("normalize", stores, "--index-dir", named_index / "idx", "--out", out, "--address-column", "addr",
               "--name-column", "shop", "--explain", "--device", "cpu")
    assert ran.exit_code == 0, ran.output
    with open(out, encoding="utf-8", newline="") as fh:
        header = next(csv.reader(fh))
        fh.seek(0)
        rows = {r["store"]: r for r in csv.DictReader(fh)}
    assert header[-1] == "explain"
    same, other = json.loads(rows["s1"]["explain"]), json.loads(rows["s4"]["explain"])
    assert same["roadno"] == {"state": "agree", "query": "564号", "candidate": "564号", "text": "roadno agrees: 564号"}
    assert "name" not in same
    assert other["name"]["state"] == "differ" and other["name"]["query"] == "链家地产"
    assert rows["s5"]["status"] == "rejected" and rows["s5"]["explain"] == ""
    assert [(a, s) for a, _, s, _ in _job_rows(out, "csv", "addr")] == [
        ("福田区文明路564号", rows["s1"]["status"]), ("福田区文明路564号", rows["s4"]["status"]), ("", "rejected")]


def test_answers_carry_the_entrys_own_columns_and_a_job_adds_those_asked_for(named_index, tmp_path):
    import json

    from mgeo_index.review.queue import _job_rows

    answer = _cli("resolve", "福田区文明路564号", "--name", "名仕之家", "--index-dir", named_index / "idx", "-k", "1",
                  "--json", "--device", "cpu")
    assert json.loads(answer.output)["matches"][0]["fields"] == {"name": "名仕之家", "category": "shop"}
    stores = tmp_path / "stores.csv"
    stores.write_text("store,addr,shop,status\ns1,福田区文明路564号,名仕之家,open\ns2,北京市海淀区中关村大街1号,,open\n"
                      "s3,,x,open\n", encoding="utf-8")
    out = tmp_path / "out.csv"
    ran = _cli("normalize", stores, "--index-dir", named_index / "idx", "--out", out, "--address-column", "addr",
               "--name-column", "shop", "--catalog-columns", "category,name", "--explain", "--device", "cpu")
    assert ran.exit_code == 0, ran.output
    with open(out, encoding="utf-8", newline="") as fh:
        header = next(csv.reader(fh))
        fh.seek(0)
        rows = {r["store"]: r for r in csv.DictReader(fh)}
    assert header[-3:] == ["mgeo_match_category", "mgeo_match_name", "mgeo_explain"]  # the input has a status
    assert (rows["s1"]["mgeo_match_category"], rows["s1"]["mgeo_match_name"]) == ("shop", "名仕之家")
    for store in ("s2", "s3"):  # tied to no entry: empty
        assert rows[store]["mgeo_status"] in ("unmatched", "rejected") and rows[store]["mgeo_match_category"] == ""
    assert [s for _, _, s, _ in _job_rows(out, "csv", "addr")] == [rows[s]["mgeo_status"] for s in ("s1", "s2", "s3")]
    every = _cli("normalize", stores, "--index-dir", named_index / "idx", "--out", tmp_path / "all.csv",
                 "--address-column", "addr", "--catalog-columns", "all", "--device", "cpu")
    assert every.exit_code == 0 and "mgeo_match_category" in (tmp_path / "all.csv").read_text(encoding="utf-8")
    unknown = _cli("normalize", stores, "--index-dir", named_index / "idx", "--out", tmp_path / "x.csv",
                   "--address-column", "addr", "--catalog-columns", "lon", "--device", "cpu")
    assert unknown.exit_code == 1 and "'lon' is not a column of the catalog; it has 'name', 'category'" in unknown.output
    assert not (tmp_path / "x.csv").exists()


def test_a_frame_normalized_in_python_gets_the_same_columns(named_index):
    pd = pytest.importorskip("pandas", reason="the pandas extra is not installed")
    from mgeo_index.api import AddressIndex

    frame = pd.DataFrame({"addr": ["福田区文明路564号", "福田区文明路564号"], "shop": ["21世纪不动产", "链家地产"]})
    with AddressIndex.open(named_index / "idx", device="cpu") as idx:
        out = idx.normalize(frame, address_column="addr", name_column="shop", catalog_columns=["name"], explain=True)
    assert list(out.columns[-2:]) == ["match_name", "explain"]
    assert out.loc[0, "match_id"] == "P2" and out.loc[0, "match_name"] == "21世纪不动产"
    assert out.loc[1, "label"] != "exact_match"


def test_the_variant_test_sets_share_one_report_and_say_what_is_wrong(tmp_path):
    result = _cli("eval", "numbers", "--split", "train", "--data", tmp_path)
    assert result.exit_code == 1 and "--split must be dev or test, not 'train'" in result.output
    missing = _cli("eval", "names", "--data", tmp_path)  # no CCKS catalog there: one line, no traceback
    assert missing.exit_code == 1 and "Traceback" not in missing.output
