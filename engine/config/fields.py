"""How a run field is declared: its ``FieldSpec`` (help, group, unit, allowed values, what it
``affects``) and ``spec``, the groups and the kinds of effect, the one user error of a config,
the mapping type of the data-source options and the options themselves. ``engine.config.run``
declares ``RunConfig`` with them, and lists and checks a schema class's fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from engine.errors import UserError

GROUPS = {  # group → what the Launch page and --help call it
    "method": "Method",
    "model": "Model",
    "training": "Training",
    "data": "Data",
    "memory": "Memory",
    "devices": "Devices",
    "checkpoints": "Checkpoints",
}
TRAJECTORY, MEASUREMENT, BOOKKEEPING = "trajectory", "measurement", "bookkeeping"
AFFECTS = {  # what a field's value can change → what that means for comparing runs
    TRAJECTORY: "the parameters a run trains to (its training path)",
    MEASUREMENT: "what is measured along the same path (validation set size, memory, time)",
    BOOKKEEPING: "neither: how long, how often it is logged, checkpointed, what it is called",
}


class ConfigError(UserError, ValueError):
    """A run configuration value is out of range; the message names the field and the fix.
    ``field``: the run field it is about (None when it is about several), so a form can
    show it beside that field under the field's label."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class FieldSpec:
    """What the schema knows about one run field.

    ``choices`` is a tuple or a zero-argument callable returning one; ``low``/``high``
    bound numbers (``low_open``/``high_open`` exclude the end; an integer is always below
    2⁶³, what the database stores); ``max_len`` bounds text (``storage.limits``, which
    sizes the database's columns); ``none`` says what
    None means (a field that may be None); ``swept``: the field is one axis of a
    ``Sweep`` (``estimator``, ``rank``, ``lam``, ``seed``), set per run by the sweep;
    ``aliases`` are extra CLI flags; ``label``/``step``/``fmt`` dress its widget.
    ``affects`` (``AFFECTS``): whether the value changes the run's trajectory, only
    its measurement, or neither (bookkeeping). Runs are compared, and pooled as seeds,
    by their trajectory and measurement fields only (``RunConfig.comparable``).
    """

    help: str
    group: str
    label: str
    affects: str
    unit: str = ""
    choices: tuple | Callable[[], tuple] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = True
    max_len: int | None = None
    none: str | None = None
    swept: bool = False
    aliases: tuple[str, ...] = ()
    step: float | None = None
    fmt: str | None = None

    def allowed(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices


def spec(help: str, group: str, label: str, *, affects: str, **kw) -> dict:
    """``dataclasses.field`` metadata holding a ``FieldSpec``; every field says what it ``affects``."""
    if group not in GROUPS:
        raise ValueError(f"unknown field group {group!r}; one of {', '.join(GROUPS)}")
    if affects not in AFFECTS:
        raise ValueError(f"unknown affects {affects!r}; one of {', '.join(AFFECTS)}")
    return {"spec": FieldSpec(help, group, label, affects, **kw)}


class FrozenMap(Mapping):
    """An immutable, hashable mapping (a run's data-source options)."""

    __slots__ = ("_items",)
    _items: tuple[tuple[Any, Any], ...]

    def __init__(self, values: Mapping | None = None, **kw):
        merged = dict(values or {}, **kw)
        object.__setattr__(self, "_items", tuple(sorted(merged.items())))

    def __getitem__(self, key):
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({dict(self._items)!r})"

    def __setattr__(self, *_):
        raise AttributeError("FrozenMap is immutable")


@dataclass(frozen=True)
class DataOption:
    """One option of a data source (``RunConfig.dataset_options``), shown as a flag and a widget."""

    name: str
    kind: type
    sources: tuple[str, ...]
    help: str
    label: str
    default: Any = None
    flag: str | None = None  # the CLI flag when not --name-with-dashes

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


DATA_OPTIONS = (
    DataOption("path", str, ("files",), "a .txt/.jsonl/.parquet path or glob of your own corpus", "Path or glob",
               flag="--data-path"),
    DataOption("text_field", str, ("files",), "the text column of .jsonl/.parquet files (default text)", "Text field"),
    DataOption("data_files", str, ("fineweb-edu",), "a local mirror (path or glob of parquet files) instead of the Hub",
               "Local copy (optional)"),
    DataOption("max_documents", int, ("fineweb-edu",), "number of documents to stream", "Documents", 20_000),
)
