"""Named kill points for crash tests: ``MGEO_INDEX_CRASH_AT=<name>`` makes the process SIGKILL itself there.

A SIGKILL cannot be caught, so nothing (no ``finally``, no ``except BaseException``) runs after it:
exactly what a power cut or the OOM killer does.  The points, in the order a write reaches them:

- ``stored``: the rows are committed to the store, nothing is embedded yet;
- ``embedding``: the first batch of new entries is embedded, the rest is not;
- ``index-write``: the FAISS file (or Milvus collection) is written, the n-gram index file is half written;
- ``switch``: every file of the new generation is complete, the pointer has not moved.
"""
from __future__ import annotations

import os
import signal

ENV = "MGEO_INDEX_CRASH_AT"
POINTS = ("stored", "embedding", "index-write", "switch")


def crashpoint(name: str) -> None:
    """SIGKILL this process if ``MGEO_INDEX_CRASH_AT`` names this point (tests only)."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
