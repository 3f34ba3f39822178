"""``mgeo-index adapt``: teach the cross-encoder a user's labelling policy from the review labels, on a CPU,
in minutes, without forgetting what it was calibrated for.

The parts of the stacked scorer that learn fast are refit (:mod:`mgeo_index.model.cross_encoder`): the
feature head (a few epochs from its current weights), the stack (``alpha``, ``beta``, ``bias``), the label
decision offsets and the cascade's gate. The network itself is kept. Each fit sees the user's labels and a
*replay* of the original calibration split — the numbers only (network logits, pair features, gold label,
source), written by ``scripts/recalibrate.py --replay-only`` beside the shipped model — so a user's site needs no
training texts. Each label counts :data:`LABEL_WEIGHT` times a replay pair (rows repeated): a few hundred
labels then move the policy without drowning the calibration data, and more labels earn more say.

A fifth of the labels (by query, seeded) is held back to measure before / after. The result is a new model
directory ``<index_dir>/models/cross-<N>/`` (the network files copied, a new feature head and manifest,
so a new fingerprint) recorded as the store's active ``cross`` model version; :func:`rollback` re-activates
its parent. :mod:`mgeo_index.model.loading` opens an index with the active version.
"""
from __future__ import annotations

import copy
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mgeo_index import settings
from mgeo_index.runtime import kernels
from mgeo_index.compare.features import FEATURE_NAMES, pair_features_batch
from mgeo_index.model.cross_encoder import FEATURE_HEAD, CrossEncoder, load_cross_encoder, save_head
from mgeo_index.model.group_head import GROUP_HEAD, LIGHTGBM_TEXTS
from mgeo_index.model.tree_head import TREE_HEAD, TreeHead, train_tree_head
from mgeo_index.model.manifest import MANIFEST, fingerprint, write_manifest
from mgeo_index.settings import LABELS
from mgeo_index.text import normalize
from mgeo_index.training import calibrate

REPLAY_FILE = "calibration_replay.npz"
MIN_LABELS = 20
# How many replay pairs one user label counts for (rows repeated), and the feature head's epochs. Chosen on
# the simulated lenient reviewer (research/simulate_review.py --policy lenient, 300 queue-chosen labels,
# test macro-F1 gain over the shipped model): weight 3 / 10 / 30 with 4 epochs +0.055 / +0.084 / +0.015;
# with 0 epochs (stack and decisions only) +0.016 / +0.028 / +0.027. Weight 30 overfits the few labels.
LABEL_WEIGHT = 10
HEAD_EPOCHS = 4
HEAD_LR = 1e-3
HEAD_TREE_ROUNDS, HEAD_TREE_LR = 5, 0.05  # a tree head: 20 trees more per class at half the learning rate
HOLDOUT = 0.2
MODELS_DIR = "models"
# The network files an adapted version shares with its parent (copied as they are).
_NETWORK_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class AdaptError(ValueError):
    """Labels or replay adapt cannot learn from (too few, one class, a replay of another model)."""


# --------------------------------------------------------------------------- replay


def network_fingerprint(path: str | Path) -> str:
    """A hash of the files that define the network's logits (weights, config, vocabulary): an adapted
    version shares them with the shipped model, so one replay serves both."""
    return fingerprint(path, files=_NETWORK_FILES)


@dataclass
class Replay:
    """Calibration pairs as numbers: network logits (n, 3, up to a per-row constant), pair features (n, F),
    gold (n,) as LABELS indices, each pair's source; and what they were computed with."""

    network_logits: np.ndarray
    features: np.ndarray
    gold: np.ndarray
    source: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.gold)


def network_logits(cross: CrossEncoder, a: list[str], b: list[str], features: np.ndarray | None = None) -> np.ndarray:
    """The network's logits for normalized pairs, up to a per-row constant (``T · log p`` of its
    temperature-scaled probabilities): the stack's softmax does not see the constant."""
    from mgeo_index.query.labelling import component_probabilities

    if not a:
        return np.empty((0, len(LABELS)), dtype=np.float32)
    network, _ = component_probabilities(cross, a, b, device="cpu", features=features)
    return (cross.temperature * np.log(np.clip(network, 1e-12, 1.0))).astype(np.float32)


