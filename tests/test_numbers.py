"""The number policy: a different road / house / building / floor / unit / room number is a different place."""
import csv
import random

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from mgeo_index import settings
from mgeo_index.compare.conflicts import number_conflicts, numbers_agree
from mgeo_index.compare.elements import EXPLAIN_ORDER
from mgeo_index.compare.features import compare_parsed, explain
from mgeo_index.query.match import score_sides
from mgeo_index.model import numbers
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.settings import LABELS
from mgeo_index.text import model_text
from mgeo_index.text.parser import parse
from mgeo_index.measure.number_set import CONFLICT_KINDS, CONTROL_KINDS, NUMBERED_LABELS, number_pairs


def conflicts(a: str, b: str) -> dict:
    return number_conflicts(*parse([model_text(a), model_text(b)]))


@pytest.fixture(scope="module")
def shipped():
    return load_cross_encoder(settings.DEFAULT_CROSS_MODEL)


@pytest.mark.parametrize("a, b, element", [
    ("盐田区盐田街道北山道247号", "盐田区盐田街道北山道274号", "roadno"),
    ("深圳市龙岗区嘉州美都194栋", "嘉州美都914栋", "building"),
    ("杭州西湖区文三路478号华星大厦7-6-1046", "文三路478号华星大厦7-16-1046", "unit"),
    ("南山区科技园B栋12楼", "南山区科技园B栋15层", "floor"),
    ("北京朝阳建国路88号院3号楼2单元501室", "北京朝阳建国路88号院3号楼2单元502室", "room"),
    ("湖南省岳阳市临湘市白云拂公馆152", "湖南省岳阳市临湘市白云拂公馆1592", None),  # bare digits, read two ways
])
def test_a_changed_number_is_a_conflict_naming_the_element_and_both_values(a, b, element):
    found = conflicts(a, b)
    assert found, (a, b)
    if element is not None:
        assert element in found and found[element][0] != found[element][1]


@pytest.mark.parametrize("a, b", [
    ("建国路四号", "建国路4号"),
    ("建国路８８号3号楼", "建国路88号院3号楼"),  # full-width digits; 88号院 is 88号
    ("北京朝阳建国路88号院3号楼2单元501室", "建国路八十八号院三号楼2单元501"),
    ("建国路4-6号", "建国路5号"),  # a range holds 5号
    ("南山区科技园B栋12F", "南山区科技园B栋十二楼"),
    ("建国路88号", "建国路88号3号楼"),  # a building on one side only
    ("红银路32号力征科技", "振兴路38号力征科技"),  # numbers of two different roads are not comparable
    ("天津市北辰区辰盛路沁芳里682", "北辰区辰盛路沁芳里682"),  # the same digits, however the tagger splits them
])
def test_equal_numbers_written_differently_and_one_sided_numbers_are_no_conflict(a, b):
    assert conflicts(a, b) == {}


@pytest.mark.parametrize("a, b, element", [
    ("北京市海淀区中关村大街4~6号", "北京市海淀区中关村大街46号", "roadno"),  # a range is not the number its digits run into
    ("深圳市南山区科技园3、5栋", "深圳市南山区科技园35栋", "building"),  # nor is a list
    ("北京市海淀区中关村大街4，6号", "北京市海淀区中关村大街46号", "roadno"),
    ("深圳市南山区桃源村1~3栋201", "深圳市南山区桃源村13栋201", "building"),
    ("北京市朝阳区SOHO现代城A座1201", "北京市朝阳区SOHO现代城B座1201", "building"),
    ("北京市朝阳区SOHO现代城A栋1201", "北京市朝阳区SOHO现代城B栋1201", "building"),
    ("深圳市福田区特区报业大厦B1层", "深圳市福田区特区报业大厦1层", "floor"),
    ("深圳市福田区特区报业大厦负一层", "深圳市福田区特区报业大厦1层", "floor"),
    ("深圳市福田区特区报业大厦-1层", "深圳市福田区特区报业大厦1层", "floor"),
    ("深圳市福田区深南大道6008号特区报业大厦1202室", "深圳市福田区深南大道6008号特区报业大厦3层", "floor"),  # room 1202 is on floor 12
    ("北京市西城区西直门南小街甲12号", "北京市西城区西直门南小街乙12号", "roadno"),
    ("浙江省杭州市余杭区静慎村三组", "浙江省杭州市余杭区静慎村五组", "group"),
    ("浙江省杭州市余杭区静慎村第三村民小组", "浙江省杭州市余杭区静慎村第五村民小组", "group"),
    ("上海市嘉定区北翟路二百零八弄3号", "上海市嘉定区北翟路280弄3号", "roadno"),
])
def test_numbers_as_people_write_them_conflict(a, b, element):
    found = conflicts(a, b)
    assert element in found, found
    assert conflicts(b, a).keys() == found.keys()  # either way round


