"""The one atomic writer: every file mgeo-index writes for others to read (FAISS and n-gram indexes,
``index.json``, job part files and outputs, match outputs, ONNX graphs, training checkpoints) goes
through :func:`replace_atomic`, so a reader sees either the old file or the complete new one, and an
interrupted write leaves the old file untouched.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]


def fsync_dir(directory: PathLike) -> None:
    """fsync a directory so a rename inside it is durable (no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_atomic(path: PathLike, write: Callable[[str], None]) -> None:
    """Write a file so readers see either the old one or the complete new one.

    ``write(tmp)`` writes the content to a temporary file in the same directory (named
    ``.<name>.<random>.tmp``), which is fsynced, given the old file's mode (or a normal 0644: mkstemp
    creates 0600 files), moved over ``path`` with ``os.replace`` (atomic on POSIX and Windows), and the
    directory is fsynced. On any error the temporary file is removed and an existing ``path`` is left
    untouched.
    """
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        try:
            mode = os.stat(target).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)


def writable(directory: PathLike) -> bool:
    """Whether files can be created in ``directory`` (or, when it does not exist, in its nearest existing
    parent), as the kernel answers ``access(2)``: a read-only mount or an immutable directory says no, as root
    too (nothing is written to find out)."""
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def write_text_atomic(path: PathLike, text: str) -> None:
    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    replace_atomic(path, write)


def write_json_atomic(path: PathLike, data) -> None:
    write_text_atomic(path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")
