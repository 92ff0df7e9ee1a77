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

__all__ = ["FORCE_FLAG", "OutputExistsError", "refuse_special", "special_kind"]

FORCE_FLAG = "--force"  # how the command line asks to overwrite an output (``engine.cli.arguments.add_force``)


class OutputExistsError(StorageError):
    """An output that exists (or holds files) while overwriting was not asked for. The one
    definition of that message: its text names the option the way the command line does
    (``--force``); ``spelled`` gives the same error naming it another face's way (the Python
    API's ``force=True``)."""

    def __init__(self, shown: str, rest: str = "already exists; pass {force} to overwrite it, or choose another path",
                 force: str = FORCE_FLAG):
        """``shown``: the path as the user gave it; ``rest``: what follows it, ``{force}`` where the option goes."""
        self.shown, self.rest, self.force = shown, rest, force
        super().__init__(f"{shown} {rest.replace('{force}', force)}")

    def spelled(self, force: str) -> "OutputExistsError":
        """The same error, naming the option as ``force`` (``"force=True"``)."""
        return type(self)(self.shown, self.rest, force)

    def __reduce__(self):
        return type(self), (self.shown, self.rest, self.force)


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
