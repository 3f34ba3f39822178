"""Calibrate an existing cross-encoder again, every part that is fitted around its network: temperature, feature
head and stack (:mod:`~mgeo_index.training.calibrate`), the group head (:mod:`~mgeo_index.training.group`) and the
number policy; ``scripts/recalibrate.py`` runs it. Above both modules it calls, so neither imports the other's
caller.
"""
from __future__ import annotations

from pathlib import Path

from mgeo_index.model.cross_encoder import load_cross_encoder
from mgeo_index.training import data
from mgeo_index.training.calibrate import calibrate, fit_decision, fit_number_policy
from mgeo_index.training.group import SHIPPED_HELD_OUT, fit_group_head, group_head_pairs


def recalibrate(cross_dir: Path, data_dir: Path, *, decision_only: bool = False, head: str = "mlp") -> dict:
    """Calibrate an existing cross-encoder again (temperature, feature head, stack, decision offsets, group head;
    or, ``decision_only``, the decision offsets and the group head; then the number policy) on the shared data;
    saved in place. The stack is
    fitted on the calibration split of the CCKS pairs and Shenzhen's validation file; the MLP head trains
    on their train split, a tree head on the train split of every labelled pair file (:func:`data.all_pairs`:
    trees gain from the extra round-1 and Shenzhen pairs, MLPs lose); the group head on what
    :func:`mgeo_index.training.group.group_head_pairs` names, its stack and offsets on the calibration and dev splits
    (:data:`~mgeo_index.training.group.SHIPPED_HELD_OUT`)."""
    ccks = data.ccks_pairs(data_dir)
    if decision_only:
        cross = load_cross_encoder(cross_dir, group_head=False)
        fit_decision(cross, data.split_examples(ccks, "calib"))
        stats = {"decision_offsets": dict(zip(cross.labels, cross.decision_offsets))}
    else:
        cross = load_cross_encoder(cross_dir, stacked=False)
        stats = calibrate(cross, ccks + data.shenzhen_pairs(data_dir), ccks, head=head,
                          head_pairs=data.all_pairs(data_dir) if head == "trees" else None)
    stats["group_head"] = fit_group_head(cross, *group_head_pairs(data_dir), held_out=SHIPPED_HELD_OUT)
    stats["number_policy"] = fit_number_policy(cross, data.split_examples(ccks, "calib"))
    cross.save(cross_dir)
    return stats
