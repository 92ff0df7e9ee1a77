"""Filter runs with one expression: ``rank >= 8 and lam == 0 and val_loss < 6.5 and tags contains pilot``.

The same syntax serves ``python -m engine list/export/summary --where``, the Runs page,
Compare's run picker and ``engine.api.Lab``. Grammar (keywords case-insensitive)::

    expr       := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | "(" expr ")" | comparison
    comparison := FIELD OP value | FIELD "contains" value | FIELD ["not"] "in" "[" value ("," value)* "]"
    OP         := "==" | "=" | "!=" | "<" | "<=" | ">" | ">="
    value      := number | "quoted" | 'quoted' | bare-word | true | false | none

so ``not`` binds tighter than ``and``, which binds tighter than ``or``. A FIELD is a column
of :func:`runs_table`: a run field (``id``, ``name``, ``status``, ``estimator``, ``rank``,
``lam``, ``seed``, ``preset``, ``steps``, ``steps_done``, ``sweep``, ``tags``, ``notes``, …), any
``RunConfig`` field (nested ones as ``dataset_options.source``), or the name of any metric
(``val_loss``, ``cos/head``, ``tokens_per_s``), meaning the run's latest (final) value of it.

Comparisons: numbers compare as numbers, times (``created_at``) with a date such as
``2026-11-25``, other values as text (``==`` exact; ``contains`` a case-insensitive
substring, or an element of a list such as ``tags``). A run without the value (an exact
run's ``rank``, a metric it never recorded) satisfies no comparison but ``!=`` and
``== none``: ``a != b`` is always ``not (a == b)``. No ``eval``: a recursive-descent parser
builds the tree; a bad expression or an unknown field raises :class:`WhereError` with a
one-line message naming the fix.

Limits: a filter holds at most ``MAX_LENGTH`` characters (checked before it is read) and
nests ``not`` and parentheses at most ``MAX_DEPTH`` deep (checked as it is read), so a
filter from a shared link or a script (400 parentheses, 1,000 ``not``s) is refused in one
line naming the limit, never by Python's recursion limit. A filter that is empty or only
white space is no filter (every run) where one is optional: ``--where``, ``Lab``, the
pages' filter boxes and links; ``parse`` itself refuses it ("the filter is empty").
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np
import pandas as pd

from engine.config import RunConfig
from engine.errors import UserError

ORDERING = ("<", "<=", ">", ">=")
KEYWORDS = ("and", "or", "not", "in", "contains", "true", "false", "none", "null")
EXAMPLE = "rank >= 8 and lam == 0 and val_loss < 6.5 and tags contains pilot"
MAX_LENGTH = 10_000  # characters of one filter (a list of 1,000 run ids fits)
MAX_DEPTH = 32  # levels of ``not`` and parentheses, one inside another
# the run fields a filter can name: the record's columns (``sweep`` for sweep_id)
RUN_FIELDS = ("id", "uid", "name", "status", "created_at", "started_at", "finished_at", "heartbeat_at", "estimator",
              "rank", "lam", "seed", "preset", "steps", "steps_done", "error", "notes", "git_commit", "device", "owner",
              "sweep", "tags", "worker_id", "checkpoint_step")


class WhereError(UserError, ValueError):
    """A filter that cannot be read or names an unknown field: a one-line message with the fix."""


# ----------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class Compare:
    """``field op value``; op is ``==``, ``!=``, one of ORDERING, ``contains`` or ``in`` (value a tuple)."""
    field: str
    op: str
    value: Any


@dataclass(frozen=True)
class Not:
    inner: "Expr"


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    parts: tuple


Expr = Union[Compare, Not, BoolOp]


def fields_of(expr: Expr) -> list[str]:
    """The field names ``expr`` reads, in order of first use."""
    if isinstance(expr, Compare):
        return [expr.field]
    if isinstance(expr, Not):
        return fields_of(expr.inner)
    return list(dict.fromkeys(f for p in expr.parts for f in fields_of(p)))


# ----------------------------------------------------------------------------- tokens and parser

_TOKEN = re.compile(r"""
    (?P<space>[\s\u2060]+)  # \u2060: the invisible joiner a page puts before an operator (core.text.untypeset)
  | (?P<op>==|!=|<=|>=|<|>|=)
  | (?P<punct>[()\[\],])
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<word>[A-Za-z0-9_.+\-][A-Za-z0-9_./:+\-]*)
""", re.VERBOSE)


@dataclass(frozen=True)
class _Token:
    kind: str  # op, punct, string, word, end
    text: str
    pos: int


def _tokens(text: str) -> list[_Token]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None and text[pos] in "\"'":
            raise WhereError(f"unclosed quote at character {pos + 1}; close it with {text[pos]}")
        if m is None:
            raise WhereError(f"cannot read {text[pos:pos + 10]!r} at character {pos + 1}; quote text values, "
                             f"e.g. {EXAMPLE}")
        if m.lastgroup != "space":
            out.append(_Token(str(m.lastgroup), m.group(), pos))
        pos = m.end()
    out.append(_Token("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0  # levels of ``not`` and parentheses around the token being read

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def keyword(self, word: str) -> bool:
        if self.tok.kind == "word" and self.tok.text.lower() == word:
            self.i += 1
            return True
        return False

    def punct(self, char: str) -> bool:
        if self.tok.kind == "punct" and self.tok.text == char:
            self.i += 1
            return True
        return False

    def fail(self, expected: str) -> WhereError:
        got = "the end" if self.tok.kind == "end" else repr(self.tok.text)
        return WhereError(f"expected {expected} at character {self.tok.pos + 1} but found {got}; "
                          f"write it like: {EXAMPLE}")

    def parse(self) -> Expr:
        if self.tok.kind == "end":
            raise WhereError(f"the filter is empty; write it like: {EXAMPLE}")
        expr = self.or_expr()
        if self.tok.kind != "end":
            raise self.fail("'and', 'or' or ')'")
        return expr

    def or_expr(self) -> Expr:
        parts = [self.and_expr()]
        while self.keyword("or"):
            parts.append(self.and_expr())
        return parts[0] if len(parts) == 1 else BoolOp("or", tuple(parts))

    def and_expr(self) -> Expr:
        parts = [self.not_expr()]
        while self.keyword("and"):
            parts.append(self.not_expr())
        return parts[0] if len(parts) == 1 else BoolOp("and", tuple(parts))

    def deeper(self, by: int) -> None:
        """Enter (``by`` 1: just after reading it) or leave (-1) a ``not`` or a parenthesis;
        deeper than ``MAX_DEPTH`` is a WhereError naming the one that went too deep."""
        self.depth += by
        if self.depth > MAX_DEPTH:
            raise WhereError(f"the filter nests 'not' and parentheses more than {MAX_DEPTH} deep (at character "
                             f"{self.tokens[self.i - 1].pos + 1}); the most is {MAX_DEPTH}: write it flatter, "
                             "e.g. a != b for not a == b")

    def not_expr(self) -> Expr:
        if self.keyword("not"):
            self.deeper(1)
            inner = self.not_expr()
            self.deeper(-1)
            return Not(inner)
        if self.punct("("):
            self.deeper(1)
            inner = self.or_expr()
            if not self.punct(")"):
                raise self.fail("')'")
            self.deeper(-1)
            return inner
        return self.comparison()

    def comparison(self) -> Expr:
        tok = self.tok
        if tok.kind != "word" or tok.text.lower() in KEYWORDS or _number(tok.text) is not None:
            raise self.fail("a field name (e.g. rank, val_loss, tags)")
        self.i += 1
        field = tok.text
        if self.tok.kind == "op":
            op = "==" if self.tok.text == "=" else self.tok.text
            self.i += 1
            return Compare(field, op, self.value())
        if self.keyword("contains"):
            return Compare(field, "contains", self.value())
        negated = self.keyword("not")
        if self.keyword("in"):
            if not self.punct("["):
                raise self.fail("'[' after 'in'")
            values = [self.value()]
            while self.punct(","):
                values.append(self.value())
            if not self.punct("]"):
                raise self.fail("',' or ']'")
            node = Compare(field, "in", tuple(values))
            return Not(node) if negated else node
        raise self.fail(f"an operator after {field!r} (==, !=, <, <=, >, >=, contains, in [..])")

    def value(self) -> Any:
        tok = self.tok
        if tok.kind == "string":
            self.i += 1
            return re.sub(r"\\(.)", r"\1", tok.text[1:-1])
        if tok.kind == "word" and tok.text.lower() not in ("and", "or", "not", "in", "contains"):
            self.i += 1
            low = tok.text.lower()
            if low in ("true", "false"):
                return low == "true"
            if low in ("none", "null"):
                return None
            number = _number(tok.text)
            return tok.text if number is None else number
        raise self.fail("a value (a number, a word or a quoted text)")


def _number(text: str):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse(text: str) -> Expr:
    """The tree of ``text``; :class:`WhereError` if it is not a filter, or is longer than
    ``MAX_LENGTH`` characters (refused before it is read) or nests deeper than ``MAX_DEPTH``."""
    text = str(text)
    if len(text) > MAX_LENGTH:
        raise WhereError(f"the filter is {len(text):,} characters long; the most is {MAX_LENGTH:,}: shorten it")
    return _Parser(text).parse()


# ----------------------------------------------------------------------------- the frame of runs


def _flat(config: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_fields() -> list[str]:
    """Every ``RunConfig`` field (the defaults' flattened keys), for names a filter knows
    even before any run has them."""
    return list(_flat(RunConfig().to_dict()))


def runs_table(records: Sequence, finals: pd.DataFrame | None = None) -> pd.DataFrame:
    """The frame filters run over: one row per run record (``storage.RunRecord``), by id.
    Columns: :data:`RUN_FIELDS` (``sweep`` is ``sweep_id``), then each config field not
    among them (flattened: ``dataset_options.source``), then the latest value of each
    metric of ``finals`` (``store.metrics.final_metrics()``'s long frame: run_id, name, value) not
    among those, named as the metric."""
    records = sorted(records, key=lambda r: r.id)
    rows = []
    for r in records:
        row = {f: (r.sweep_id if f == "sweep" else getattr(r, f)) for f in RUN_FIELDS}
        row["tags"] = list(r.tags or [])
        row.update({k: v for k, v in _flat(r.config).items() if k not in row})
        rows.append(row)
    config_cols = [c for c in config_fields() if c not in RUN_FIELDS]
    frame = pd.DataFrame.from_records(rows, columns=list(RUN_FIELDS)) if not rows else pd.DataFrame(rows)
    for c in config_cols:
        if c not in frame.columns:
            frame[c] = None
    if finals is not None and not finals.empty:
        wide = finals.pivot_table(index="run_id", columns="name", values="value", aggfunc="last")
        wide = wide[[c for c in wide.columns if c not in frame.columns]]
        frame = frame.join(wide, on="id")
    for col in ("created_at", "started_at", "finished_at", "heartbeat_at"):
        frame[col] = pd.to_datetime(frame[col], utc=True)
    frame["id"] = frame["id"].astype("int64")
    for col in ("rank", "seed", "steps", "steps_done", "checkpoint_step"):
        frame[col] = frame[col].astype("Int64")
    frame["lam"] = frame["lam"].astype("float64")
    return frame.reset_index(drop=True)


# ----------------------------------------------------------------------------- evaluation


def _missing(cell) -> bool:
    if cell is None or cell is pd.NA or cell is pd.NaT:
        return True
    return isinstance(cell, float) and math.isnan(cell)


def _as_number(cell):
    if isinstance(cell, (bool, np.bool_)):
        return float(cell)
    if isinstance(cell, (int, float, np.integer, np.floating)):
        return float(cell)
    return None


def _equal(cell, value) -> bool:
    if value is None:
        return _missing(cell)
    if _missing(cell):
        return False
    if isinstance(value, bool):
        return isinstance(cell, (bool, np.bool_)) and bool(cell) == value
    if isinstance(value, float):
        number = _as_number(cell)
        if number is None and isinstance(cell, str):
            number = _number(cell)
        return number is not None and number == value
    if isinstance(cell, pd.Timestamp):
        return cell == _when(value)
    if isinstance(cell, (list, tuple)):
        return False
    return str(cell) == value


def _when(value) -> pd.Timestamp:
    try:
        stamp = pd.Timestamp(value)
    except (ValueError, TypeError):
        raise WhereError(f"{value!r} is not a date or time; write it like 2026-11-25 or '2026-11-25 14:30'") from None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp


def _order(cell, op: str, value) -> bool:
    if _missing(cell) or value is None or isinstance(value, bool):
        return False
    if isinstance(cell, pd.Timestamp):
        left, right = cell, _when(value)
    elif isinstance(value, float):
        left, right = _as_number(cell), value
        if left is None:
            return False
    else:
        if not isinstance(cell, str):
            return False
        left, right = cell, str(value)
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]


def _contains(cell, value) -> bool:
    if _missing(cell) or value is None:
        return False
    if isinstance(cell, (list, tuple, set)):
        return any(_equal(item, value) for item in cell)
    text = value if isinstance(value, str) else (f"{value:g}" if isinstance(value, float) else str(value))
    return text.lower() in str(cell).lower()


def _column_kind_check(column: pd.Series, node: Compare) -> None:
    """An ordering of text by a number (``name < 3``), or of numbers by text, matches
    nothing by mistake: refuse it with the fix."""
    if node.op not in ORDERING:
        return
    cells = [c for c in column if not _missing(c)]
    if not cells:
        return
    numeric = all(_as_number(c) is not None for c in cells)
    timed = all(isinstance(c, pd.Timestamp) for c in cells)
    if isinstance(node.value, float) and not numeric and not timed:
        raise WhereError(f"{node.field} holds text, not numbers; compare it with == or contains")
    if isinstance(node.value, str) and numeric:
        raise WhereError(f"{node.field} holds numbers; compare it with a number (got {node.value!r})")


def _mask(expr: Expr, frame: pd.DataFrame) -> np.ndarray:
    if isinstance(expr, Not):
        return ~_mask(expr.inner, frame)
    if isinstance(expr, BoolOp):
        masks = [_mask(p, frame) for p in expr.parts]
        out = masks[0]
        for m in masks[1:]:
            out = (out & m) if expr.op == "and" else (out | m)
        return out
    column = frame[expr.field]
    _column_kind_check(column, expr)
    if expr.op == "==":
        test = lambda c: _equal(c, expr.value)  # noqa: E731
    elif expr.op == "!=":
        test = lambda c: not _equal(c, expr.value)  # noqa: E731
    elif expr.op == "contains":
        test = lambda c: _contains(c, expr.value)  # noqa: E731
    elif expr.op == "in":
        test = lambda c: any(_equal(c, v) for v in expr.value)  # noqa: E731
    else:
        test = lambda c: _order(c, expr.op, expr.value)  # noqa: E731
    return np.array([bool(test(c)) for c in column], dtype=bool)


def unknown_field(field: str, known: Iterable[str]) -> WhereError:
    """The error for a field no run, config or metric has, naming the closest known ones."""
    close = difflib.get_close_matches(field, sorted(set(known)), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "fields are run fields (status, name, rank, lam, seed, tags…), config fields and metric names"
    return WhereError(f"unknown field {field!r}; {hint}")


def check_fields(expr: Expr, known: Iterable[str]) -> None:
    """:class:`WhereError` for the first field of ``expr`` not in ``known``."""
    known = set(known)
    for f in fields_of(expr):
        if f not in known:
            raise unknown_field(f, known)


def evaluate(expr: Expr | str, frame: pd.DataFrame, known: Iterable[str] | None = None) -> pd.Series:
    """The boolean mask (indexed like ``frame``) of the rows ``expr`` matches; fields are
    ``frame``'s columns (``known`` adds names that are fine but absent, e.g. a metric no
    run of ``frame`` has: every row misses it)."""
    expr = parse(expr) if isinstance(expr, str) else expr
    check_fields(expr, [*frame.columns, *(known or ())])
    frame = frame.copy()
    for f in fields_of(expr):
        if f not in frame.columns:
            frame[f] = None
    return pd.Series(_mask(expr, frame), index=frame.index)

