"""kiln_loopir.diskcache: atomic writes that leave no temporary behind, with the user's umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_loopir.diskcache import temp_file, write_atomic


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_cache_files_get_the_users_umask(tmp_path: Path, umask: None, mask: int, expected: int) -> None:
    """Note [Cache file modes]: as any file the user creates, not mkstemp's 0600."""
    os.umask(mask)
    path = tmp_path / "sub" / "entry.json"
    write_atomic(path, "{}")
    assert path.read_text() == "{}"
    assert _mode(path) == expected
    assert [p.name for p in path.parent.iterdir()] == ["entry.json"]  # no temporary left


def test_temp_files_are_new_and_exclusive(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "kernels.so"
    opened = [temp_file(target, 0o777) for _ in range(20)]
    for fd, _ in opened:
        os.close(fd)
    names = {name for _, name in opened}
    assert len(names) == 20 and all(Path(n).parent == tmp_path for n in names)
    assert {_mode(Path(n)) for n in names} == {0o755}
    assert not target.exists()


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "entry.txt", 42)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
