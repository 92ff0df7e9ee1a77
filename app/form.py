"""The Launch form, generated from the run schema (``engine.config``).

Every ``RunConfig`` field becomes one widget in its group: a choice a select box, a
flag a toggle, a number a number input (empty = None where the field allows it),
text a text input. The swept fields (estimator, rank, λ, seed) become the sweep's
axes: a multiselect of estimators and text entries that take exactly what is typed
(``exact, 1, 8, 32``). Data-source options appear for the sources they belong to.

The form's state is a flat dict of widget values keyed by ``KEY + name``; it
converts to a ``Sweep`` (``to_sweep``) and back (``values_of``), so presets such as
the paper's settings and "clone to Launch" are just sweeps. No Streamlit here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from engine.config import (
    DATA_OPTIONS,
    GROUPS,
    SWEEP_AXES,
    ConfigError,
    RunConfig,
    Sweep,
    base_type,
    reproduction_sweep,
    schema,
    sweep_from_flat,
    to_flat,
)

KEY = "launch."  # widget keys; the Launch page keeps their values for the session (persist_state)


@dataclass(frozen=True)
class Widget:
    """One input of the form. ``kind``: select, multiselect, text, number, toggle.
    ``sources``: shown only when the dataset is one of them (data options)."""

    name: str
    group: str
    kind: str
    label: str
    help: str
    options: tuple = ()
    step: float | None = None
    fmt: str | None = None
    placeholder: str | None = None
    sources: tuple[str, ...] = ()
    max_chars: int | None = None  # text: the schema's longest value

    @property
    def key(self) -> str:
        return KEY + self.name


def widgets(cls: type = RunConfig) -> list[Widget]:
    """The form's widgets for the schema ``cls``, in field order."""
    out = []
    for f, s, tp in schema(cls):
        kind, optional = base_type(tp)
        if f.name == "dataset_options":
            out += [Widget(o.name, s.group, "number" if o.kind is int else "text", o.label, o.help,
                           step=1000 if o.kind is int else None, sources=o.sources) for o in DATA_OPTIONS]
            continue
        unit = f" [{s.unit}]" if s.unit else ""
        if s.swept:
            plural, _ = SWEEP_AXES[f.name]
            if f.name == "estimator":
                out.append(Widget(plural, s.group, "multiselect", "Estimators", s.help, options=s.allowed()))
            else:
                example = {"rank": "1, 8, 32", "lam": "0, 0.01", "seed": "0, 1, 2 or 0-4"}[f.name]
                extra = " Add 'exact' for exact backprop once per seed." if f.name == "rank" else ""
                label = {"rank": "Ranks R", "lam": "Shrink λ", "seed": "Seeds"}[f.name]
                out.append(Widget(plural, s.group, "text", f"{label} (comma list)", f"{s.help}{unit}.{extra}",
                                  placeholder=example))
            continue
        if s.allowed() is not None:
            w = Widget(f.name, s.group, "select", s.label, s.help + unit, options=s.allowed())
        elif kind is bool:
            w = Widget(f.name, s.group, "toggle", s.label, s.help)
        elif kind in (int, float):
            w = Widget(f.name, s.group, "number", s.label, s.help + unit, step=s.step or 1, fmt=s.fmt,
                       placeholder=s.none if optional else None)
        else:
            w = Widget(f.name, s.group, "text", s.label, s.help, placeholder=s.none, max_chars=s.max_len)
        out.append(w)
    return out


def grouped(ws: Sequence[Widget]) -> dict[str, list[Widget]]:
    """Widgets by group, in ``GROUPS`` order."""
    return {g: [w for w in ws if w.group == g] for g in GROUPS if any(w.group == g for w in ws)}


def values_of(sweep: Sweep, cls: type = RunConfig) -> dict[str, Any]:
    """Widget values (by widget name) that show ``sweep``."""
    flat = to_flat(sweep.base)
    ranks = [str(r) for r in sweep.ranks]
    flat.update(
        estimators=list(sweep.estimators),
        ranks=", ".join((["exact"] if sweep.with_exact and "exact" not in sweep.estimators else []) + ranks),
        lams=", ".join(f"{lam:g}" for lam in sweep.lams),
        seeds=", ".join(map(str, sweep.seeds)),
    )
    names = {w.name for w in widgets(cls)}
    return {k: v for k, v in flat.items() if k in names}


