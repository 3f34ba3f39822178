"""The training recipe end to end on a tiny data folder in the shared data's layout (seconds, tiny model)."""
import gzip
import json
import random

import numpy as np
import pytest

from mgeo_index import engine
from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.settings import LABELS
from mgeo_index.training.train import TrainConfig, fit_temperature, train

ROADS = ["建国路", "人民路", "中山路", "解放路", "和平路", "新华路"]
PLACES = [("北京市", "朝阳区"), ("上海市", "徐汇区"), ("广州市", "天河区"), ("深圳市", "南山区")]


def _gz(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode("utf-8")))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("data")
    catalog = [f"{c}{d}{r}{n}号" for c, d in PLACES for r in ROADS for n in (8, 18, 88)]
    ccks = ["query_id\tquery\tcandidate\tlabel\tsplit_source"]
    for q in range(90):
        gold = rng.choice(catalog)
        query = gold.replace("市", "", 1).replace("区", "", 1)
        others = rng.sample(catalog, 3)
        ccks.append(f"q{q}\t{query}\t{gold}\texact_match\tx")
        ccks.append(f"q{q}\t{query}\t{others[0][:-3]}\tpartial_match\tx")
        ccks += [f"q{q}\t{query}\t{o}\tnot_match\tx" for o in others[1:] if o != gold]
    _gz(root / "pairs" / "ccks2021_train.tsv.gz", "\n".join(ccks) + "\n")
    sz = ["addr1\taddr2\tlabel"] + [f"{a[3:]}\t{a}\t1" for a in catalog] + [f"{a[3:]}\t{rng.choice(catalog)}\t0" for a in catalog]
    _gz(root / "pairs" / "shenzhen_val.tsv.gz", "\n".join(sz) + "\n")
    _gz(root / "catalog" / "ccks2021_poi_candidates.tsv.gz", "text\tfreq\n" + "".join(f"{a}\t1\n" for a in catalog))
    _gz(root / "catalog" / "shenzhen_standard_addresses.txt.gz", "\n".join(catalog) + "\n")
    tagged = [json.dumps({"text": f"{c}{d}{r}1号", "split": "train", "elements": [["city", c], ["district", d], ["road", r], ["roadno", "1号"]]}, ensure_ascii=False)
              for c, d in PLACES for r in ROADS]
    _gz(root / "catalog" / "tagged_addresses_swei412.jsonl.gz", "\n".join(tagged) + "\n")
    _gz(root / "catalog" / "tagged_addresses_ncap2019.jsonl.gz", tagged[0] + "\n")
    admin = ["level,name,code,short_name,province,city,county"] + [f"4,{d}街道,,,{c},{c},{d}" for c, d in PLACES]
    _gz(root / "admin" / "jionlp_4level.csv.gz", "\n".join(admin) + "\n")
    return root


def test_train_writes_loadable_models_and_metrics_and_resumes(tiny_data, tmp_path):
    cfg = TrainConfig(data_dir=tiny_data, out=tmp_path / "run", hidden=32, layers=1, heads=2, intermediate=64,
                      mlm_minutes=0.02, bi_minutes=0.02, cross_minutes=0.02, mlm_batch=16, bi_batch=8, cross_batch=16,
                      log=lambda _: None)
    metrics = train(cfg)
    bi, cross = load_bi_encoder(cfg.out / "bi"), load_cross_encoder(cfg.out / "cross")
    assert metrics["fingerprints"] == {"bi": bi.fingerprint, "cross": cross.fingerprint}
    assert set(cross.labels) == set(LABELS) and bi.dim == 32
    for name in ("ccks_dev", "shenzhen_dev"):
        assert 0.0 <= metrics[name]["macro_f1"] <= 1.0 and metrics[name]["n"] > 0
    assert metrics["stages"]["mlm"]["steps"] >= 1 and metrics["stages"]["cross"]["steps"] >= 1
    assert 0 <= metrics["ccks_dev_retrieval"]["recall@10"] <= 1
    probs = engine.score_pairs(cross, ["北京朝阳建国路8号"], ["北京市朝阳区建国路8号"])
    assert probs.shape == (1, 3) and abs(probs.sum() - 1) < 1e-5
    assert json.loads((cfg.out / "metrics.json").read_text())["config"]["hidden"] == 32

    # finished stages are skipped on a re-run: the same models come back
    again = train(cfg)
    assert again["fingerprints"] == metrics["fingerprints"]
    assert again["stages"]["mlm"]["steps"] == metrics["stages"]["mlm"]["steps"]

    # a larger pretraining budget continues from the checkpoint, then retrains the stages after it
    # (the first run may overshoot its budget on a busy machine: ask for more than it recorded)
    cfg.mlm_minutes = metrics["stages"]["mlm"]["minutes"] + 0.02
    longer = train(cfg)
    assert longer["stages"]["mlm"]["steps"] > metrics["stages"]["mlm"]["steps"]
    assert longer["stages"]["mlm"]["minutes"] >= cfg.mlm_minutes
    assert longer["fingerprints"]["bi"] != metrics["fingerprints"]["bi"]


def test_fit_temperature_recovers_the_scale():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(size=(4000, 3)) * 2
    gold = np.array([rng.choice(3, p=np.exp(l) / np.exp(l).sum()) for l in true_logits])
    assert fit_temperature(true_logits * 3, gold) == pytest.approx(3.0, rel=0.15)


def test_decision_offsets_raise_macro_f1_of_an_underpredicted_class():
    from mgeo_index.metrics import classification_report
    from mgeo_index.training.train import fit_decision_offsets

    rng = np.random.default_rng(0)
    labels = ("exact_match", "partial_match", "not_match")
    gold = rng.choice(3, size=600, p=[0.15, 0.35, 0.5])
    # a model that is right but timid about exact_match: its probability is scaled down
    logits = rng.normal(0, 1, (600, 3)) + 2.0 * np.eye(3)[gold] - np.array([1.5, 0.0, 0.0])
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    offsets = fit_decision_offsets(probs, gold, labels)
    assert offsets[2] == 0.0 and offsets[0] > 0.5
    before = classification_report(gold, probs.argmax(1), labels)["macro_f1"]
    after = classification_report(gold, np.argmax(np.log(probs) + offsets, 1), labels)["macro_f1"]
    assert after > before + 0.02


def test_the_network_must_earn_its_running_time():
    from mgeo_index.training.train import NETWORK_MIN_GAIN, choose_scorer

    assert choose_scorer({"network": 0.50, "stacked": 0.40, "features": 0.45}) == "stacked"
    assert choose_scorer({"network": 0.50, "stacked": 0.40, "features": 0.40 + NETWORK_MIN_GAIN / 2}) == "features"
    assert choose_scorer({"network": 0.30, "stacked": 0.40, "features": 0.45}) == "network"
