"""The training recipe end to end on a tiny data folder in the shared data's layout (seconds, tiny model)."""
import gzip
import json
import random

import numpy as np
import pytest

from mgeo_index import settings
from mgeo_index.runtime import inference
from mgeo_index.query import labelling
from mgeo_index.model.bi_encoder import load_bi_encoder
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.settings import LABELS
from mgeo_index.training.calibrate import fit_temperature
from mgeo_index.training.train import TrainConfig, train

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
        source = "round2_train" if q % 2 else "round1_train_fold0"
        ccks.append(f"q{q}\t{query}\t{gold}\texact_match\t{source}")
        ccks.append(f"q{q}\t{query}\t{others[0][:-3]}\tpartial_match\t{source}")
        ccks += [f"q{q}\t{query}\t{o}\tnot_match\t{source}" for o in others[1:] if o != gold]
    _gz(root / "pairs" / "ccks2021_train.tsv.gz", "\n".join(ccks) + "\n")
    sz = ["addr1\taddr2\tlabel"] + [f"{a[3:]}\t{a}\t1" for a in catalog] + [f"{a[3:]}\t{rng.choice(catalog)}\t0" for a in catalog]
    _gz(root / "pairs" / "shenzhen_val.tsv.gz", "\n".join(sz) + "\n")
    _gz(root / "catalog" / "ccks2021_poi_candidates.tsv.gz", "text\tfreq\n" + "".join(f"{a}\t1\n" for a in catalog))
    _gz(root / "catalog" / "shenzhen_standard_addresses.txt.gz", "\n".join(catalog) + "\n")
    tagged = [json.dumps({"text": f"{c}{d}{r}1号", "split": "train", "elements": [["city", c], ["district", d], ["road", r], ["roadno", "1号"]]}, ensure_ascii=False)
              for c, d in PLACES for r in ROADS]
    _gz(root / "catalog" / "tagged_addresses_swei412.jsonl.gz", "\n".join(tagged) + "\n")
    _gz(root / "catalog" / "tagged_addresses_ncap2019.jsonl.gz", tagged[0] + "\n")
    _gz(root / "catalog" / "tagged_addresses_ccks2021_track2.jsonl.gz", tagged[1] + "\n")
    _gz(root / "catalog" / "unlabeled_addresses_ccks2021_track2.txt.gz", "\n".join(a[3:] for a in catalog) + "\n")
    extra = ["r" + line[1:].rsplit("\t", 1)[0] + "\tround1_train_tail" for line in ccks[1:60]]
    _gz(root / "pairs" / "ccks2021_round1_extra.tsv.gz", "\n".join([ccks[0]] + extra) + "\n")
    _gz(root / "pairs" / "shenzhen_train.tsv.gz", "\n".join(sz[:40]) + "\n")
    admin = ["level,name,code,short_name,province,city,county"] + [f"4,{d}街道,,,{c},{c},{d}" for c, d in PLACES]
    _gz(root / "admin" / "jionlp_4level.csv.gz", "\n".join(admin) + "\n")
    return root


