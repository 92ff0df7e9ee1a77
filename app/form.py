"""The Launch form, generated from the run schema (``engine.config``).

Every ``RunConfig`` field becomes one widget in its group: a choice a select box, a
flag a toggle, a number a number input (empty = None where the field allows it),
text a text input. The swept fields (estimator, rank, λ, seed) become the sweep's
axes: a multiselect of estimators and text entries that take exactly what is typed
(``exact, 1, 8, 32``). Data-source options appear for the sources they belong to.

The form's state is a flat dict of widget values keyed by ``KEY + name``; it
converts to a ``Sweep`` (``to_sweep``) and back (``values_of``), so presets such as
the paper's settings and "clone to Launch" are just sweeps. No Streamlit here.

A number widget hands over what the browser parsed, and the schema checks it
(``number_args``): an integer field takes a real number input, so a value past the
browser's safe integers (9,007,199,254,740,991) still reaches the page and is refused
by name, rather than kept by the browser while the page launches the value before it.
Values that read but a run cannot train with, or that are far from the field's
default, are said beside the field (``refusals``, ``far_values``, ``memory_note``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from engine.config import (
    DATA_OPTIONS,
    GROUPS,
    SWEEP_AXES,
    ConfigError,
    LaunchWarning,
    RunConfig,
    Sweep,
    base_type,
    default_of,
    reproduction_sweep,
    schema,
    sweep_from_flat,
    to_flat,
)
from engine.core.estimators import REGISTRY
from engine.core.text import plain

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
    # text: the schema's longest value. Not the browser field's limit: a browser field with one
    # ignores a longer paste whole (the field stays as it was, with no word), so the form takes
    # the text and the schema's check says how long it is and what the most is.
    max_chars: int | None = None

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
        allowed = s.allowed()
        if s.swept:
            plural, _ = SWEEP_AXES[f.name]
            if f.name == "estimator" and allowed is not None:
                out.append(Widget(plural, s.group, "multiselect", "Estimators", estimators_help(), options=allowed))
            else:
                example = {"rank": "1, 8, 32", "lam": "0, 0.01", "seed": "0, 1, 2 or 0-4"}[f.name]
                extra = " Add 'exact' for exact backprop once per seed." if f.name == "rank" else ""
                label = {"rank": "Ranks R", "lam": "Shrink λ", "seed": "Seeds"}[f.name]
                out.append(Widget(plural, s.group, "text", f"{label} (comma list)", f"{s.help}{unit}.{extra}",
                                  placeholder=example))
            continue
        if allowed is not None:
            w = Widget(f.name, s.group, "select", s.label, s.help + unit, options=allowed)
        elif kind is bool:
            w = Widget(f.name, s.group, "toggle", s.label, s.help)
        elif kind in (int, float):
            w = Widget(f.name, s.group, "number", s.label, s.help + unit, step=s.step or 1, fmt=s.fmt,
                       placeholder=s.none if optional else None)
        else:
            w = Widget(f.name, s.group, "text", s.label, s.help, placeholder=s.none, max_chars=s.max_len)
        out.append(w)
    return out


def estimators_help() -> str:
    """The Estimators field's help, read from the estimator registry: a markdown list, one
    line per estimator, ``name — what it keeps (biased or unbiased)``; no lead line, so the
    list fits a help tooltip (300 px high) at 1,400 px."""
    return "\n".join(f"- **{plain(e.name)}** — {plain(e.label)}" + ("" if e.exact else f" ({e.bias})")
                     for e in REGISTRY.values())


def rows(ws: Sequence[Widget], per_row: int = 3) -> list[list[Widget]]:
    """``ws`` in rows, in order: a multiselect alone (its chips wrap across the form's width),
    the other fields ``per_row`` to a row."""
    out: list[list[Widget]] = []
    for w in ws:
        if not out or w.kind == "multiselect" or out[-1][0].kind == "multiselect" or len(out[-1]) == per_row:
            out.append([w])
        else:
            out[-1].append(w)
    return out


def number_args(w: Widget) -> dict[str, Any]:
    """``st.number_input``'s step and format for number widget ``w``. An integer field gets a
    real step and ``%g``: the browser parses any real number it is given (an integer input
    refuses one past its safe integers, keeping the value before while the page launches it);
    ``to_sweep`` turns whole numbers back into integers and the schema refuses the rest."""
    if w.name in _INT_FIELDS:
        return {"step": float(w.step or 1), "format": w.fmt or "%g"}
    return {"step": w.step, "format": w.fmt}


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
        if name in _INT_FIELDS:
            values[name] = whole(value)  # number inputs hand back 3.0
    if isinstance(values.get("name"), str) and not values["name"].strip():
        values["name"] = None
    values["lams"] = values.get("lams") or "0"  # an empty λ field: no shrink
    return sweep_from_flat(values, cls)


def whole(value: Any) -> Any:
    """A real number input's value as an integer when it is whole (``3.0`` → 3), else as it is
    (``2.5``, None: the schema's check names the field)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


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
    if field is None or w is None:
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


# ----------------------------------------------------------------------------- values a run cannot train with

# A number field more than this many times the value it takes by default (the preset's, for the
# batch size and the sequence length) is warned about: a run's time or memory grows with it.
FAR = 1000
_FLOAT_MAX = float(np.finfo(np.float32).max)  # a real field past it is infinite in the run's arithmetic


def _number_fields(c: RunConfig):
    """(field, spec, kind, value) of every number field of ``c`` the form sets itself (not swept,
    not a choice) holding a value."""
    for f, s, tp in schema(type(c)):
        kind = base_type(tp)[0]
        value = getattr(c, f.name)
        if kind in (int, float) and not s.swept and s.allowed() is None and value is not None:
            yield f, s, kind, value


def _text(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _reference(c: RunConfig, f: dataclasses.Field) -> float | None:
    """The value field ``f`` of ``c`` takes by default: its default, or where that is None (the
    preset's, or a share of another field) the run's ``effective_`` value then."""
    default = default_of(f)
    effective = f"effective_{f.name}"
    if default is None and isinstance(getattr(RunConfig, effective, None), property):
        return getattr(c.replace(**{f.name: None}), effective)
    return default if isinstance(default, (int, float)) else None


def far_values(configs: Sequence[RunConfig]) -> list[LaunchWarning]:
    """A warning for each number field of the grid more than ``FAR`` times the value it takes by
    default (e.g. a batch of 10⁹ sequences where the preset has 1): a slip of the keyboard
    more often than a plan. The grid's runs share these fields; the first run's are read."""
    if not configs:
        return []
    c, out = configs[0], []
    for f, _, _, value in _number_fields(c):
        ref = _reference(c, f)
        if ref and ref > 0 and FAR * ref < value <= _FLOAT_MAX:  # past float32: refused (``refusals``)
            out.append(LaunchWarning(f.name, f"{f.name} {_text(value)} is {value / ref:,.0f} times the value it "
                                             f"takes by default ({_text(ref)}): check it"))
    return out


def refusals(configs: Sequence[RunConfig]) -> list[tuple[str | None, str]]:
    """(widget, message) for each real field of the grid past the largest float32 (a learning
    rate of 1e308): infinite in the run's arithmetic, it makes every weight infinite at the
    first step."""
    if not configs:
        return []
    return [(f.name, f"{f.name} {_text(value)} is past float32's largest number ({_FLOAT_MAX:.3g}): the run's "
                     "weights would be infinite after its first step; use a smaller value")
            for f, _, kind, value in _number_fields(configs[0]) if kind is float and abs(value) > _FLOAT_MAX]


def step_bytes(c: RunConfig) -> int | None:
    """A lower bound of the bytes one train step of ``c`` holds on each device: its share of the
    batch's int32 tokens, every block's input kept for the backward pass (B·T·d values of the run's
    dtype a layer, what even full remat keeps) and one layer's attention scores (B·heads·T²
    float32, which both attention implementations form). None when the run spans every device
    (``devices`` 0: its share is known only when it starts)."""
    if not c.devices:
        return None
    model = c.model_config("")
    per_device = c.effective_batch_size // c.devices
    t, itemsize = c.effective_seq_len, int(re.findall(r"\d+", c.dtype)[-1]) // 8
    return per_device * ((t + 1) * 4 + t * model.d_model * model.n_layers * itemsize + model.n_heads * t * t * 4)


def machine_memory() -> int | None:
    """The physical memory of this machine in bytes, None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_note(configs: Sequence[RunConfig], memory: int | None) -> tuple[str, str] | None:
    """(the field, a message) when one train step of the grid needs more memory on each device than
    ``memory`` (this machine's) at the least (``step_bytes``): such a run cannot train here. The
    field is the one of batch size and sequence length further above the preset's."""
    need = step_bytes(configs[0]) if configs else None
    if need is None or memory is None or need <= memory:
        return None
    c = configs[0]
    preset = c.replace(batch_size=None, seq_len=None)
    longer = c.effective_seq_len / preset.effective_seq_len > c.effective_batch_size / preset.effective_batch_size
    name, value = ("seq_len", c.effective_seq_len) if longer else ("batch_size", c.effective_batch_size)
    return name, (f"{name} {value:,}: one train step needs at least {need / 2**30:,.1f} GiB a device (B·T = "
                  f"{c.effective_batch_size:,} × {c.effective_seq_len:,}), more than this machine's {memory / 2**30:,.1f} GiB")
