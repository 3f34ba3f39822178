"""A catalog writer (``build`` or ``add``) run in a child process that SIGKILLs itself at a crash point
(:mod:`mgeo_index.catalog.crashpoints`), shared by the kill -9 tests of the FAISS and the Milvus stores.

Writers run in children forked from a server that has imported the package once (a fresh interpreter
per kill would spend most of the test importing torch); each child is a separate process that really
receives SIGKILL.
"""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from mgeo_index.catalog.build import build
from mgeo_index.catalog.update import add

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["mgeo_index.catalog.build", "mgeo_index.catalog.update"])


def _writer(command: str, path: str, index_dir: str, bi_dir: str, point: str) -> None:
    os.environ["MGEO_INDEX_CRASH_AT"] = point
    if command == "build":
        build(path, index_dir, id_column="poi_id", model=bi_dir, device="cpu", chunk_size=16)
    else:
        add(path, index_dir, model=bi_dir, device="cpu", chunk_size=16)


def killed_writer(command: str, path: Path, index_dir: Path, bi_dir: Path, point: str) -> int:
    """Exit code of the ``command`` writer (on ``path``, into ``index_dir``) killed at ``point``."""
    child = _CONTEXT.Process(target=_writer, args=(command, str(path), str(index_dir), str(bi_dir), point))
    child.start()
    child.join(timeout=300)
    if child.is_alive():
        child.kill()
        pytest.fail(f"the {command} writer did not reach kill point {point!r} within 300 s")
    return child.exitcode
