"""`mgeo-index adapt`: refit the cross-encoder's fast parts on review labels, write and activate a new model
version beside the shipped one, open the index with it, roll back; refuse bad labels and foreign replays.

No shared data: the labels are made from the bundled sample catalog, the replay is the shipped one.
"""
import csv
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from mgeo_index import settings, store
from mgeo_index.cli import app
from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.model.manifest import ModelError, fingerprint
from mgeo_index.settings import LABELS
from mgeo_index.text import normalize
from mgeo_index.training import adapt

runner = CliRunner()
PARTIAL = LABELS.index("partial_match")


def _catalog() -> list[str]:
    with open(settings.SAMPLE_CATALOG, encoding="utf-8") as fh:
        return [row["address"] for row in csv.DictReader(fh)]


def _label_rows(addresses: list[str], *, detail: str = "3层301室") -> list[dict]:
    """The policy to teach: an address with a floor and room added is only *part of* the catalog's building
    address (partial_match; the shipped model, calibrated on CCKS, calls these exact_match); an address
    against another entry is not_match."""
    rows = []
    for i, address in enumerate(addresses):
        query = address + detail
        rows.append({"query": query, "query_normalized": normalize(query), "entry_address": address,
                     "label": "partial_match"})
        other = addresses[(i + 7) % len(addresses)]
        rows.append({"query": query, "query_normalized": normalize(query), "entry_address": other,
                     "label": "not_match"})
    return rows


@pytest.fixture(scope="module")
def shipped():
    return load_cross_encoder(settings.DEFAULT_CROSS_MODEL)


@pytest.fixture(scope="module")
def replay(shipped):
    return adapt.load_replay(adapt.default_replay_path(), shipped)


def test_the_numbers_path_scores_as_the_model_does(shipped):
    from mgeo_index.query.labelling import score_pairs

    rows = _label_rows(_catalog()[:12])
    examples = adapt.examples_of(shipped, adapt.labelled_pairs(rows))
    numbers = adapt.probabilities(shipped, examples.network_logits, examples.features)
    scored = score_pairs(shipped, examples.a, examples.b, device="cpu")
    np.testing.assert_allclose(numbers, scored, atol=1e-5)


def test_shipped_replay_matches_the_shipped_model(shipped, replay):
    assert len(replay) > 1000 and replay.features.shape == (len(replay), len(replay.meta["features"]))
    assert replay.meta["fingerprint"] == shipped.fingerprint
    assert set(np.unique(replay.gold)) == {0, 1, 2}
    assert adapt.default_replay_path().stat().st_size < 1_000_000


def test_adapting_to_a_policy_moves_the_decisions_towards_it(shipped, replay):
    addresses = _catalog()
    taught, unseen = addresses[:150], addresses[150:230]
    model, figures = adapt.adapt_model(shipped, adapt.labelled_pairs(_label_rows(taught)), replay, seed=0)
    # pairs of the same pattern the fit never saw: more of them are now partial_match, with more probability
    probe = adapt.examples_of(shipped, adapt.labelled_pairs(_label_rows(unseen)))
    same = probe.gold == PARTIAL
    before = adapt.probabilities(shipped, probe.network_logits[same], probe.features[same])
    after = adapt.probabilities(model, probe.network_logits[same], probe.features[same])
    partial = shipped.labels.index("partial_match")
    partial_before, partial_after = np.mean(shipped.decide(before) == partial), np.mean(model.decide(after) == partial)
    assert partial_after >= partial_before + 0.2, (partial_before, partial_after)
    assert after[:, partial].mean() > before[:, partial].mean() + 0.1
    # and the held-back fifth of the labels says so too
    assert figures["after"]["f1"]["partial_match"] > figures["before"]["f1"]["partial_match"]
    # the other pairs stay not_match
    others = adapt.probabilities(model, probe.network_logits[~same], probe.features[~same])
    assert np.mean(model.decide(others) == model.labels.index("not_match")) > 0.9
    # the shipped model is left as it was
    assert load_cross_encoder(settings.DEFAULT_CROSS_MODEL).fingerprint == shipped.fingerprint


def test_bad_labels_are_refused(shipped, replay):
    rows = _label_rows(_catalog()[:40])
    with pytest.raises(adapt.AdaptError, match="no labels"):
        adapt.adapt_model(shipped, [], replay)
    with pytest.raises(adapt.AdaptError, match="at least 20"):
        adapt.adapt_model(shipped, adapt.labelled_pairs(rows[:10]), replay)
    only_partial = [r for r in rows if r["label"] == "partial_match"]
    with pytest.raises(adapt.AdaptError, match="two classes"):
        adapt.adapt_model(shipped, adapt.labelled_pairs(only_partial), replay)


def test_a_foreign_replay_is_refused(shipped, replay, tmp_path):
    foreign = adapt.Replay(replay.network_logits, replay.features, replay.gold, replay.source,
                           {**replay.meta, "fingerprint": "0123456789abcdef", "network_fingerprint": "0123456789abcdef"})
    adapt.save_replay(foreign, tmp_path / "foreign.npz")
    with pytest.raises(adapt.AdaptError, match="made for the network of model 0123456789abcdef"):
        adapt.load_replay(tmp_path / "foreign.npz", shipped)
    old_parser = adapt.Replay(replay.network_logits, replay.features, replay.gold, replay.source,
                              {**replay.meta, "parser": "parser-0000"})
    with pytest.raises(adapt.AdaptError, match="parser parser-0000"):
        adapt.check_replay(old_parser, shipped)
    with pytest.raises(adapt.AdaptError, match="recalibrate.py --replay-only"):
        adapt.load_replay(tmp_path / "missing.npz", shipped)


