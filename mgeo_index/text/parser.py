"""Address parsing: normalize → element tagger (batched) → gazetteer admin chain with codes.

``parse(["北京朝阳建国路88号"])`` →
``[{"input": ..., "text": "北京朝阳建国路88号", "elements": [{"label": "prov", "text": "北京", "start": 0, "end": 2}, ...],
"admin": {"province": "北京市", "province_code": "110000", "city": ..., "district": "朝阳区", ...}}]``.
Spans index into ``text`` (the normalized address). ``redundant`` spans (noise) are left out.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import contextmanager
from functools import lru_cache

import torch

from mgeo_index.text.gazetteer import DEFAULT_PATH as GAZETTEER_PATH, Gazetteer, default_gazetteer
from mgeo_index.text.normalize import normalize
from mgeo_index.text.tagger import DEFAULT_DIR as TAGGER_DIR, Tagger, default_tagger

ADMIN_LEVELS = {"prov": 1, "city": 2, "district": 3, "town": 4}
BATCH = 128  # measured fastest on this CPU (the CRF step tensors stay in cache)


@contextmanager
def one_thread():
    """Run torch on one intra-op thread for the tagger: its small per-character LSTM and CRF steps
    gain nothing from a second thread, and on a busy 2-core machine two threads were 4–10× slower
    (OpenMP threads waiting on each other). The previous setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tag_batched(tagger: Tagger, texts: Sequence[str], batch_size: int = BATCH) -> list[list[tuple[str, int, int]]]:
    """Tagger spans per text, in input order; batches are cut from the length-sorted texts."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list = [None] * len(texts)
    with one_thread():
        for i in range(0, len(order), batch_size):
            chunk = order[i : i + batch_size]
            for j, spans in zip(chunk, tagger.tag([texts[j] for j in chunk])):
                out[j] = spans
    return out


def admin_mentions(text: str, spans: Sequence[tuple[str, int, int]]) -> list[tuple[str, int]]:
    return [(text[s:e], ADMIN_LEVELS[label]) for label, s, e in spans if label in ADMIN_LEVELS]


def parse(
    texts: Sequence[str], *, tagger: Tagger | None = None, gazetteer: Gazetteer | None = None
) -> list[dict]:
    """Elements and standardized admin fields of each address (see the module docstring)."""
    tagger = tagger or default_tagger()
    gazetteer = gazetteer or default_gazetteer()
    norm = [normalize(t) for t in texts]
    results = []
    for raw, text, spans in zip(texts, norm, tag_batched(tagger, norm)):
        results.append({
            "input": raw,
            "text": text,
            "elements": [
                {"label": label, "text": text[s:e], "start": s, "end": e}
                for label, s, e in spans if label != "redundant"
            ],
            "admin": gazetteer.resolve(admin_mentions(text, spans)),
        })
    return results


@lru_cache(maxsize=1)
def parser_version() -> str:
    """Fingerprint of the shipped tagger and gazetteer files (stored with each parsed entry)."""
    digest = hashlib.sha256()
    for path in (TAGGER_DIR / "model.safetensors", GAZETTEER_PATH):
        digest.update(path.read_bytes())
    return f"parser-{digest.hexdigest()[:16]}"