@pytest.mark.parametrize("a, b", [
    ("特区报业大厦1201室", "特区报业大厦12楼01"),  # one room: floor and room written apart
    ("特区报业大厦1201室", "特区报业大厦12F-01"),
    ("特区报业大厦1201室", "特区报业大厦十二楼01室"),
    ("特区报业大厦1201室", "特区报业大厦12层"),  # the room's own floor
    ("北京市海淀区中关村大街4至6号", "北京市海淀区中关村大街5号"),  # a range holds its numbers
    ("北京市海淀区中关村大街21号-23号", "北京市海淀区中关村大街22号"),
    ("来巡路618号-622号", "来巡路621号"),  # however the tagger splits the range
    ("深圳市南山区科技园3、5栋", "深圳市南山区科技园5栋"),  # a list holds its numbers
    ("特区报业大厦B1层", "特区报业大厦负一层"), ("特区报业大厦地下二层", "特区报业大厦-2层"),  # one basement
    ("西直门南小街甲12号", "西直门南小街甲十二号"),
    ("静慎村三组", "静慎村3组"), ("北翟路二百零八弄3号", "北翟路208弄3号"),
    ("星座湖溪43-3单元-1楼", "星座湖溪43-3单元1楼"),  # a hyphen after a unit separates: floor 1, not a basement
    ("物流园520-521仓库3层", "物流园520-521仓库"),  # 521 ends a range: no room of floor 5
])
def test_one_number_written_otherwise_is_no_conflict(a, b):
    assert conflicts(a, b) == {} and conflicts(b, a) == {}


def test_another_branch_lane_is_a_conflict_however_the_tagger_labels_it():
    """51支弄 / 70支弄 of one 2000弄: the tagger reads one as a sub-road, the other as a road number, so no element
    compares them; the lane numbers, read off the text, do. The pair features, which read only the tagger's
    elements, stay as the heads were fitted."""
    a, b = "北翟路2000弄51支弄11号", "闵行区北翟路2000弄70支弄11号楼"
    qa, qb = parse([model_text(a), model_text(b)])
    assert number_conflicts(qa, qb) == {"lane": ("51支弄", "70支弄")}
    assert numbers.conflicting([qa], [qb]).tolist() == [True]
    assert explain(a, b)["lane"]["text"] == "lane differs: 51支弄 vs 70支弄"
    assert "lane" not in EXPLAIN_ORDER
    assert conflicts("北翟路2000弄51支弄11号", "北翟路2000弄51支弄11号楼") == {}
    assert conflicts("北翟路2000弄51支弄11号", "北翟路2000弄11号") == {}  # a lane on one side only


def test_numbers_agree_on_values_ranges_and_more_specific_writings():
    assert numbers_agree("building", "316栋", "d316幢") and numbers_agree("roadno", "12706", "12号")
    assert numbers_agree("room", "21-23号", "22号") and not numbers_agree("room", "21-23号", "24号")
    assert not numbers_agree("building", "194栋", "914栋") and not numbers_agree("roadno", "12", "123号")