def make_replay(cross: CrossEncoder, pairs: list[tuple[str, str, str, str]]) -> Replay:
    """The replay of (a, b, label, source) pairs for ``cross`` (texts are normalized here)."""
    from mgeo_index.text.parser import parser_version

    a, b = [normalize(p[0]) for p in pairs], [normalize(p[1]) for p in pairs]
    features = pair_features_batch(a, b)
    meta = {"fingerprint": cross.fingerprint, "network_fingerprint": network_fingerprint(cross.path),
            "parser": parser_version(), "features": list(FEATURE_NAMES), "labels": list(LABELS), "pairs": len(pairs)}
    return Replay(network_logits(cross, a, b, features), features.astype(np.float32),
                  np.array([LABELS.index(p[2]) for p in pairs], dtype=np.int8),
                  np.array([p[3] for p in pairs]), meta)


def write_replay(cross_dir: str | Path, data_dir: str | Path, out: str | Path | None = None) -> dict:
    """Write the calibration replay of the cross-encoder at ``cross_dir`` (into it, or to ``out``): the pairs
    :func:`mgeo_index.training.calibrate.calibrate` fits on — the calibration split of the CCKS pairs (three-way)
    and of Shenzhen's validation file (binary) — as numbers only, so it ships with the package and ``adapt``
    replays the original calibration at a user's site. Returns what was written."""
    from mgeo_index.measure.splits import split_of
    from mgeo_index.training import data

    cross = load_cross_encoder(cross_dir)
    pairs = [(p.a, p.b, p.label, p.source) for p in data.ccks_pairs(Path(data_dir)) + data.shenzhen_pairs(Path(data_dir))
             if split_of(p.group) == "calib"]
    out = Path(out) if out is not None else Path(cross_dir) / REPLAY_FILE
    save_replay(make_replay(cross, pairs), out)
    check = load_replay(out, cross)
    return {"out": str(out), "pairs": len(check), "bytes": out.stat().st_size,
            "sources": {str(s): int((check.source == s).sum()) for s in sorted(set(check.source.tolist()))},
            "fingerprint": check.meta["fingerprint"], "network_fingerprint": check.meta["network_fingerprint"],
            "parser": check.meta["parser"]}


def save_replay(replay: Replay, path: str | Path) -> None:
    np.savez_compressed(path, network_logits=replay.network_logits.astype(np.float32),
                        features=replay.features.astype(np.float32), gold=replay.gold.astype(np.int8),
                        source=replay.source.astype(str), meta=np.array(json.dumps(replay.meta)))


def load_replay(path: str | Path, cross: CrossEncoder | None = None) -> Replay:
    """Read a replay; with ``cross``, refuse one made for another network, parser or feature set."""
    path = Path(path)
    if not path.exists():
        raise AdaptError(f"no calibration replay at {path}: write it with scripts/recalibrate.py --replay-only "
                         "(or pass --replay)")
    with np.load(path, allow_pickle=False) as z:
        replay = Replay(z["network_logits"], z["features"], z["gold"].astype(np.int64), z["source"],
                        json.loads(str(z["meta"])))
    if cross is not None:
        check_replay(replay, cross, path)
    return replay


def check_replay(replay: Replay, cross: CrossEncoder, path: str | Path = "the replay") -> None:
    from mgeo_index.text.parser import parser_version

    meta = replay.meta
    if meta.get("network_fingerprint") != network_fingerprint(cross.path):
        raise AdaptError(f"{path} was made for the network of model {meta.get('fingerprint')} "
                         f"({meta.get('network_fingerprint')}), not for {cross.path} "
                         f"({network_fingerprint(cross.path)}): make a replay for this model "
                         "(scripts/recalibrate.py --replay-only --model …)")
    if meta.get("parser") != parser_version():
        raise AdaptError(f"{path} holds features of the parser {meta.get('parser')}, but this version parses with "
                         f"{parser_version()}: make the replay again (scripts/recalibrate.py --replay-only)")
    if meta.get("features") != list(FEATURE_NAMES):
        raise AdaptError(f"{path} holds other features than this version computes: make the replay again "
                         "(scripts/recalibrate.py --replay-only)")


