"""Gazetteer, element tagger (CRF algorithms checked by brute force) and the shipped parser."""
import gzip
import itertools
import json

import pytest
import torch

from mgeo_index.text.gazetteer import default_gazetteer
from mgeo_index.text.parser import parse
from mgeo_index.text.tagger import (
    Tagger, TaggerConfig, load_tagger, spans_from_tags, tags_from_spans,
)
from mgeo_index.training.tagger import entity_scores, split_of_text, to_example, train_tagger


# --------------------------------------------------------------------------- gazetteer


@pytest.fixture(scope="module")
def gaz():
    return default_gazetteer()


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
    yubei = gaz.resolve([("重庆", 1), ("渝北区", 3)])  # merged into 两江新区: followed through its townships
    assert (yubei["district"], yubei["district_code"]) == ("两江新区", "500157")
    assert gaz.resolve([("江北区", 3)])["district_code"] == "330205"  # today's 江北区 beats a former one
    yanbian = gaz.resolve([("延边", 2)])
    assert (yanbian["city"], yanbian["province"]) == ("延边朝鲜族自治州", "吉林省")


def test_directly_governed_units_and_towns(gaz):
    xiantao = gaz.resolve([("湖北省", 1), ("仙桃市", 2)])  # county-level city under the province
    assert (xiantao["district_code"], xiantao["city"]) == ("429004", None)
    dongguan = gaz.resolve([("东莞", 2), ("长安镇", 4)])  # a city without districts: towns hang under it
    assert (dongguan["city_code"], dongguan["town_code"]) == ("441900", "441900119")
    assert gaz.resolve([("不存在的地方", 3)])["province"] is None


# --------------------------------------------------------------------------- tagger algorithms


def _tiny_tagger(seed=0) -> Tagger:
    torch.manual_seed(seed)
    model = Tagger(TaggerConfig(chars=list("北京朝阳路号"), labels=["poi", "road"], dim=8, hidden=8, dropout=0.0)).eval()
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


def test_train_tagger_learns_a_small_fixture(tmp_path):
    roads = ["建国路", "中山路", "人民路", "解放路", "长江路"]
    rows = []
    for i in range(300):
        prov, dist = [("北京市", "朝阳区"), ("上海市", "浦东新区"), ("天津市", "和平区")][i % 3]
        elements = [["prov", prov], ["district", dist], ["road", roads[i % 5]], ["roadno", f"{i % 97 + 1}号"]]
        rows.append({"text": "".join(s for _, s in elements), "elements": elements})
    (tmp_path / "catalog").mkdir()
    for name in ("tagged_addresses_swei412.jsonl.gz", "tagged_addresses_ncap2019.jsonl.gz"):
        with gzip.open(tmp_path / "catalog" / name, "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    metrics = train_tagger(tmp_path, tmp_path / "model", minutes=0.25, log=lambda *_: None)
    assert metrics["test_f1"] > 0.9
    model = load_tagger(tmp_path / "model")
    assert model.tag(["北京市朝阳区人民路12号"]) == [[("prov", 0, 3), ("district", 3, 6), ("road", 6, 9), ("roadno", 9, 12)]]


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


def test_parse_keeps_road_names_that_contain_admin_names():
    (r,) = parse(["广州市越秀区北京路88号"])
    assert r["admin"]["province"] == "广东省" and r["admin"]["city_code"] == "440100"
    assert {"label": "road", "text": "北京路", "start": 6, "end": 9} in r["elements"]
