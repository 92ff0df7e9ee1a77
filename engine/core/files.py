"""Files written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that ``path`` is either as it was or holds all of
    it: a temporary file beside it, renamed over it (``os.replace``), with the permissions
    ``open()`` would give a new file (not ``mkstemp``'s private 0600). Two processes writing one
    path leave one whole file; on an error the temporary file is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(dir=path.absolute().parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
