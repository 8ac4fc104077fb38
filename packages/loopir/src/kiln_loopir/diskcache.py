"""Where kiln's on-disk caches live, and how every one of their files is written.

Every cache kiln keeps (the C++ backend's objects, the Triton backend's modules and autotune
choices, loopir's matmul-padding verdicts) lies under one root, ``$KILN_CACHE_DIR`` (default
``~/.cache/kiln``), one folder per owner.

Note [Atomic cache writes]: a file is written under a unique temporary name in its final folder
and renamed into place, so a reader sees either no file or a complete one, and two processes
racing on one key both write complete, identical files. What a crash or a hand leaves behind is
each reader's to check (Note [Verified cache entries] in kiln_codegen_cpp's build.py).

Note [Cache file modes]: cache files get the user's umask, as any file the user creates (0644
under the usual 022; group-readable under 002, for a cache shared by a team), not the 0600 that
``tempfile.mkstemp`` forces. The temporary file is therefore opened by hand, exclusively, with
mode 0666 (0777 for a shared object) masked by the umask, which is what the kernel applies.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def cache_root() -> Path:
    """``$KILN_CACHE_DIR``, or ``~/.cache/kiln``."""
    return Path(os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln"))


def temp_file(path: Path, mode: int = 0o666) -> tuple[int, str]:
    """A new, empty, uniquely named file beside ``path`` (to be renamed onto it): its open file
    descriptor and name. Its mode is ``mode`` masked by the umask (Note [Cache file modes])."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:  # another writer drew the same name: draw again
            continue


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (Note [Atomic cache writes])."""
    # the folder may be gone even while its files are in use (a cleared or temporary cache dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
