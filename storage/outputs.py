"""The rule every file written at a path the user names follows (``export --out``,
``backup OUT``, ``summary --out``, ``diagnose --out``, ``report --out``): the file is written
beside the path and renamed over it (``os.replace``), which would turn a device, a FIFO or a
socket there into a regular file (as root, ``--out /dev/null --force`` would replace
``/dev/null``). So an output never replaces anything but a regular file: a path that names
something else (links followed) is refused in one line, ``--force`` or not, and nothing is
written.
"""

from __future__ import annotations

import os
import stat
from typing import Callable, Optional

from .errors import StorageError

__all__ = ["refuse_special", "special_kind"]

_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(path: "str | os.PathLike[str]") -> Optional[str]:
    """What ``path`` names when something is there that is not a regular file, links
    followed (``"a FIFO (named pipe)"``, ``"a character device"``, ``"a directory"``, …);
    None for a regular file or for nothing there (a dangling link included: writing it
    makes a regular file)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def refuse_special(path: "str | os.PathLike[str]", shown: Optional[str] = None,
                   error: Callable[[str], Exception] = StorageError) -> None:
    """Raise ``error`` (one line naming the fix; a :class:`StorageError` by default) when
    ``path`` names something other than a regular file (:func:`special_kind`); an output
    never replaces one. ``shown``: the path as the user typed it."""
    kind = special_kind(path)
    if kind is not None:
        raise error(f"refusing to write {shown or os.fspath(path)}: it is {kind}, not a regular file, and an output "
                    "never replaces one; choose a file path")
