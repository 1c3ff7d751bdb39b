"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every file fedsched rewrites in place (checkpoints, ONNX exports, certificates and keys,
weight ``.npz`` files, decision-log chunks) goes through :func:`atomic_file`: the data is
written to a unique temporary file in the same directory, flushed and fsynced, renamed over
the target with ``os.replace`` (atomic on POSIX), and the directory is fsynced so the rename
survives a crash. On any error the temporary file is removed and the target is untouched.

May import: the standard library only.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in ``path`` durable (best effort: not every platform opens directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; it replaces ``path`` on success.

    ``mode``: the new file's permission bits, exactly (whatever the umask); None keeps the
    default of a new file. Parent directories are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, data: bytes, mode: int | None = None) -> None:
    """Replace ``path``'s content with ``data`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path, mode) as f:
        f.write(data)


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it, which races with
    other threads creating files); 0o022 where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