def test_explanation_names_the_conflicting_element_and_both_values():
    rows = explain("盐田区盐田街道北山道247号", "盐田区盐田街道北山道274号")
    assert rows["roadno"]["state"] == "differ" and "247号" in rows["roadno"]["text"] and "274号" in rows["roadno"]["text"]
    qa, qb = parse(["湖南省岳阳市临湘市白云拂公馆152", "湖南省岳阳市临湘市白云拂公馆1592"])  # the tagger reads 15 | 2 and 15 | 9 | 2
    assert compare_parsed(qa, qb)["numbers"][:3] == ("differ", "152", "1592")


class _Cross:
    labels = ("not_match", "exact_match", "partial_match")  # another order than LABELS: columns follow labels
    decision_offsets = [0.0, 0.0, 0.0]
    number_policy = {"exact_match": 0.04, "partial_vs_not": 0.0}


def test_policy_takes_exact_match_off_conflicting_rows_only_and_keeps_probabilities_whole():
    probs = np.array([[0.01, 0.98, 0.01], [0.01, 0.98, 0.01], [0.30, 0.10, 0.60]], dtype=np.float32)
    decided = np.array([1, 1, 2])
    out, labels = numbers.apply(_Cross(), probs, decided, np.array([True, False, True]), "strict")
    assert labels[0] != 1 and labels[1] == 1 and labels[2] == 2
    assert out[0, 1] == pytest.approx(0.04) and out[2, 1] == pytest.approx(0.04)
    assert out[2, 2] / out[2, 0] == pytest.approx(2.0, rel=1e-5)  # the scorer's partial / not odds kept
    assert np.allclose(out.sum(1), 1.0, atol=1e-6) and np.array_equal(out[1], probs[1])
    assert probs[0, 1] == pytest.approx(0.98)  # inputs untouched
    same, same_labels = numbers.apply(_Cross(), probs, decided, np.array([True, False, True]), "loose")
    assert same is probs and same_labels is decided
    with pytest.raises(ValueError, match="strict, loose"):
        numbers.check_mode("lenient")


@given(hnp.arrays(np.float64, (6, 3), elements=st.floats(0.001, 1.0)), hnp.arrays(bool, 6),
       st.lists(st.floats(-2.0, 2.0), min_size=3, max_size=3))
def test_the_label_is_always_the_most_probable_class_shown(raw, conflicts, offsets):
    """Whatever the probabilities, offsets and conflicts: the shown probabilities sum to 1, the label is their
    argmax (no other class exceeds it), and a conflicting row shows the policy's P(exact_match) (the scorer's where
    lower), never as label."""
    from mgeo_index.model.decision import decide

    cross = _Cross()
    cross.decision_offsets = offsets
    probs = raw / raw.sum(axis=1, keepdims=True)
    calibrated, shown, labels = numbers.answer(cross, probs, decide(probs, offsets), conflicts, "strict")
    assert np.allclose(shown.sum(axis=1), 1.0)
    rows = np.arange(len(shown))
    assert (shown[rows, labels] >= shown.max(axis=1) - 1e-12).all()
    exact = cross.labels.index("exact_match")
    assert (labels[conflicts] != exact).all()
    assert np.allclose(shown[conflicts, exact], np.minimum(probs[conflicts, exact], 0.04))
    assert np.array_equal(calibrated[~conflicts], probs[~conflicts])  # ranking reads the calibrated ones


def test_shown_probabilities_fold_the_offsets_in():
    from mgeo_index.model.decision import shown

    probs = np.array([[0.3, 0.25, 0.45]])  # exact 0.3 < not 0.45, yet exact_match with an offset of 0.5
    out = shown(probs, [0.5, -0.3, 0.0], exact=0)
    expected = probs * np.exp([0.5, -0.3, 0.0])
    assert np.allclose(out, expected / expected.sum()) and out.argmax() == 0