def _labelled_index(index_dir, rows) -> None:
    engine = store.connect(settings.database_url(index_dir))
    store.add_labels(engine, rows, reviewer="test")
    engine.dispose()


def test_adapt_writes_a_version_the_index_opens_with_and_rollback_returns(sample_index_copy, shipped):
    from mgeo_index.api import AddressIndex

    index_dir = sample_index_copy
    _labelled_index(index_dir, _label_rows(_catalog()[:60]))
    result = adapt.adapt(index_dir, epochs=2, force=True)
    version_dir = index_dir / "models" / "cross-1"
    assert result["path"] == "models/cross-1" and version_dir.is_dir()
    assert result["fingerprint"] == fingerprint(version_dir) != shipped.fingerprint
    assert result["parent"] is None and result["labels"] == 120 and result["held_back"] > 0
    assert {"macro_f1", "f1", "accuracy", "n"} <= set(result["after"])
    engine = store.connect(settings.database_url(index_dir))
    active = store.active_model_version(engine)
    assert active["id"] == result["version"] and active["fingerprint"] == result["fingerprint"]
    assert active["labels_used"] == 120 and active["metrics"]["after"]["n"] == result["held_back"]
    engine.dispose()
    with AddressIndex.open(index_dir, device="cpu") as idx:
        assert idx.cross_encoder.fingerprint == result["fingerprint"]
        assert idx.resolve("深圳南山中山路75号东方科技园9号楼")[0].source_id == "P0001"
    # an explicit --cross-model still wins over the active version
    with AddressIndex.open(index_dir, device="cpu", cross_model=settings.DEFAULT_CROSS_MODEL) as idx:
        assert idx.cross_encoder.fingerprint == shipped.fingerprint

    # a second adapt starts from the active version and records it as the parent
    second = adapt.adapt(index_dir, epochs=0, seed=1, force=True)
    assert second["path"] == "models/cross-2" and second["parent"] == result["version"]
    assert second["parent_fingerprint"] == result["fingerprint"]

    out = runner.invoke(app, ["adapt", "--index-dir", str(index_dir), "--rollback"])
    assert out.exit_code == 0, out.output
    assert f"active now: version {result['version']}" in out.output
    with AddressIndex.open(index_dir, device="cpu") as idx:
        assert idx.cross_encoder.fingerprint == result["fingerprint"]
    out = runner.invoke(app, ["adapt", "--index-dir", str(index_dir), "--rollback", "--json"])
    assert out.exit_code == 0, out.output
    assert '"active": null' in out.output and shipped.fingerprint in out.output
    with AddressIndex.open(index_dir, device="cpu") as idx:
        assert idx.cross_encoder.fingerprint == shipped.fingerprint
    out = runner.invoke(app, ["adapt", "--index-dir", str(index_dir), "--rollback"])
    assert out.exit_code == 1 and "already uses the shipped cross-encoder" in out.output


def test_a_version_worse_on_the_held_back_labels_is_kept_but_not_activated(sample_index_copy, shipped, monkeypatch):
    index_dir = sample_index_copy
    _labelled_index(index_dir, _label_rows(_catalog()[:60]))
    real = adapt.adapt_model

    def worse(*args, **kwargs):
        model, figures = real(*args, **kwargs)
        figures["after"] = dict(figures["before"], macro_f1=figures["before"]["macro_f1"] - 0.05)
        return model, figures

    monkeypatch.setattr(adapt, "adapt_model", worse)
    out = runner.invoke(app, ["adapt", "--index-dir", str(index_dir), "--epochs", "0"])
    assert out.exit_code == 0, out.output
    assert "NOT activated" in out.output and "--force" in out.output
    engine = store.connect(settings.database_url(index_dir))
    assert store.active_model_version(engine) is None and len(store.list_model_versions(engine)) == 1
    forced = adapt.adapt(index_dir, epochs=0, force=True)
    assert forced["activated"] and store.active_model_version(engine)["id"] == forced["version"]
    engine.dispose()


def test_a_missing_version_directory_names_the_path_and_the_way_back(sample_index_copy):
    from mgeo_index.api import AddressIndex

    index_dir = sample_index_copy
    _labelled_index(index_dir, _label_rows(_catalog()[:30]))
    out = runner.invoke(app, ["adapt", "--index-dir", str(index_dir), "--epochs", "1"])
    assert out.exit_code == 0, out.output
    assert "models/cross-1" in out.output and "macro-F1" in out.output
    shutil.rmtree(index_dir / "models" / "cross-1")
    with pytest.raises(ModelError, match=r"cross-1.*adapt --rollback"):
        AddressIndex.open(index_dir, device="cpu")
    out = runner.invoke(app, ["resolve", "东方科技园", "--index-dir", str(index_dir)])
    assert out.exit_code == 1 and "adapt --rollback" in out.output


def test_the_cli_refuses_too_few_labels(sample_index_copy):
    out = runner.invoke(app, ["adapt", "--index-dir", str(sample_index_copy)])
    assert out.exit_code == 1 and "no labels to adapt to" in out.output
    _labelled_index(sample_index_copy, _label_rows(_catalog()[:5]))
    out = runner.invoke(app, ["adapt", "--index-dir", str(sample_index_copy)])
    assert out.exit_code == 1 and "only 10 labelled pairs" in out.output
    out = runner.invoke(app, ["adapt", "--index-dir", str(sample_index_copy), "--network-epochs", "2"])
    assert out.exit_code == 1 and "--network-epochs" in out.output
