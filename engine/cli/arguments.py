"""The options several commands share, each declared once, and the checks of their values.

A value argparse cannot convert (``--concurrent x``) is argparse's usage error; a value out
of range (``--concurrent 0``) is a :class:`CliError` raised by the command before it writes
anything: one line, ``error: --concurrent must be >= 1 (got 0)``, exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from contextvars import ContextVar
from typing import Iterable, Iterator

from engine.config import LARGE_LAUNCH
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.errors import UserError
from storage.outputs import FORCE_FLAG

log = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2


class CliError(UserError, ValueError):
    """Bad command-line input: printed without a traceback, exit status 2; a ``ValueError``
    too (``engine.errors``), as ``engine.api``, which raises the same checks, promises."""


def db_parent() -> argparse.ArgumentParser:
    """``--db URL``, which every command takes."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", metavar="URL", help="SQLAlchemy URL or SQLite path (default: $BASIS_LAB_DB_URL or the default file)")
    return p


def where_parent() -> argparse.ArgumentParser:
    """``--where EXPR``, the one run filter of list, export and summary (``engine.analysis.where``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--where", metavar="EXPR",
                   help="only the runs this filter matches, e.g. \"rank >= 8 and lam == 0 and val_loss < 6.5 and tags "
                        "contains pilot\": any run or config field or metric (its final value); and, or, not, ( ), "
                        "==, !=, <, <=, >, >=, contains, in [..]; empty or blank: every run")
    return p


def add_concurrent(parser) -> None:
    """``--concurrent N`` (checked with :func:`at_least`, N >= 1)."""
    parser.add_argument("--concurrent", type=int, default=1, help="runs trained at once (default: 1)")


def add_force(parser, target: str = "--out") -> None:
    """``--force``: overwrite the output ``target`` names, never the database. A refusal names
    it as ``storage.outputs.FORCE_FLAG`` (the one definition; the Python API names ``force=True``)."""
    parser.add_argument(FORCE_FLAG, action="store_true", help=f"overwrite {target} if it exists (never the database)")


def add_yes(parser) -> None:
    """``--yes``: launch more than ``LARGE_LAUNCH`` runs without being asked."""
    parser.add_argument("--yes", action="store_true",
                        help=f"launch even when that is more than {LARGE_LAUNCH} runs (asked for otherwise)")


def add_queue_only(parser) -> None:
    """``--queue-only``: queue the runs for workers instead of training them here."""
    parser.add_argument("--queue-only", action="store_true",
                        help="queue the runs for `python -m engine worker` processes instead of training them here")


def add_launch_options(parser) -> None:
    """``--queue-only``, ``--tags`` and ``--yes``, which ``run`` and ``sweep`` share."""
    add_queue_only(parser)
    parser.add_argument("--tags", metavar="LIST", help="comma list of tags for every run (filter by them on Runs)")
    add_yes(parser)


def add_at_step(parser, text: str) -> None:
    """``--at-step N`` (checked with :func:`at_least`, N >= 0)."""
    parser.add_argument("--at-step", type=int, help=text)


def add_margin(parser, text: str, default: float | None = MARGIN) -> None:
    """``--margin NATS``, the equivalence margin δ (checked with :func:`margin`)."""
    parser.add_argument("--margin", type=float, default=default, metavar="NATS", help=text)


def add_no_adjust(parser) -> None:
    """``--no-adjust``: Table 3's verdicts each at its own 5 % level instead of Holm's over the table."""
    parser.add_argument("--no-adjust", action="store_true",
                        help="read each row of Table 3 at its own 5%% level (default: the verdicts hold at 5%% for "
                             "the whole table, Holm's adjustment over its rows' tests)")


def at_least(value, flag: str, minimum: float, unit: str = "") -> None:
    """CliError unless ``value`` (None: not given) is ``>= minimum``; ``flag`` names the option."""
    if value is not None and value < minimum:
        raise CliError(f"{flag} must be >= {minimum}{unit} (got {value})")


def margin(value) -> float:
    """``--margin`` as a checked equivalence margin (``engine.core.stats.check_margin``)."""
    from engine.core.stats import check_margin

    try:
        return check_margin(value)
    except ValueError as e:
        raise CliError(f"--margin: {e}") from None


def parse_tags(text: str | Iterable[str] | None, flag: str = "--tags") -> tuple[str, ...]:
    """The ``--tags`` comma list (or a list of tags or of such lists, as ``engine.api`` takes
    them): stripped, without empties or repeats; each short enough and UTF-8 text
    (``storage.limits``), else a CliError naming ``flag``."""
    from storage.limits import TAG_MAX, check_utf8

    parts = [text] if text is None or isinstance(text, str) else list(text)
    found = tuple(dict.fromkeys(t.strip() for part in parts for t in str(part or "").split(",") if t.strip()))
    for t in found:
        if len(t) > TAG_MAX:
            raise CliError(f"{flag}: {t[:20]!r}… is longer than {TAG_MAX} characters; use shorter tags")
        try:
            check_utf8(flag, t)
        except ValueError as e:
            raise CliError(str(e)) from None
    return found


# the stores the running ``main`` call's command opened (``open_store``), closed when it returns
_OPENED: ContextVar[list | None] = ContextVar("basis_lab_cli_stores", default=None)


def open_store(url, *, create: bool = True):
    """The ``RunStore`` at ``--db`` (``create=False``: a missing SQLite file is a StorageError),
    closed once the command returns (``closing_stores``)."""
    from storage import RunStore

    store = RunStore(url, create=create)
    opened = _OPENED.get()
    if opened is not None:
        opened.append(store)
    return store


@contextlib.contextmanager
def closing_stores() -> Iterator[None]:
    """Close every store the command run in the block opens (``engine.cli.main.main``), each
    on its own, when it ends: their pooled connections end, and SQLite, at the close of a
    file's last connection, writes its write-ahead log back into the file and removes it, so
    that, with no other process holding the file open, a copy of the ``.db`` alone holds
    every run (``python -m engine backup`` copies a lab in use). Each call of ``main`` (a
    thread's, a nested one's) closes its own stores only."""
    opened: list = []
    token = _OPENED.set(opened)
    try:
        yield
    finally:
        _OPENED.reset(token)
        for store in reversed(opened):
            try:
                store.close()
            except Exception:  # closing must not replace the command's exit status
                log.warning("could not close %r", store, exc_info=True)


def where_ids(store, where: str | None, runs=None) -> list[int] | None:
    """The ids of ``runs`` (None: every run) that the ``--where`` filter matches; None: every run.
    A filter matching no run is a CliError (nothing is written)."""
    from engine.reads.queries import where_ids as matching

    ids = matching(store, where, runs)
    if ids is not None and not ids and where:
        raise CliError(f"no run matches --where {where!r}; `python -m engine list` shows the runs")
    return ids