def test_the_shipped_model_calls_a_changed_number_another_place_unless_loose(shipped):
    a, b = [model_text("盐田区盐田街道北山道247号"), model_text("深圳市龙岗区嘉州美都194栋")], \
        [model_text("盐田区盐田街道北山道274号"), model_text("嘉州美都914栋")]
    exact = shipped.labels.index("exact_match")
    probs, decided, _ = score_sides(shipped, a, b)
    assert not (decided == exact).any() and (probs[:, exact] < 0.1).all()
    loose, _, _ = score_sides(shipped, a, b, numbers="loose")
    assert (loose[:, exact] > probs[:, exact]).all()  # the scorer alone reads near-copies as the same place
    same, same_decided, _ = score_sides(shipped, [model_text("建国路八十八号院三号楼")], [model_text("建国路88号院3号楼")])
    assert shipped.labels[int(same_decided[0])] == "exact_match"


def test_the_shipped_model_carries_a_fitted_number_policy(shipped):
    policy = shipped.number_policy
    assert policy is not None and 0 < policy["exact_match"] < 0.2 and policy["pairs"] >= 50


def test_number_pairs_change_one_number_and_controls_keep_the_place():
    examples = [("山东省青岛市即墨市兰村镇五里村183号", [("prov", 0, 3), ("city", 3, 6), ("district", 6, 9), ("town", 9, 12),
                                              ("community", 12, 15), ("houseno", 15, 19)]),
                ("浙江省杭州市西湖区文三路", [("prov", 0, 3), ("city", 3, 6), ("district", 6, 9), ("road", 9, 12)])]
    pairs = number_pairs(examples)
    (text, changed, kind), = [row for row in pairs["changed"] if row[2] in NUMBERED_LABELS]
    assert kind == "houseno" and changed != text and changed.startswith("山东省青岛市即墨市兰村镇五里村") and changed.endswith("号")
    controls = {kind: b for _, b, kind in pairs["controls"] if kind in ("chinese_numerals", "full_width", "no_province_city")}
    assert controls == {"chinese_numerals": "山东省青岛市即墨市兰村镇五里村一百八十三号", "full_width": "山东省青岛市即墨市兰村镇五里村１８３号",
                        "no_province_city": "即墨市兰村镇五里村183号"}
    assert number_pairs(examples) == pairs  # seeded by the text


ROOM_ADDRESS = ("深圳市福田区深南大道6008号报业大厦1202室", [("city", 0, 3), ("district", 3, 6), ("road", 6, 10), ("roadno", 10, 15),
                                                 ("poi", 15, 19), ("roomno", 19, 24)])
BUILDING_ADDRESS = ("杭州市余杭区静慎村8栋3层", [("city", 0, 3), ("district", 3, 6), ("community", 6, 9), ("houseno", 9, 11),
                                          ("floorno", 11, 13)])


def test_number_pairs_write_numbers_as_people_do_both_ways_round():
    pairs = number_pairs([ROOM_ADDRESS, BUILDING_ADDRESS])
    kinds = {part: {kind for *_, kind in rows} for part, rows in pairs.items()}
    assert kinds["changed"] >= set(CONFLICT_KINDS) and kinds["controls"] >= set(CONTROL_KINDS)
    assert kinds["holds"] == {"range_member"}
    for part in ("changed", "controls"):  # both ways round
        writings = [(a, b) for a, b, kind in pairs[part] if kind in CONFLICT_KINDS or kind in CONTROL_KINDS]
        assert {(b, a) for a, b in writings} == set(writings)
    by_kind = {kind: (a, b) for a, b, kind in pairs["changed"] + pairs["controls"] + pairs["holds"]}
    a, b = by_kind["room_floor"]
    assert {a, b} & {ROOM_ADDRESS[0]} and any(x.endswith(("层", "楼")) for x in (a, b))
    a, b = by_kind["letter_building"]
    assert a[:9] == b[:9] == "杭州市余杭区静慎村" and a[9] != b[9] and a[9].isupper() and a[10:] == b[10:]
    assert "组" in by_kind["group_numerals"][0] and "弄" in by_kind["lane_numerals"][0]


