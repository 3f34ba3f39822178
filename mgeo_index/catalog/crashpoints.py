"""Named kill points for crash tests: ``MGEO_INDEX_CRASH_AT=<name>`` makes the process SIGKILL itself there.

A SIGKILL cannot be caught, so nothing (no ``finally``, no ``except BaseException``) runs after it:
exactly what a power cut or the OOM killer does.  The points, in the order a write reaches them:

- ``stored``: the rows are committed to the store, nothing is embedded yet;
- ``embedding``: the first batch of new entries is embedded, the rest is not;
- ``index-write``: the FAISS file (or Milvus collection) is written, the n-gram index file is half written;
- ``switch``: every file of the new generation is complete, the pointer has not moved;
- ``job-part``: a normalize job recorded a part (``job-part:N``: its N-th).
"""
from __future__ import annotations

import os
import signal

ENV = "MGEO_INDEX_CRASH_AT"
POINTS = ("stored", "embedding", "index-write", "switch")  # an index write's
JOB_POINTS = ("job-part",)  # a normalize job's


def crashpoint(name: str, count: int | None = None) -> None:
    """SIGKILL this process if ``MGEO_INDEX_CRASH_AT`` names this point (tests only); ``name:N`` names its
    ``count``-th passage."""
    if name not in POINTS + JOB_POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS + JOB_POINTS)}")
    wanted = os.environ.get(ENV)
    if wanted == name or (count is not None and wanted == f"{name}:{count}"):
        os.kill(os.getpid(), signal.SIGKILL)
