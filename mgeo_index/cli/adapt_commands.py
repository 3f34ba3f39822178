"""adapt: refit the cross-encoder's fast parts on the review labels (or roll back); thin over
:mod:`mgeo_index.training.adapt`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mgeo_index.cli.errors import fail, friendly_errors
from mgeo_index.cli.options import DEFAULT_INDEX_DIR, Db, IndexDir
from mgeo_index.cli.render import console, log


def adapt(
    index_dir: IndexDir = DEFAULT_INDEX_DIR,
    db: Db = None,
    epochs: Annotated[int, typer.Option("--epochs", min=0, max=100, help="Epochs of the feature head's fine-tuning (0: keep it, refit the stack and decisions only).")] = 4,
    network_epochs: Annotated[int, typer.Option("--network-epochs", min=0, help="Epochs of the network itself: not offered yet, 0 (the replay holds the shipped network's logits, which a changed network would invalidate).")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the held-back fifth and the fine-tuning.")] = 0,
    rollback: Annotated[bool, typer.Option("--rollback", help="Re-activate the version the active one was adapted from (the shipped model at the end).")] = False,
    replay: Annotated[Path | None, typer.Option("--replay", help="Calibration replay file \\[default: the shipped model's calibration_replay.npz].")] = None,
    force: Annotated[bool, typer.Option("--force", help="Activate the new version even if it scores worse than the current one on the held-back labels.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False,
) -> None:
    """Teach the cross-encoder the reviewers' labels: refit its feature head, stack weights, decision
    offsets and cascade gate on the store's labels plus a replay of the original calibration, write the
    new version to INDEX_DIR/models/cross-N/ and make it the index's active cross-encoder. A fifth of the
    labels (by query) is held back and scored before and after: a version that scores worse there is kept
    but not activated (--force activates it). --rollback returns to the previous version.

    Example: mgeo-index adapt --index-dir idx        (then: mgeo-index adapt --index-dir idx --rollback)
    """
    from mgeo_index.training import adapt as adapting

    with friendly_errors():
        if rollback:
            result = adapting.rollback(index_dir, db=db)
            if as_json:
                print(json.dumps(result, ensure_ascii=False))
            else:
                now = (f"version {result['active']} ({result['path']})" if result["active"] is not None
                       else f"the shipped model ({result['path']})")
                console.print(f"Rolled back version {result['rolled_back']}; active now: {now}, "
                              f"fingerprint {result['fingerprint']}", markup=False, highlight=False, soft_wrap=True)
            return
        if network_epochs:
            fail("--network-epochs: adapt does not fine-tune the network yet (the calibration replay holds the "
                 "shipped network's logits, which a changed network would invalidate); leave it at 0")
        log(f"adapting the cross-encoder of {index_dir} to its labels…")
        result = adapting.adapt(index_dir, db=db, epochs=epochs, seed=seed, replay_path=replay, force=force)
        if as_json:
            print(json.dumps(result, ensure_ascii=False))
            return
        console.print(_summary(result), markup=False, highlight=False, soft_wrap=True)


def _summary(result: dict) -> str:
    before, after = result["before"], result["after"]
    lines = [f"Version {result['version']}: {result['path']} (fingerprint {result['fingerprint']}, adapted from "
             f"{'version ' + str(result['parent']) if result['parent'] is not None else 'the shipped model'}), "
             f"{result['labels']} labelled pairs, {result['fit_pairs']} fitted, {result['held_back']} held back; "
             f"{result['seconds']:.0f} s."]
    if before.get("n"):
        lines.append(f"{'held back':<22}{'before':>8}{'after':>8}")
        lines.append(f"{'macro-F1':<22}{before['macro_f1']:>8.3f}{after['macro_f1']:>8.3f}")
        lines.append(f"{'accuracy':<22}{before['accuracy']:>8.3f}{after['accuracy']:>8.3f}")
        for label in before["f1"]:
            lines.append(f"{label + ' F1':<22}{before['f1'][label]:>8.3f}{after['f1'][label]:>8.3f}")
    lines.append(f"{'replay macro-F1':<22}{result['replay_before']['macro_f1']:>8.3f}{result['replay_after']['macro_f1']:>8.3f}"
                 "   (the original calibration pairs: forgetting check)")
    if result["activated"]:
        lines.append("Active now. Roll back with: mgeo-index adapt --rollback")
    else:
        lines.append(f"NOT activated: it scores worse than the current model on the held-back labels "
                     f"({after['macro_f1']:.3f} < {before['macro_f1']:.3f}); the index keeps its model. More labels may "
                     "help; --force activates it anyway.")
    return "\n".join(lines)