def to_sweep(values: Mapping[str, Any], cls: type = RunConfig) -> Sweep:
    """The ``Sweep`` the widget values describe; ``ConfigError`` names the bad field."""
    values = dict(values)
    for name, value in list(values.items()):
        if isinstance(value, float) and name in _INT_FIELDS and value.is_integer():
            values[name] = int(value)  # number inputs may hand back 3.0
    if isinstance(values.get("name"), str) and not values["name"].strip():
        values["name"] = None
    values["lams"] = values.get("lams") or "0"  # an empty λ field: no shrink
    return sweep_from_flat(values, cls)


_INT_FIELDS = {f.name for f, _, tp in schema(RunConfig) if base_type(tp)[0] is int} | {
    o.name for o in DATA_OPTIONS if o.kind is int}

# A quick tiny-model sweep: what the form shows on a first visit.
DEFAULT_SWEEP = Sweep(RunConfig(preset="tiny", steps=200, probe_interval=20),  # the schema's eval interval: every 20
                      estimators=("exact", "basis"), ranks=(1, 8, 32))
# The paper's grid (``engine.config.reproduce``): what "Paper settings" fills in. The
# form's tags are its own text box, so the sweep it shows carries none.
PAPER_SWEEP = dataclasses.replace(reproduction_sweep(), tags=())


def clone_sweep(configs: Sequence[Mapping[str, Any]]) -> Sweep:
    """A sweep that relaunches the given stored run configs: the first config as the
    base, and the estimators, ranks, λs and seeds found among them."""
    if not configs:
        raise ConfigError("choose at least one run to clone")
    runs = [RunConfig.from_dict(c) for c in configs]
    sketched = [r for r in runs if not r.is_exact]
    return Sweep(
        runs[0].replace(name=None),
        estimators=tuple(dict.fromkeys(r.estimator for r in sketched)) or ("exact",),
        ranks=tuple(dict.fromkeys(r.rank for r in sketched)),
        lams=tuple(dict.fromkeys(r.lam for r in sketched)) or (0.0,),
        seeds=tuple(dict.fromkeys(r.seed for r in runs)),
        with_exact=any(r.is_exact for r in runs),
    )


def widget_of(field: str | None, ws: Sequence[Widget] | None = None) -> Widget | None:
    """The widget that sets run field ``field`` (a swept field's list, e.g. ``lams`` for
    ``lam``), or None."""
    if field is None:
        return None
    name = SWEEP_AXES[field][0] if field in SWEEP_AXES else field
    return next((w for w in (ws or widgets()) if w.name == name), None)


def short_label(w: Widget) -> str:
    """A widget's label without its typing hint: ``Shrink λ``."""
    return w.label.removesuffix(" (comma list)")


def labelled(field: str | None, text: str) -> str:
    """``text`` about run field ``field`` with the field's name at its start replaced by
    the label the form shows: ``lam must be in [0, 1)`` → ``Shrink λ must be in [0, 1)``."""
    w = widget_of(field)
    if w is None:
        return text
    for token in sorted({field, w.name}, key=len, reverse=True):
        if text.startswith(token) and text[len(token):len(token) + 1] in (" ", ":"):
            return short_label(w) + text[len(token):]
    return text


def read(values: Mapping[str, Any], cls: type = RunConfig) -> tuple[Sweep | None, list[RunConfig], list[tuple[str | None, str]]]:
    """(the sweep, its runs, []) of the widget values, or (None, [], every problem) where
    they do not read: each problem is ``field_note``'s (widget, message). All at once: the
    field of each error is set to its default (``DEFAULT_SWEEP``'s) and the values read
    again, until they read, or an error names no field or a field already named."""
    values, found = dict(values), []
    defaults = values_of(DEFAULT_SWEEP, cls)
    while True:
        try:
            grid = to_sweep(values, cls)
            configs = grid.expand()
        except ConfigError as e:
            widget, text = field_note(e)
            found.append((widget, text))
            if widget is None or widget not in defaults or any(w == widget for w, _ in found[:-1]):
                return None, [], found
            values[widget] = defaults[widget]
            continue
        return (None, [], found) if found else (grid, configs, [])


def field_note(error: Exception) -> tuple[str | None, str]:
    """(the widget name, the message under the field's label) of a form error; the
    widget is None when the error is about no single field."""
    field = getattr(error, "field", None)
    w = widget_of(field)
    return (w.name if w else None), labelled(field, str(error))
