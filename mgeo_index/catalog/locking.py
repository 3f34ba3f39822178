"""One writer per index directory: an advisory ``flock`` on ``DIR/.writer.lock`` that holds the PID.

The kernel drops a ``flock`` when its holder dies (even by ``kill -9``), so a crashed writer never
blocks the next one; the PID, host and command written into the file only serve the message a
second writer gets.  Readers take no lock: they follow the generation pointer.  The lock relies on
POSIX ``flock`` semantics, so the index directory must be on a local file system (not NFS) when
several machines write to it.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

LOCK_FILE = ".writer.lock"


class Locked(Exception):
    """Another process is writing to this index directory."""


@contextmanager
def writer_lock(index_dir: str | Path, command: str | None = None) -> Iterator[None]:
    """Hold the index directory's writer lock, or raise :class:`Locked` naming the holder's PID."""
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    path = index_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Locked(_holder_message(path, index_dir)) from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command or " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:]),
            "since": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder_message(path: Path, index_dir: Path) -> str:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    who = f"PID {holder.get('pid', '?')}"
    if holder.get("host"):
        who += f" on {holder['host']}"
    detail = ", ".join(f"{k} {holder[k]}" for k in ("command", "since") if holder.get(k))
    return (
        f"{index_dir} is locked by {who}" + (f" ({detail})" if detail else "")
        + "; another build/add/remove/gc/repair is writing it. Wait for it to finish and re-run."
    )
