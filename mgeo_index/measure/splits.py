"""The one split of labelled pairs into dev / calib / train, shared by training and evaluation.

Splits are carved by a stable hash of the query's group (CCKS: query_id; Shenzhen: addr1) so that no
query appears on both sides: buckets 0–14 → ``dev`` (reported), 15–19 → ``calib`` (temperature
fitting), 20–99 → ``train``.
"""
from __future__ import annotations

import hashlib


def split_of(group: str) -> str:
    bucket = int(hashlib.md5(group.encode()).hexdigest(), 16) % 100
    return "dev" if bucket < 15 else "calib" if bucket < 20 else "train"