# --------------------------------------------------------------------------- labels


@dataclass
class Examples:
    """Labelled pairs as numbers (as :class:`Replay`) with their normalized texts and query groups."""

    a: list[str]
    b: list[str]
    gold: np.ndarray
    features: np.ndarray
    network_logits: np.ndarray

    def take(self, rows) -> "Examples":
        rows = np.asarray(rows, dtype=np.int64)
        return Examples([self.a[i] for i in rows], [self.b[i] for i in rows], self.gold[rows], self.features[rows],
                        self.network_logits[rows])

    def __len__(self) -> int:
        return len(self.gold)


def labelled_pairs(labels: list[dict]) -> list[tuple[str, str, str]]:
    """(normalized query, normalized entry address, label) of the store's active labels; the latest label
    of a pair wins (a reviewer who changed their mind)."""
    latest: dict[tuple[str, str], str] = {}
    for row in labels:
        query = row.get("query_normalized") or normalize(row["query"])
        latest[(query, normalize(row["entry_address"]))] = row["label"]
    return [(a, b, label) for (a, b), label in latest.items()]


def check_labels(pairs: list[tuple[str, str, str]], *, min_labels: int = MIN_LABELS) -> None:
    if not pairs:
        raise AdaptError("no labels to adapt to: review some matches first (mgeo-index review) or import labels "
                         "(mgeo-index labels import)")
    if len(pairs) < min_labels:
        raise AdaptError(f"only {len(pairs)} labelled pairs: adapt needs at least {min_labels} "
                         "(a fifth is held back to measure the result)")
    classes = sorted({p[2] for p in pairs})
    if len(classes) < 2:
        raise AdaptError(f"every label is {classes[0]}: adapt needs labels of at least two classes to learn a "
                         "decision from")


def examples_of(cross: CrossEncoder, pairs: list[tuple[str, str, str]]) -> Examples:
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    features = pair_features_batch(a, b)
    return Examples(a, b, np.array([LABELS.index(p[2]) for p in pairs], dtype=np.int64), features.astype(np.float32),
                    network_logits(cross, a, b, features))


def holdout_split(queries: list[str], *, seed: int = 0, share: float = HOLDOUT) -> np.ndarray:
    """Whether each row is held back: a seeded ``share`` of the distinct query texts (a query's pairs
    stay together, so the held-back figures are on queries the fit never saw)."""
    distinct = sorted(set(queries))
    random.Random(seed).shuffle(distinct)
    held = set(distinct[: max(1, round(share * len(distinct)))]) if len(distinct) > 1 else set()
    return np.array([q in held for q in queries], dtype=bool)


# --------------------------------------------------------------------------- scoring and fitting


