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
"""

from storage.family import BasisLabError, InvalidValueError, UserError

__all__ = ["TASK_FAILURES", "BasisLabError", "InvalidValueError", "UserError"]

# What one task (a run, a diagnosis, a report, a write, a heartbeat) can fail with that ends
# that task and not the process running it: the project's own errors, the OS's (a full or
# read-only disk, a network), bad values, types, keys and arithmetic (a model that does not
# fit, a NaN), and the runtime failures of the libraries underneath (XLA's XlaRuntimeError,
# an exhausted device, a thread pool shut down: RuntimeError). A worker records these on the
# task and goes on. Not listed, so raised with their traceback: a name, import, attribute
# or assertion error (a bug in this code), KeyboardInterrupt and SystemExit.
TASK_FAILURES = (BasisLabError, OSError, ValueError, TypeError, LookupError, ArithmeticError, RuntimeError)
