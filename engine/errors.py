"""BASIS Lab's error family, for the engine: the root is defined in ``storage.family`` (the
lowest layer) so that storage and engine raise members of one tree.

- :class:`BasisLabError`: every error the project raises on purpose;
- :class:`UserError`: bad input or a state the user can fix; one line naming the fix. The
  CLI (``engine.cli.main``) prints it as ``error: …`` and exits 2, the pages (``app.state.guarded``)
  show it as one error line; any other exception is a bug and keeps its traceback;
- :class:`InvalidValueError`: a refused value, also a ``ValueError``.

The engine's members: ``ConfigError`` (``engine.config``), ``DataError`` (``engine.data``),
``CheckpointError`` (``engine.training.checkpoints``), ``WhereError`` (``engine.analysis.where``),
``HostsError`` and ``ReportError`` (``engine.runner``), ``CliError`` (``engine.cli``): user
errors, and ``ValueError`` too, as callers that validate input catch those; ``TrainingDiverged``
is a ``BasisLabError`` recorded on its run, not a user error.

Failures of a task
------------------
A task (a run, a diagnosis, a report, a write, a heartbeat) ends on any ``Exception`` without
ending the process that runs it: ``TASK_FAILURES`` is what its boundary catches (never
``KeyboardInterrupt`` or ``SystemExit``). What is caught is then told apart by ``is_bug``:

- expected outcomes (``EXPECTED_FAILURES``): the project's own errors (a user error, a
  checkpoint refused, a diverged loss, the database refusing a write), the OS's (a full or
  read-only disk, a network), and a device out of memory (XLA's ``RESOURCE_EXHAUSTED``);
- anything else (a ``TypeError`` in the model, a ``KeyError`` in a library) is a bug of this
  code or of the libraries under it.

``failure_text`` is how a task's record states it: a user error its one line; another expected
failure ``failed: Type: message``; a bug ``bug: Type: message``; both of the latter followed by
the whole traceback, every frame and every chained cause, so nothing of it is lost.
"""

import traceback

from storage.family import BasisLabError, InvalidValueError, UserError

__all__ = ["EXPECTED_FAILURES", "LIBRARY_FAILURES", "TASK_FAILURES", "BasisLabError", "InvalidValueError", "SharedFailure", "UserError",
           "failure_text", "is_bug"]

TASK_FAILURES = (Exception,)
EXPECTED_FAILURES = (BasisLabError, OSError)
# What a library underneath raises on input it refuses or an environment it cannot use (a corpus
# file ``datasets`` cannot parse, a browser ``kaleido`` cannot start): the few places that turn a
# library's failure into one line naming the fix catch these, not every ``Exception``, so a bug
# there (a name or attribute error) still reads as one.
LIBRARY_FAILURES = (BasisLabError, OSError, ValueError, TypeError, LookupError, ArithmeticError, RuntimeError)
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # XLA's status of a device out of memory
RUNTIME_ERRORS = frozenset({"JaxRuntimeError", "XlaRuntimeError"})  # its class's name, as JAX versions spell it
BUG, FAILED = "bug", "failed"  # the labels of a failure's first line


class SharedFailure(BasisLabError):
    """A task ended because a task it shared failed (a cohort's one training), raised ``from``
    that failure: a bug exactly when its cause is one."""


def is_bug(error: BaseException) -> bool:
    """Whether ``error`` is a bug (of this code or a library's) rather than an expected outcome:
    not one of ``EXPECTED_FAILURES`` and not a device out of memory (a ``SharedFailure``: as its cause)."""
    if isinstance(error, SharedFailure) and error.__cause__ is not None:
        return is_bug(error.__cause__)
    if isinstance(error, EXPECTED_FAILURES):
        return False
    runtime = any(c.__name__ in RUNTIME_ERRORS for c in type(error).__mro__)
    return not (runtime and RESOURCE_EXHAUSTED in str(error))


def failure_text(error: BaseException) -> str:
    """``error`` as a task's record keeps it: a ``UserError``'s first line; else
    ``bug: Type: message`` (``is_bug``) or ``failed: Type: message``, then every line of its
    traceback (``traceback.format_exception``: all frames, chained causes included)."""
    message = str(error).strip()
    if isinstance(error, UserError):
        return message.splitlines()[0] if message else type(error).__name__
    label = BUG if is_bug(error) else FAILED
    head = f"{label}: {type(error).__name__}" + (f": {message}" if message else "")
    return head + "\n" + "".join(traceback.format_exception(error)).rstrip()