def test_every_writing_of_the_number_set_reads_as_its_part_says():
    """The policy's reading of each writing: every conflict class a conflict, every control and range member none."""
    pairs = number_pairs([ROOM_ADDRESS, BUILDING_ADDRESS])
    rows = [(part, a, b, kind) for part, rs in pairs.items() for a, b, kind in rs if kind not in NUMBERED_LABELS]
    parsed = parse([model_text(x) for _, a, b, _ in rows for x in (a, b)])
    for i, (part, a, b, kind) in enumerate(rows):
        found = number_conflicts(parsed[2 * i], parsed[2 * i + 1])
        assert bool(found) == (part == "changed"), (kind, a, b, found)


def test_fit_number_policy_sets_the_share_of_exact_match_among_conflicting_pairs(shipped):
    from mgeo_index.training.calibrate import fit_number_policy

    rng = random.Random(0)
    examples = []
    for i in range(60):
        n = rng.randrange(10, 900)
        label = "exact_match" if i < 5 else "partial_match" if i < 35 else "not_match"
        examples.append((f"盐田区盐田街道北山道{n}号", f"盐田区盐田街道北山道{n + 1}号", LABELS.index(label)))
    examples.append(("盐田区北山道5号", "盐田区北山道5号", LABELS.index("exact_match")))  # no conflict: left out
    cross = load_cross_encoder(settings.DEFAULT_CROSS_MODEL)
    stats = fit_number_policy(cross, examples)
    assert stats["conflicting_pairs"] == 60 and stats["gold"]["exact_match"] == 5
    assert cross.number_policy["exact_match"] == pytest.approx(6 / 62, abs=1e-4)
    assert stats["nll_fitted_policy"] <= stats["nll_unfitted_policy"] + 1e-9


@pytest.fixture(scope="module")
def numbered_index(tmp_path_factory):
    from mgeo_index.catalog.build import build

    root = tmp_path_factory.mktemp("numbers")
    catalog = root / "catalog.csv"
    rows = ["盐田区盐田街道北山道247号", "盐田区盐田街道北山道274号", "盐田区盐田街道北山道24号", "龙岗区嘉州美都194栋",
            "龙岗区嘉州美都914栋", "南山区科技园中区科苑路15号", "南山区科技园中区科苑路51号", "福田区特区报业大厦1层",
            "福田区特区报业大厦B1层"]
    with open(catalog, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "address"])
        writer.writerows((f"E{i}", address) for i, address in enumerate(rows))
    build(catalog, root / "idx", id_column="id", device="cpu")
    return root / "idx", rows


def test_entries_that_conflict_with_each_other_are_never_both_exact_match(numbered_index):
    """A query naming neither floor: 1层 and B1层 cannot both be the place. Each answer's exact mass is shared, the
    label stays the most probable class shown."""
    from mgeo_index.query.resolver import open_resolver

    resolver = open_resolver(numbered_index[0], device="cpu")
    try:
        matches, = resolver.resolve(["福田区特区报业大厦"], top_k=4)
        alone, = resolver.resolve(["福田区特区报业大厦"], top_k=4, numbers="loose")
    finally:
        resolver.close()
    towers = [m for m in matches if "报业大厦" in m["address"]]
    assert len(towers) == 2 and sum(m["label"] == "exact_match" for m in towers) <= 1
    for m in matches:
        assert m["probability"] == max(m["probabilities"].values()) and abs(sum(m["probabilities"].values()) - 1) < 1e-5
    assert sum(m["label"] == "exact_match" for m in alone if "报业大厦" in m["address"]) == 2  # the scorer alone: both


