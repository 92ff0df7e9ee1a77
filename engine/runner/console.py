"""Each run's console: what its training thread writes to ``sys.stdout`` and ``sys.stderr``.

``install(route)`` puts a ``ThreadConsole`` in front of each of the two streams, once per
process (again only when something else replaced it since). Every write goes to the real
stream first, unchanged: the terminal, the dashboard's output and pytest's capture see what
they saw before. Then, when ``route()`` names a sink for the writing thread (the run that
thread trains: ``engine.runner.runlog``), the text is handed to it too, as ``sink(source,
text)``: several runs training in threads of one process each get their own lines.

Left out, as they are kept already or are no console lines:

- what ``logging``'s (and absl's) stream handlers write (the run's log keeps the record itself), and what a
  warning prints (its hook keeps the warning): the writing code is in module ``logging``, or
  the thread is inside ``quiet()``;
- tqdm's redraws of a progress bar (the run's log has a progress line at every evaluation);
- what a sink does while it takes a line (no capture of a capture).

C-level output (XLA and other native code writing to file descriptor 2) bypasses
``sys.stderr`` and is not captured: a file descriptor is the whole process's, not a thread's.

``Lines`` cuts what a stream receives into lines: ``\\n`` ends one, ``\\r`` starts it over (a
redrawn line keeps its last drawing), ANSI escapes are removed, blank lines are dropped and a
line keeps at most ``limit`` characters.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from typing import Any, Callable, Iterator, Optional

Sink = Callable[[str, str], None]
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_local = threading.local()  # .busy: this thread is inside a capture, or writes what is kept already
_install_lock = threading.Lock()
_HANDLED = ("logging", "absl.logging", "tqdm")  # modules whose writes are kept otherwise, or are no lines


def busy() -> bool:
    """Whether this thread is inside ``quiet()`` (or a sink): what it writes or logs now is kept already."""
    return getattr(_local, "busy", False)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """What this thread writes meanwhile is not captured (it is kept another way)."""
    before = busy()
    _local.busy = True
    try:
        yield
    finally:
        _local.busy = before


def _handled(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in _HANDLED)


class ThreadConsole:
    """A text stream that writes to ``real`` and hands what a run's thread writes to its sink."""

    def __init__(self, real: Any, source: str, route: Callable[[], Optional[Sink]]):
        self.real, self.source, self.route = real, source, route

    def write(self, text: str) -> int:
        written = self.real.write(text)
        if busy() or not isinstance(text, str) or not text:
            return written
        sink = self.route()
        if sink is None or _handled(sys._getframe(1).f_globals.get("__name__", "")):
            return written
        with quiet():
            try:
                sink(self.source, text)
            except Exception:  # noqa: BLE001 - a run's console never fails the code that printed
                pass
        return written

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.real.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty, buffer, …: the real stream's
        return getattr(self.real, name)


def install(route: Callable[[], Optional[Sink]]) -> None:
    """Put a ``ThreadConsole`` routing by ``route`` in front of ``sys.stdout`` and ``sys.stderr``
    unless one is there already."""
    with _install_lock:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, ThreadConsole):
                setattr(sys, name, ThreadConsole(stream, name, route))


class Lines:
    """Text written in pieces, cut into lines (see the module)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.pending = ""

    def feed(self, text: str) -> list[str]:
        """The lines ``text`` completes; what follows the last newline waits for the next."""
        *done, rest = (self.pending + text).split("\n")
        self.pending = self._shorten(rest)
        return [line for line in map(self._clean, done) if line]

    def rest(self) -> list[str]:
        """The unfinished line, if any (at the end of the run)."""
        rest, self.pending = self.pending, ""
        line = self._clean(rest)
        return [line] if line else []

    def _shorten(self, text: str) -> str:
        start = text.rfind("\r", 0, len(text) - 1) + 1  # a \r at the very end may be half of \r\n
        return text[start:start + self.limit + 1]

    def _clean(self, line: str) -> str:
        line = line[:-1] if line.endswith("\r") else line
        line = _ANSI.sub("", line[line.rfind("\r") + 1:])
        return line.rstrip()[:self.limit + 1]
