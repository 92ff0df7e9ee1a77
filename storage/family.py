"""The root of BASIS Lab's one error family, in the lowest layer (plain classes, no imports) so
that storage and every engine package (``engine.errors`` re-exports it) raise members of one tree:

- :class:`BasisLabError`: every error the project raises on purpose;
- :class:`UserError`: bad input or a state the user can fix (a value out of range, a file
  that exists, a database that cannot be opened). Its message is one line naming the fix;
  the CLI prints it as ``error: …`` and exits 2, a page shows it as one error line.
  Anything else that reaches the CLI or a page is a bug and keeps its traceback;
- :class:`InvalidValueError`: a refused value, also a ``ValueError`` (callers that validate
  input catch those).
"""


class BasisLabError(Exception):
    """The root of every error BASIS Lab raises on purpose."""


class UserError(BasisLabError):
    """Bad input, or a state, that the user can fix; the message is one line naming the fix."""


class InvalidValueError(UserError, ValueError):
    """A value the lab refuses (too long, not UTF-8 text, out of the database's range, an
    unknown format); also a ``ValueError``, as callers that validate input catch those."""
