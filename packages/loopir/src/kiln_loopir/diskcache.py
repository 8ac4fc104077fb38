"""Where kiln's on-disk caches live, and how every one of their files is written.

Every cache kiln keeps (the C++ backend's objects, the Triton backend's modules and autotune
choices, loopir's matmul-padding verdicts) lies under one root, ``$KILN_CACHE_DIR`` (default
``~/.cache/kiln``), one folder per owner.

Note [Atomic cache writes]: a file is written under a unique temporary name in its final folder
and renamed into place, so a reader sees either no file or a complete one, and two processes
racing on one key both write complete, identical files. What a crash or a hand leaves behind is
each reader's to check (Note [Verified cache entries] in kiln_codegen_cpp's build.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """``$KILN_CACHE_DIR``, or ``~/.cache/kiln``."""
    return Path(os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln"))


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (Note [Atomic cache writes])."""
    # the folder may be gone even while its files are in use (a cleared or temporary cache dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