@pytest.mark.slow
def test_train_writes_loadable_models_and_metrics_and_resumes(tiny_data, tmp_path):
    cfg = TrainConfig(data_dir=tiny_data, out=tmp_path / "run", hidden=32, layers=1, heads=2, intermediate=64,
                      mlm_minutes=0.02, bi_minutes=0.02, cross_minutes=0.02, mlm_batch=16, bi_batch=8, cross_batch=16,
                      log=lambda _: None)
    metrics = train(cfg)
    bi, cross = load_bi_encoder(cfg.out / "bi"), load_cross_encoder(cfg.out / "cross")
    assert metrics["fingerprints"] == {"bi": bi.fingerprint, "cross": cross.fingerprint}
    assert set(cross.labels) == set(LABELS) and bi.dim == 32
    # a stacked scorer gets a group head, fitted on the calibration split (train's dev figures stay out of sample)
    assert (cross.group_head is not None) == (cross.feature_head is not None)
    if cross.group_head is not None:
        assert metrics["stages"]["calibration"]["group_head"]["held_out"] == ["calib"]
        gate = metrics["stages"]["calibration"]["group_head"]["gate"]  # fitted on the same pairs as the stack
        assert gate == cross.group_head.gate.manifest() and 0.5 <= gate["min_probability"] <= 1.0
        from mgeo_index.training.group import cross_validate, group_head_pairs

        report = cross_validate(cross, group_head_pairs(tiny_data)[1], seeds=1)
        assert set(report) == {"group", "pairwise"}
        assert all(0.0 <= report[v][src] <= 1.0 for v in report for src in ("round2", "round1", "ccks2021_train"))
    for name in ("ccks_dev", "shenzhen_dev"):
        assert 0.0 <= metrics[name]["macro_f1"] <= 1.0 and metrics[name]["n"] > 0
    assert metrics["stages"]["mlm"]["steps"] >= 1 and metrics["stages"]["cross"]["steps"] >= 1
    assert 0 <= metrics["ccks_dev_retrieval"]["recall@10"] <= 1
    probs = labelling.score_pairs(cross, ["北京朝阳建国路8号"], ["北京市朝阳区建国路8号"])
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
    from mgeo_index.measure.metrics import classification_report
    from mgeo_index.training.calibrate import fit_decision_offsets

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
    from mgeo_index.training.calibrate import NETWORK_MIN_GAIN, choose_scorer

    assert choose_scorer({"network": 0.50, "stacked": 0.40, "features": 0.45}) == "stacked"
    assert choose_scorer({"network": 0.50, "stacked": 0.40, "features": 0.40 + NETWORK_MIN_GAIN / 2}) == "features"
    assert choose_scorer({"network": 0.30, "stacked": 0.40, "features": 0.45}) == "network"


def test_all_pairs_reads_every_labelled_file_with_its_source(tiny_data):
    from mgeo_index.training import data

    pairs = data.all_pairs(tiny_data)
    sources = {p.source for p in pairs}
    assert sources == {"round2_train", "round1_train_fold0", "round1_train_tail", "shenzhen"}
    assert len(data.ccks_extra_pairs(tiny_data)) == 59 and len(data.shenzhen_train_pairs(tiny_data)) == 39
    assert any(row["text"].endswith("1号") for row in data.tagged_addresses(tiny_data))
    corpus = data.corpus(tiny_data, random.Random(0))
    assert set(data.unlabeled_addresses(tiny_data)) <= set(corpus)


@pytest.mark.slow
def test_teacher_trains_resumes_and_exports_a_loadable_cross_encoder(tiny_data, tmp_path):
    from mgeo_index.training.teacher import TeacherConfig, train_teacher

    cfg = TeacherConfig(data_dir=tiny_data, out=tmp_path / "teacher", hidden=32, layers=2, heads=2, intermediate=64,
                        mlm_minutes=0.03, cross_minutes=0.03, mlm_batch=12, cross_batch=8, checkpoint_minutes=0.01,
                        eval_minutes=0.01, log=lambda _: None)
    record = train_teacher(cfg)
    assert record["mlm"]["done"] and record["mlm"]["steps"] >= 3  # singles, tagged and pair batches all ran
    assert record["cross"]["done"] and record["cross"]["kept_step"] <= record["cross"]["steps"]
    # a larger budget continues from the checkpoint (not from step 0) and retrains the fine-tuning
    cfg.mlm_minutes = record["mlm"]["minutes"] + 0.02
    longer = train_teacher(cfg, export_to=tmp_path / "export")
    assert longer["mlm"]["steps"] > record["mlm"]["steps"]
    cross = load_cross_encoder(tmp_path / "export")
    assert cross.model.config.num_hidden_layers == 2 and cross.temperature > 0
    probs = labelling.score_pairs(cross, ["北京朝阳建国路8号"], ["北京市朝阳区建国路8号"])
    assert probs.shape == (1, 3) and abs(probs.sum() - 1) < 1e-5


