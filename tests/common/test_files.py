"""Atomic writes: the target is the old content or the whole new one, with the mode asked for."""

from __future__ import annotations

import os
import stat

import pytest

from fedsched.common.files import atomic_file, atomic_write


def test_replaces_the_content_and_leaves_no_temporary_file(tmp_path) -> None:
    target = tmp_path / "sub" / "x.bin"
    atomic_write(target, b"old")
    atomic_write(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.bin"]


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o640])
def test_mode_is_exact_whatever_the_umask(tmp_path, mode) -> None:
    old = os.umask(0o077)
    try:
        atomic_write(tmp_path / "k", b"secret", mode)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == mode


def test_default_mode_follows_the_umask(tmp_path) -> None:
    atomic_write(tmp_path / "d", b"x")
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o666 & ~_current_umask()


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_error_while_writing_keeps_the_old_file(tmp_path) -> None:
    target = tmp_path / "x"
    atomic_write(target, b"old")
    with pytest.raises(RuntimeError, match="boom"), atomic_file(target) as f:
        f.write(b"half")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