def probabilities(cross: CrossEncoder, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
    """What :func:`mgeo_index.query.labelling.score_pairs` gives for these pairs, from their numbers: the stack,
    and the cascade's feature-only probabilities where its gate decides."""
    x = np.ascontiguousarray(features, dtype=np.float32)
    out = cross.probabilities(np.float32(cross.stack["alpha"]) * np.asarray(logits, dtype=np.float32)
                              + cross.feature_logits(x))
    if cross.gate is not None:
        alone, decided = cross.gate_probabilities(x)
        out[decided] = alone[decided]
    return out


def report(cross: CrossEncoder, logits: np.ndarray, features: np.ndarray, gold: np.ndarray) -> dict:
    """macro-F1, per-label F1, accuracy and n of ``cross``'s decisions on these pairs (gold: LABELS indices)."""
    from mgeo_index.measure.metrics import classification_report

    if not len(gold):
        return {"n": 0}
    predicted = cross.decide(probabilities(cross, logits, features))
    gold_in_cross = np.array([cross.labels.index(LABELS[g]) for g in gold])
    full = classification_report(gold_in_cross, predicted, cross.labels)
    return {"n": full["n"], "macro_f1": round(full["macro_f1"], 4), "accuracy": round(full["accuracy"], 4),
            "f1": {label: round(v["f1"], 4) for label, v in full["per_class"].items()}}


def finetune_head(head, x: np.ndarray, y: np.ndarray, *, epochs: int = HEAD_EPOCHS, lr: float = HEAD_LR,
                  seed: int = 0):
    """A copy of ``head`` trained more on (features, LABELS index) with the recipe it was trained with, gently:
    it already fits the calibration data. MLPs (:func:`calibrate.train_feature_head`: class-weighted
    cross-entropy, AdamW) ``epochs`` more at learning rate ``lr``; trees (:func:`tree_head.train_tree_head`)
    ``HEAD_TREE_ROUNDS`` per epoch more at ``HEAD_TREE_LR``."""
    head = copy.deepcopy(head)
    if epochs <= 0:
        return head.eval()
    if isinstance(head, TreeHead):
        return train_tree_head(x, y, seed=seed, init=head, rounds=HEAD_TREE_ROUNDS * epochs, learning_rate=HEAD_TREE_LR)
    xt, yt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(np.asarray(y, dtype=np.int64))
    return calibrate.train_feature_head(xt, yt, epochs=epochs, seed=seed, head=head, lr=lr)


def sibling(cross: CrossEncoder) -> CrossEncoder:
    """A cross-encoder sharing ``cross``'s network (not copied: it is not refit) with copies of the parts
    that are, so refitting it leaves ``cross`` as it was."""
    new = CrossEncoder(cross.model, cross.tokenizer, max_length=cross.max_length, temperature=cross.temperature)
    new.feature_head = copy.deepcopy(cross.feature_head)
    new.stack, new.gate = copy.deepcopy(cross.stack), copy.deepcopy(cross.gate)
    new.decision_offsets = list(cross.decision_offsets) if cross.decision_offsets is not None else None
    new.path, new.fingerprint = cross.path, cross.fingerprint
    return new.eval()


def refit(cross: CrossEncoder, replay: Replay, train: Examples, *, label_weight: int = LABEL_WEIGHT,
          epochs: int = HEAD_EPOCHS, seed: int = 0) -> tuple[CrossEncoder, dict]:
    """A copy of ``cross`` with its feature head, stack, decision offsets and gate refit on ``replay`` plus
    ``train`` (each label repeated ``label_weight`` times). Returns it and the figures of the fit."""
    from mgeo_index.text.parser import parser_version

    repeat = np.repeat(np.arange(len(train)), max(1, int(label_weight)))
    net = np.concatenate([replay.network_logits, train.network_logits[repeat]]).astype(np.float64)
    x = np.concatenate([replay.features, train.features[repeat]]).astype(np.float32)
    gold = np.concatenate([replay.gold, train.gold[repeat]]).astype(np.int64)
    # decision offsets and their macro-F1: the three-way pairs (the binary Shenzhen pairs have no partial
    # class), as calibrate.calibrate fits them
    three_way = np.concatenate([replay.source != "shenzhen", np.ones(len(repeat), dtype=bool)])

    new = sibling(cross)
    new.feature_head = finetune_head(cross.feature_head, x, gold, epochs=epochs, seed=seed)
    with torch.inference_mode():
        feature_logits = new.feature_head(torch.from_numpy(x)).double().numpy()
    stack = calibrate.fit_stack(net, feature_logits, gold) | {"parser": parser_version()}
    features_only = calibrate.fit_stack(np.zeros_like(net), feature_logits, gold) | {"alpha": 0.0, "parser": parser_version()}
    if cross.stack["alpha"] == 0.0:  # a feature-only scorer stays one: the network is not run
        stack = features_only
    new.stack = stack
    probs = kernels.softmax(torch.from_numpy(stack["alpha"] * net + stack["beta"] * feature_logits
                                             + np.array(stack["bias"]))).numpy()
    gold_in_cross = np.array([cross.labels.index(LABELS[g]) for g in gold])
    new.decision_offsets = calibrate.fit_decision_offsets(probs[three_way], gold_in_cross[three_way], cross.labels)
    # the group head was fitted on the parent's probabilities and the replay holds no query groups: an adapted
    # model decides every pair alone, with the offsets just fitted
    new.group_head = None
    gate = None
    new.gate = None
    if cross.gate is not None and stack["alpha"] != 0.0:
        gate = calibrate.fit_gate(new, stack, features_only, net, feature_logits, gold)
        if gate["skipped_share"] == 0.0:  # no pair may skip the network at the agreement asked: no cascade
            new.gate = None
    return new, {"replay_pairs": len(replay), "label_pairs": len(train), "label_weight": int(label_weight),
                 "head_epochs": epochs, "stack": {k: v for k, v in stack.items() if k not in ("features",)},
                 "decision_offsets": dict(zip(cross.labels, new.decision_offsets)), "gate": gate}


# --------------------------------------------------------------------------- versions


def save_version(cross: CrossEncoder, parent_dir: str | Path, target: str | Path, *, adapted: dict) -> str:
    """Write ``cross`` (a refit of the model in ``parent_dir``) to ``target``: the parent's network files
    copied, the new feature head and manifest. Written beside and renamed, so a half-written version is
    never seen. Returns the new fingerprint."""
    parent_dir, target = Path(parent_dir), Path(target)
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for file in parent_dir.iterdir():
        if file.is_file() and file.name not in (FEATURE_HEAD, TREE_HEAD, GROUP_HEAD, LIGHTGBM_TEXTS, MANIFEST, REPLAY_FILE):
            shutil.copy2(file, staging / file.name)
    save_head(cross.feature_head, staging)
    manifest = json.loads((parent_dir / MANIFEST).read_text())
    manifest.pop("versions", None)
    manifest.update(stack=cross.stack, decision_offsets=dict(zip(cross.labels, cross.decision_offsets)), adapted=adapted)
    manifest.pop("gate", None)
    manifest.pop("group_head", None)
    if cross.gate is not None:
        manifest["gate"] = cross.gate
    write_manifest(staging, manifest)
    staging.rename(target)
    return fingerprint(target)


def next_version_dir(index_dir: str | Path) -> Path:
    """``<index_dir>/models/cross-<N>``, N one more than any there."""
    models = Path(index_dir) / MODELS_DIR
    taken = [int(p.name.split("-", 1)[1]) for p in models.glob("cross-*") if p.name.split("-", 1)[1].isdigit()]
    return models / f"cross-{max(taken, default=0) + 1}"


def default_replay_path() -> Path:
    return settings.DEFAULT_CROSS_MODEL / REPLAY_FILE


def adapt_model(cross: CrossEncoder, pairs: list[tuple[str, str, str]], replay: Replay, *, epochs: int = HEAD_EPOCHS,
                label_weight: int = LABEL_WEIGHT, seed: int = 0, min_labels: int = MIN_LABELS,
                holdout: float = HOLDOUT) -> tuple[CrossEncoder, dict]:
    """The library core of ``adapt`` (no store, no files): refit ``cross`` on labelled (normalized query,
    normalized entry address, label) ``pairs`` (:func:`labelled_pairs`) plus ``replay``, a ``holdout`` share of queries held back.
    Returns the refit model and {before, after (on the held-back pairs), fit, labels, seconds}."""
    check_labels(pairs, min_labels=min_labels)
    if cross.feature_head is None or cross.stack is None:
        raise AdaptError(f"{cross.path} has no feature head: adapt refits a stacked cross-encoder "
                         "(the shipped one is); recalibrate this one first (scripts/recalibrate.py)")
    check_replay(replay, cross)
    started = time.perf_counter()
    examples = examples_of(cross, pairs)
    held = holdout_split(examples.a, seed=seed, share=holdout) if holdout > 0 else np.zeros(len(examples), dtype=bool)
    train, test = examples.take(np.flatnonzero(~held)), examples.take(np.flatnonzero(held))
    new, fit = refit(cross, replay, train, label_weight=label_weight, epochs=epochs, seed=seed)
    counts = {label: int((examples.gold == i).sum()) for i, label in enumerate(LABELS)}
    return new, {
        "labels": len(examples), "label_counts": counts, "fit_pairs": len(train), "held_back": len(test),
        "before": report(cross, test.network_logits, test.features, test.gold),
        "after": report(new, test.network_logits, test.features, test.gold),
        "replay_before": report(cross, replay.network_logits, replay.features, replay.gold),
        "replay_after": report(new, replay.network_logits, replay.features, replay.gold),
        "fit": fit, "seconds": round(time.perf_counter() - started, 2),
    }


def adapt(index_dir: str | Path, *, db: str | None = None, epochs: int = HEAD_EPOCHS, label_weight: int = LABEL_WEIGHT,
          seed: int = 0, replay_path: str | Path | None = None, min_labels: int = MIN_LABELS, force: bool = False) -> dict:
    """``mgeo-index adapt``: refit the index's current cross-encoder (the active version, else the shipped
    one) on the store's active labels, write ``models/cross-<N>/`` and make it the active version — unless
    it scores a lower macro-F1 than the current one on the held-back fifth of the labels (then it is kept,
    inactive, and ``activated`` is False; ``force`` activates it anyway). Returns the version's id, path,
    fingerprint, parent, ``activated`` and the figures of :func:`adapt_model`."""
    from mgeo_index import store
    from mgeo_index.model.loading import active_cross_version

    started = time.perf_counter()
    index_dir = Path(index_dir)
    engine = store.connect(settings.database_url(index_dir, db))
    try:
        pairs = labelled_pairs(store.list_labels(engine))
        check_labels(pairs, min_labels=min_labels)
        active, parent_dir = active_cross_version(index_dir, engine)
        parent_dir = parent_dir or settings.DEFAULT_CROSS_MODEL
        cross = load_cross_encoder(parent_dir)
        replay = load_replay(replay_path or default_replay_path(), cross)
        new, figures = adapt_model(cross, pairs, replay, epochs=epochs, label_weight=label_weight, seed=seed,
                                   min_labels=min_labels)
        target = next_version_dir(index_dir)
        adapted = {"parent_fingerprint": cross.fingerprint, "labels": figures["labels"], "seed": seed,
                   "head_epochs": epochs, "label_weight": label_weight}
        new_fingerprint = save_version(new, parent_dir, target, adapted=adapted)
        relative = target.relative_to(index_dir).as_posix()
        metrics = {k: figures[k] for k in ("before", "after", "replay_before", "replay_after", "label_counts",
                                           "held_back", "fit_pairs")}
        before, after = figures["before"].get("macro_f1"), figures["after"].get("macro_f1")
        activated = force or before is None or after >= before
        version_id = store.add_model_version(engine, kind="cross", path=relative, fingerprint=new_fingerprint,
                                             parent_id=active["id"] if active else None, labels_used=figures["labels"],
                                             metrics=metrics, activate=activated)
    finally:
        engine.dispose()
    return {"version": version_id, "activated": activated, "path": relative, "fingerprint": new_fingerprint,
            "parent": active["id"] if active else None, "parent_fingerprint": cross.fingerprint, **figures,
            "seconds": round(time.perf_counter() - started, 2)}


def rollback(index_dir: str | Path, *, db: str | None = None) -> dict:
    """Re-activate the active version's parent (None: the shipped model). Returns {rolled_back, active,
    path, fingerprint} naming the version active now."""
    from mgeo_index import store

    engine = store.connect(settings.database_url(index_dir, db))
    try:
        active = store.active_model_version(engine, "cross")
        if active is None:
            raise AdaptError("no adapted model is active: the index already uses the shipped cross-encoder")
        store.activate_model_version(engine, active["parent_id"], "cross")
        now = store.active_model_version(engine, "cross")
    finally:
        engine.dispose()
    shipped = settings.DEFAULT_CROSS_MODEL
    return {"rolled_back": active["id"], "active": now["id"] if now else None,
            "path": now["path"] if now else str(shipped),
            "fingerprint": now["fingerprint"] if now else fingerprint(shipped)}