def test_whole_element_masking_masks_whole_elements():
    from transformers import AutoTokenizer

    from mgeo_index.settings import DEFAULT_CROSS_MODEL
    from mgeo_index.training.teacher import _element_ranges, mask_elements

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_CROSS_MODEL)
    text, ranges = _element_ranges([["city", "北京市"], ["district", "朝阳区"], ["road", "建国路"], ["roadno", "88号"]])
    assert text == "北京市朝阳区建国路88号" and ranges[0] == (1, 4) and ranges[-1] == (10, 13)
    ids = tokenizer([text], return_tensors="pt")["input_ids"]
    for seed in range(20):
        _, labels = mask_elements(ids, [ranges], tokenizer, random.Random(seed))
        picked = set((labels[0] != -100).nonzero().flatten().tolist())
        # every masked position belongs to an element that is masked whole (elements are short here)
        assert picked and all(set(range(a, b)) <= picked for a, b in ranges if picked & set(range(a, b)))


def test_fgm_perturbs_and_restores_the_embeddings():
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from mgeo_index.training.teacher import FGM

    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32, num_labels=3))
    before = model.bert.embeddings.word_embeddings.weight.detach().clone()
    out = model(input_ids=torch.tensor([[2, 7, 9, 3]]), labels=torch.tensor([1]))
    out.loss.backward()
    fgm = FGM(model, epsilon=0.5)
    assert fgm.attack()
    moved = model.bert.embeddings.word_embeddings.weight.detach() - before
    assert abs(float(torch.linalg.vector_norm(moved)) - 0.5) < 1e-4
    fgm.restore()
    assert torch.equal(model.bert.embeddings.word_embeddings.weight.detach(), before)


@pytest.mark.slow
def test_a_teacher_snapshot_restarts_pretraining_on_a_machine_without_checkpoints(tiny_data, tmp_path):
    from transformers import AutoTokenizer

    from mgeo_index.training.teacher import TeacherConfig, save_snapshot, stage_mlm, train_teacher

    cfg = TeacherConfig(data_dir=tiny_data, out=tmp_path / "first", hidden=32, layers=2, heads=2, intermediate=64,
                        mlm_minutes=0.02, cross_minutes=0.01, mlm_batch=12, cross_batch=8, checkpoint_minutes=0.01,
                        eval_minutes=0.01, log=lambda _: None)
    stage_mlm(cfg, AutoTokenizer.from_pretrained(cfg.tokenizer))  # pretraining only: its snapshot
    info = save_snapshot(cfg, tmp_path / "teacher")
    steps = json.loads((cfg.out / "teacher.json").read_text())["mlm"]["steps"]
    assert info["stage"] == "mlm" and info["step"] == steps and info["megabytes"] < 1
    # another machine: no checkpoints in its out directory, the snapshot from the repository
    logs = []
    moved = TeacherConfig(**{**cfg.__dict__, "out": tmp_path / "second", "snapshot": tmp_path / "teacher",
                             "mlm_minutes": 0.03, "log": logs.append})
    again = train_teacher(moved)
    assert any("[teacher mlm] no checkpoint" in line and "starting from the snapshot" in line for line in logs)
    assert again["mlm"]["steps"] > steps


@pytest.mark.slow
def test_a_fine_tuning_snapshot_replaces_the_pretraining_one_and_resumes_fine_tuning(tiny_data, tmp_path):
    from mgeo_index.training.teacher import CROSS_SNAPSHOT, SNAPSHOT_WEIGHTS, TeacherConfig, save_snapshot, train_teacher

    cfg = TeacherConfig(data_dir=tiny_data, out=tmp_path / "first", hidden=32, layers=2, heads=2, intermediate=64,
                        mlm_minutes=0.02, cross_minutes=0.02, mlm_batch=12, cross_batch=8, checkpoint_minutes=0.005,
                        eval_minutes=0.005, log=lambda _: None)
    first = train_teacher(cfg)
    target = tmp_path / "teacher"
    target.mkdir()
    (target / SNAPSHOT_WEIGHTS).write_bytes(b"old")  # a pretraining snapshot committed earlier
    info = save_snapshot(cfg, target)
    assert info["stage"] == "cross" and info["step"] == first["cross"]["kept_step"]
    assert (target / CROSS_SNAPSHOT).exists() and not (target / SNAPSHOT_WEIGHTS).exists()
    # another machine: pretraining is not redone, fine-tuning goes on from the snapshot's best weights
    logs = []
    moved = TeacherConfig(**{**cfg.__dict__, "out": tmp_path / "second", "snapshot": target, "cross_minutes": 0.04,
                             "log": logs.append})
    again = train_teacher(moved)
    assert not any("[teacher mlm]" in line for line in logs)
    assert any("[teacher cross] no checkpoint" in line and "starting from the snapshot" in line for line in logs)
    assert "mlm" not in again and again["cross"]["steps"] > info["step"] and again["cross"]["done"]
    # the same machine later, a larger budget: on from its own fine-tuning checkpoint, still no pretraining
    logs.clear()
    more = train_teacher(TeacherConfig(**{**moved.__dict__, "cross_minutes": 0.06}))
    assert not any("[teacher mlm]" in line for line in logs)
    assert any("[teacher cross] resuming at step" in line for line in logs)
    assert "mlm" not in more and more["cross"]["steps"] > again["cross"]["steps"] and more["cross"]["done"]