def test_exclusive_shares_the_exact_mass_of_rivals():
    shown = np.array([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.7, 0.2, 0.1]])
    out, labels = numbers.exclusive(shown, [[1], [0], []], LABELS)
    assert out[0, 0] == pytest.approx(0.9 * 0.9 / 1.7) and out[1, 0] == pytest.approx(0.8 * 0.8 / 1.7)
    assert np.allclose(out.sum(axis=1), 1.0) and np.array_equal(out[2], shown[2])
    assert labels.tolist() == [LABELS.index("exact_match"), LABELS.index("partial_match"), LABELS.index("exact_match")]


def test_each_number_resolves_to_its_own_entry_and_the_others_rank_below(numbered_index):
    from mgeo_index.query.resolver import open_resolver

    index_dir, rows = numbered_index
    resolver = open_resolver(index_dir, device="cpu")
    try:
        results = resolver.resolve(rows, top_k=5)
        loose = resolver.resolve(rows, top_k=5, numbers="loose")
    finally:
        resolver.close()
    for address, matches, loose_matches in zip(rows, results, loose):
        assert matches[0]["address"] == address and matches[0]["label"] == "exact_match"
        assert all(m["label"] != "exact_match" for m in matches[1:])
        others = [m for m in matches[1:] if conflicts(address, m["address"])]
        assert others and all(m["probabilities"]["exact_match"] < 0.1 for m in others)
        assert {m["id"] for m in loose_matches} == {m["id"] for m in matches}  # the same pool, ordered by the scorer


def _cli(*args):
    from typer.testing import CliRunner

    from mgeo_index.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_the_policy_is_recorded_with_the_index_and_the_environment_or_a_flag_overrides_it(
        numbered_index, tmp_path, monkeypatch):
    import json
    import shutil

    from mgeo_index.query.resolver import open_resolver

    monkeypatch.delenv("MGEO_INDEX_NUMBERS", raising=False)
    index_dir = shutil.copytree(numbered_index[0], tmp_path / "idx")
    catalog = numbered_index[0].parent / "catalog.csv"
    query = "盐田区盐田街道北山道247号"

    def labels(*options):
        result = _cli("resolve", query, "--index-dir", index_dir, "--json", "--top-k", "3", *options)
        assert result.exit_code == 0, result.output
        return {m["address"]: m["label"] for m in json.loads(result.output)["matches"]}

    assert labels()["盐田区盐田街道北山道274号"] != "exact_match"  # strict by default
    assert labels("--numbers", "loose")["盐田区盐田街道北山道274号"] == "exact_match"  # the scorer alone says so
    result = _cli("build", catalog, "--index-dir", index_dir, "--id-column", "id", "--numbers", "loose")
    assert result.exit_code == 0, result.output
    assert labels()["盐田区盐田街道北山道274号"] == "exact_match"  # the index's own policy now
    assert labels("--numbers", "strict")["盐田区盐田街道北山道274号"] != "exact_match"
    assert _cli("build", catalog, "--index-dir", index_dir, "--id-column", "id").exit_code == 0
    resolver = open_resolver(index_dir, device="cpu")  # a rebuild without --numbers keeps the recorded one
    assert resolver.numbers == "loose"
    resolver.close()
    monkeypatch.setenv("MGEO_INDEX_NUMBERS", "strict")  # flag > environment > index, as for the profile
    assert open_resolver(index_dir, device="cpu", rerank=False).numbers == "strict"
    assert open_resolver(index_dir, device="cpu", rerank=False, numbers="loose").numbers == "loose"
    bad = _cli("resolve", query, "--index-dir", index_dir, "--numbers", "lenient")
    assert bad.exit_code != 0 and "strict, loose" in bad.output


