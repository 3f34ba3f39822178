"""The one split of labelled pairs into holdout / dev / calib / train, shared by training and evaluation.

Splits are carved by a stable hash of the query's group (CCKS: query_id; Shenzhen: addr1) so that no
query appears on two sides: buckets 0–6 → ``holdout``, 7–14 → ``dev``, 15–19 → ``calib`` (temperature and
head fitting), 20–99 → ``train``.

``holdout`` is the untouched yardstick: no training, fitting or choice between variants reads it. Choices are
made on ``dev``; ``holdout`` is reported beside it (``mgeo-index eval … --split dev,holdout``) to show how much
the choosing itself flattered the dev figure. Until the split was carved, buckets 0–14 together were ``dev``,
so figures recorded before then are on both.
"""
from __future__ import annotations

import hashlib

SPLITS = ("holdout", "dev", "calib", "train")


def split_of(group: str) -> str:
    bucket = int(hashlib.md5(group.encode()).hexdigest(), 16) % 100
    return "holdout" if bucket < 7 else "dev" if bucket < 15 else "calib" if bucket < 20 else "train"