def test_bi_distil_relevance_and_positives_follow_labels_first():
    from mgeo_index.training.bi_distil import DistilConfig, query_lists, relevance_of

    exact, not_match = LABELS.index("exact_match"), LABELS.index("not_match")
    probs = np.array([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.65, 0.3, 0.05]], dtype=np.float32)
    gold = np.array([exact, -1, not_match, -1, -1], dtype=np.int8)
    r = relevance_of(probs, gold)
    assert r[1] == pytest.approx(0.9 + 0.3 * 0.05)  # unlabelled: the cross-encoder's own relevance
    assert r[0] == pytest.approx(0.5 * (0.2 + 0.3 * 0.5) + 0.5)  # labelled exact: half-way to 1
    assert r[2] == pytest.approx(0.5 * (0.7 + 0.3 * 0.2))  # labelled not_match: half-way to 0
    pools = {"queries": np.array(["甲", "乙", "丙"]), "query_catalog": np.array(["ccks", "ccks", "shenzhen"]),
             "documents": np.array(list("abcde")),
             "q": np.array([0, 0, 0, 1, 2], dtype=np.int32), "d": np.arange(5, dtype=np.int32), "gold": gold, "probs": probs}
    lists = query_lists(pools, DistilConfig(data_dir=None, pseudo_positive_min=0.6), random.Random(0))
    by_text = {q.text: q for q in lists}
    # the labelled gold wins over a more confident unlabelled candidate; a labelled not_match never is a positive
    assert by_text["甲"].rows[by_text["甲"].positive] == 0
    assert by_text["乙"].positive == -1  # P(exact) 0.1: no positive, the KL alone teaches it
    assert by_text["丙"].rows[by_text["丙"].positive] == 4  # unlabelled, P(exact) 0.65 ≥ 0.6
    assert by_text["丙"].catalog == "shenzhen"
    # by default only labelled gold is a positive
    strict = {q.text: q for q in query_lists(pools, DistilConfig(data_dir=None), random.Random(0))}
    assert strict["丙"].positive == -1 and strict["甲"].rows[strict["甲"].positive] == 0