def test_match_and_the_service_loader_follow_the_policy(numbered_index, tmp_path, monkeypatch):
    from mgeo_index.service import loader

    monkeypatch.delenv("MGEO_INDEX_NUMBERS", raising=False)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\n盐田区盐田街道北山道247号\t盐田区盐田街道北山道274号\n", encoding="utf-8")
    for options, exact in (((), False), (("--numbers", "loose"), True)):
        out = tmp_path / "out.tsv"
        result = _cli("match", "--file", pairs, "--out", out, "--pairwise", *options)
        assert result.exit_code == 0, result.output
        label = out.read_text(encoding="utf-8").splitlines()[1].split("\t")[2]
        assert (label == "exact_match") == exact
    monkeypatch.setenv("MGEO_INDEX_NUMBERS", "loose")
    out = tmp_path / "env.tsv"
    assert _cli("match", "--file", pairs, "--out", out, "--pairwise").exit_code == 0
    assert out.read_text(encoding="utf-8").splitlines()[1].split("\t")[2] == "exact_match"
    monkeypatch.delenv("MGEO_INDEX_NUMBERS")
    loaded = loader.load(numbered_index[0], device="cpu", numbers="loose")
    try:
        assert loaded.resolver.numbers == "loose"
        answer, = loader.score_pairs(loaded.resolver, [("盐田区盐田街道北山道247号", "盐田区盐田街道北山道274号")], False)
        assert answer["label"] == "exact_match"
    finally:
        loaded.resolver.close()


def test_a_normalize_job_records_its_policy_and_will_not_resume_under_another(numbered_index, tmp_path, monkeypatch):
    from mgeo_index.jobs import JobError, normalize_file

    monkeypatch.delenv("MGEO_INDEX_NUMBERS", raising=False)
    source = tmp_path / "stores.csv"
    source.write_text("store_id,address\nS1,盐田区盐田街道北山道247号\nS2,龙岗区嘉州美都914栋\n", encoding="utf-8")
    strict, loose = tmp_path / "strict.csv", tmp_path / "loose.csv"
    normalize_file(source, strict, numbered_index[0], device="cpu")
    normalize_file(source, loose, numbered_index[0], device="cpu", numbers="loose")
    with open(strict, encoding="utf-8") as fh:
        assert [r["status"] for r in csv.DictReader(fh)] == ["matched", "matched"]
    from mgeo_index import settings as mgeo_settings, store

    eng = store.connect(mgeo_settings.database_url(numbered_index[0]))
    try:
        jobs = {str(out): store.latest_job(eng, str(out.resolve())) for out in (strict, loose)}
        assert {out: job["params"]["numbers"] for out, job in jobs.items()} == {str(strict): "strict", str(loose): "loose"}
        store.update_job(eng, jobs[str(loose)]["id"], status="interrupted")  # as if it had stopped half way
    finally:
        eng.dispose()
    with pytest.raises(JobError, match="numbers 'loose' → 'strict'"):
        normalize_file(source, loose, numbered_index[0], device="cpu", numbers="strict")


def test_a_batch_reads_each_parse_once_and_answers_as_pair_by_pair():
    """number_conflicts_batch keeps what a parse says of its numbers for every pair it is in (a query against its
    candidates, an entry against several queries): the answers are those of each pair alone, in either order."""
    from mgeo_index.compare.conflicts import number_conflicts_batch

    texts = ["北京市朝阳区建国路88号soho现代城a座1201", "北京市朝阳区建国路88号soho现代城b座1201", "建国路88号12楼01",
             "中关村大街4~6号", "中关村大街46号", "中关村大街5号", "静慎村三组", "静慎村五组", "特区报业大厦b1层",
             "特区报业大厦1层", "西直门南小街甲12号", "西直门南小街乙12号", "上海市2000弄51支弄3号", "上海市2000弄70支弄3号"]
    parsed = parse(texts)
    first = [parsed[i] for i in range(len(texts)) for _ in range(len(texts))]  # each parse, the same object, again
    second = [parsed[j] for _ in range(len(texts)) for j in range(len(texts))]
    batch = number_conflicts_batch(first, second)
    assert batch == [number_conflicts(a, b) for a, b in zip(first, second)]
    assert sum(bool(found) for found in batch) >= 20  # letters, ranges, groups, basements, stems and lanes conflict