def test_bi_distil_mines_scores_trains_resumes_and_exports(tiny_data, tiny_model_dirs, tmp_path):
    """Pools scored by a (random, tiny) cross-encoder, fine-tuning with checkpoints, a resumed run that continues
    rather than restarts, and an exported bi-encoder that loads and encodes."""
    from mgeo_index.training import bi_distil

    bi_dir, cross_dir = tiny_model_dirs
    cfg = bi_distil.DistilConfig(data_dir=tiny_data, out=tmp_path / "distil", bi_model=bi_dir, cross_model=cross_dir,
                                 minutes=0.03, batch=8, negatives=3, pool_k=4, shenzhen_queries=20, kl_weight=0.5,
                                 checkpoint_minutes=0.005, eval_minutes=0.005, log=lambda _: None)
    cross = load_cross_encoder(cross_dir)
    pools = bi_distil.mine_pools(cfg, load_bi_encoder(bi_dir), cross)
    assert len(pools["q"]) == len(pools["d"]) == len(pools["probs"]) > 0
    np.testing.assert_allclose(pools["probs"].sum(1), 1.0, atol=1e-5)
    texts = pools["documents"][pools["d"]]
    assert not (texts == pools["queries"][pools["q"]]).any()  # a query is never its own candidate
    # every labelled candidate that is in the catalog is in its query's pool, with its label
    assert (pools["gold"] == LABELS.index("exact_match")).sum() > 0
    # the pools are kept: a second call reads them instead of mining again
    (cfg.out / "scores").rename(tmp_path / "scores-gone")
    again = bi_distil.mine_pools(cfg, load_bi_encoder(bi_dir), cross)
    np.testing.assert_array_equal(again["probs"], pools["probs"])

    best = bi_distil.stage_train(cfg, pools)
    record = json.loads((cfg.out / "bi_distil.json").read_text())
    first_steps = record["train"]["steps"]
    assert best.exists() and first_steps >= 1 and record["train"]["evals"][0]["step"] == 0
    # a larger budget continues from the checkpoint: more steps, the earlier ones not redone
    (cfg.out / "train_done.json").unlink()
    cfg.minutes = record["train"]["minutes"] + 0.02
    bi_distil.stage_train(cfg, pools)
    longer = json.loads((cfg.out / "bi_distil.json").read_text())["train"]
    assert longer["steps"] > first_steps and longer["minutes"] >= cfg.minutes
    stats = bi_distil.export(cfg, best, tmp_path / "bi-out")
    assert set(stats["dev"]) == {"distilled", "before"}
    exported = load_bi_encoder(tmp_path / "bi-out")
    assert inference.encode(exported, "北京市朝阳区建国路8号").shape == (exported.dim,)


def test_teacher_weights_export_without_training(tiny_data, tmp_path):
    """--export-from: a (random-weight, full-size) fine-tuning snapshot becomes a cross-encoder that eval pairs loads,
    with a temperature and decision offsets fitted on the calibration split, and no training runs."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertForSequenceClassification

    from mgeo_index.training.teacher import TeacherConfig, bert_config, main

    cfg = TeacherConfig(data_dir=tiny_data, layers=3, hidden=128, heads=2, intermediate=256)  # not the default shape
    torch.manual_seed(0)
    model = BertForSequenceClassification(bert_config(cfg, AutoTokenizer.from_pretrained(cfg.tokenizer)))
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items()}, tmp_path / "cross-snapshot.safetensors")
    main(["--data", str(tiny_data), "--out", str(tmp_path / "out"), "--export-from", str(tmp_path / "cross-snapshot.safetensors"),
          "--export", str(tmp_path / "exported")])
    cross = load_cross_encoder(tmp_path / "exported")
    assert cross.temperature > 0 and len(cross.decision_offsets) == 3
    # the teacher's depth and widths are read off its weights
    assert (cross.model.config.num_hidden_layers, cross.model.config.hidden_size, cross.model.config.intermediate_size) == (3, 128, 256)
    assert not (tmp_path / "out" / "cross_checkpoint.pt").exists()  # nothing trained
    probs = labelling.score_pairs(cross, ["北京朝阳建国路8号"], ["北京市朝阳区建国路8号"])
    assert probs.shape == (1, 3) and abs(probs.sum() - 1) < 1e-5
    with pytest.raises(SystemExit):  # --export-from without --export is refused
        main(["--data", str(tiny_data), "--export-from", str(tmp_path / "cross-snapshot.safetensors")])
    # the shipped accurate network then stores its Linear weights in int8 (docs/models.md)
    import subprocess
    import sys

    script = settings.PACKAGE_DIR.parent / "scripts" / "quantize_weights.py"
    subprocess.run([sys.executable, str(script), str(tmp_path / "exported")], check=True, capture_output=True)
    quantized = load_cross_encoder(tmp_path / "exported")
    assert quantized.fingerprint != cross.fingerprint
    again = labelling.score_pairs(quantized, ["北京朝阳建国路8号"], ["北京市朝阳区建国路8号"])
    assert abs(again - probs).max() < 0.02


def test_a_teachers_lower_layers_export_as_a_retrieval_tower(tiny_data, tmp_path, capsys):
    """--tower-layers K: the teacher's embeddings and first K layers become a bi-encoder whose token states are the
    teacher's after layer K, mean pooled; a depth the teacher does not have is refused."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertForSequenceClassification

    from mgeo_index.training.teacher import TeacherConfig, bert_config, load_teacher, main

    cfg = TeacherConfig(data_dir=tiny_data, layers=3, hidden=64, heads=2, intermediate=128)
    torch.manual_seed(0)
    model = BertForSequenceClassification(bert_config(cfg, AutoTokenizer.from_pretrained(cfg.tokenizer)))
    snapshot = tmp_path / "cross-snapshot.safetensors"
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items()}, snapshot)
    main(["--data", str(tiny_data), "--export-from", str(snapshot), "--tower-layers", "2", "--export", str(tmp_path / "tower")])
    tower = load_bi_encoder(tmp_path / "tower", trainable=True)
    assert (tower.encoder.config.num_hidden_layers, tower.dim, tower.pooling) == (2, 64, "mean")
    teacher = load_teacher(snapshot).model.eval()
    enc = tower.tokenizer(["北京朝阳建国路8号", "杭州西湖文三路478号"], padding=True, return_tensors="pt")
    with torch.no_grad():
        states = teacher.bert(**enc, output_hidden_states=True).hidden_states[2]
        mask = enc["attention_mask"].unsqueeze(-1).float()
        expected = (states * mask).sum(1) / mask.sum(1)
        # the shipped files are FP16: the tower computes with the teacher's weights rounded to FP16
        np.testing.assert_allclose(tower(**enc).numpy(), expected.numpy(), atol=1e-5)
    assert inference.encode(load_bi_encoder(tmp_path / "tower"), "北京市朝阳区建国路8号").shape == (64,)
    with pytest.raises(SystemExit):
        main(["--data", str(tiny_data), "--export-from", str(snapshot), "--tower-layers", "4", "--export", str(tmp_path / "deep")])
    assert "1 to 3" in capsys.readouterr().err and not (tmp_path / "deep").exists()
    with pytest.raises(SystemExit):  # a tower of which teacher?
        main(["--data", str(tiny_data), "--tower-layers", "2", "--export", str(tmp_path / "deep")])
    assert "--export-from" in capsys.readouterr().err


def test_pretraining_batches_take_turns_and_worker_processes_make_them_too(tiny_data):
    """Single texts, tagged addresses and labelled pairs in turn, each with masked positions to predict; the same
    random stream gives the same batches (a resumed one-process run); a DataLoader's workers (the GPU recipe)
    make the same kinds of batch."""
    import itertools
    import random

    import torch
    from transformers import AutoTokenizer

    from mgeo_index.model.tokenizer import SPECIAL_TOKENS
    from mgeo_index.training.teacher import TeacherConfig, _PretrainingStream, pretraining_batches, pretraining_data

    cfg = TeacherConfig(data_dir=tiny_data, mlm_batch=8)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
    texts = pretraining_data(cfg, random.Random(0))
    first = list(itertools.islice(pretraining_batches(cfg, tokenizer, *texts, random.Random(0)), 6))
    assert ["pair_labels" in b for b in first] == [False, False, True] * 2
    assert [len(b["input_ids"]) for b in first] == [8, 8, 4] * 2
    for batch in first:
        picked = batch["labels"] != -100
        assert picked.any(dim=1).all()  # every row has something to predict
        assert (batch["input_ids"][picked] == tokenizer.mask_token_id).float().mean() > 0.5  # mostly [MASK] there
        assert (batch["labels"][picked] >= len(SPECIAL_TOKENS)).all()  # real characters are predicted, never [PAD] or [SEP]
    again = next(pretraining_batches(cfg, tokenizer, *texts, random.Random(0)))
    assert torch.equal(again["input_ids"], first[0]["input_ids"]) and torch.equal(again["labels"], first[0]["labels"])
    stream = torch.utils.data.DataLoader(_PretrainingStream(cfg, tokenizer, texts, seed=0, first_kind=0),
                                         batch_size=None, num_workers=2)
    made = list(itertools.islice(stream, 6))
    assert sorted(len(b["input_ids"]) for b in made) == [4, 4, 8, 8, 8, 8]
    assert sum("pair_labels" in b for b in made) == 2 and all((b["labels"] != -100).any() for b in made)
