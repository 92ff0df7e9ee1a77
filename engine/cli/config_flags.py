"""The flags of ``run`` and ``sweep``, generated from the run schema (``engine.config``, no JAX):
one flag per run field, and the ``Sweep`` they describe."""

from __future__ import annotations

import argparse
from typing import Any

from engine.config import (
    DATA_OPTIONS,
    GROUPS,
    SWEEP_AXES,
    FieldSpec,
    RunConfig,
    Sweep,
    base_type,
    default_of,
    from_flat,
    schema,
    sweep_from_flat,
)


def _typed(kind: type, name: str):
    """argparse ``type`` of a field: int/float/str, with a message naming the field."""
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {text!r} is not {'an integer' if kind is int else 'a number'}") from None
    return parse if kind in (int, float) else str


def _help(s: FieldSpec, default) -> str:
    unit = f" [{s.unit}]" if s.unit else ""
    shown = s.none if default is None and s.none else default
    return f"{s.help}{unit} (default: {shown})".replace("%", "%%")


def _add_data_options(group) -> None:
    """The dataset's own options (``--data-path`` …), one flag each."""
    for opt in DATA_OPTIONS:
        group.add_argument(opt.cli_flag, dest=opt.name, type=_typed(opt.kind, opt.name),
                           help=f"{'/'.join(opt.sources)}: {opt.help}".replace("%", "%%"))


def _add_swept(group, name: str, flag: str, s: FieldSpec, default) -> None:
    """A swept field as a comma list (``--ranks exact,1,8,32``; the singular is an alias)."""
    plural, _ = SWEEP_AXES[name]
    text = {"rank": "exact,1,8,32", "estimator": "basis"}.get(name, str(default))
    group.add_argument("--" + plural, flag, dest=plural, default=text, metavar="LIST",
                       help=f"comma list: {s.help}" + (" ('exact' adds exact backprop once per seed)" if name == "rank" else "")
                       + f" (default: {text})")


def add_config_flags(parser: argparse.ArgumentParser, cls: type = RunConfig, *, sweep: bool) -> None:
    """One flag per field of the schema ``cls`` (``--field-name`` plus its aliases), in
    argument groups named after the field groups. With ``sweep`` the swept fields
    (estimator, rank, λ, seed) take lists instead (``--ranks exact,1,8,32``; the
    singular spelling is an alias)."""
    groups = {g: parser.add_argument_group(f"{title.lower()} options") for g, title in GROUPS.items()}
    for f, s, tp in schema(cls):
        kind, optional = base_type(tp)
        group, default = groups[s.group], default_of(f)
        flag = "--" + f.name.replace("_", "-")
        if f.name == "dataset_options":
            _add_data_options(group)
            continue
        if sweep and s.swept:
            _add_swept(group, f.name, flag, s, default)
            continue
        kwargs = {"dest": f.name, "default": default, "help": _help(s, default)}
        if s.allowed() is not None:
            kwargs["choices"] = s.allowed()
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _typed(kind, f.name)
        group.add_argument(flag, *s.aliases, **kwargs)


def sweep_from_args(args: argparse.Namespace, cls: type = RunConfig, *, sweep: bool) -> Sweep:
    """The ``Sweep`` the flags describe (``run`` is a sweep of one)."""
    if not sweep:
        return Sweep(from_flat(vars(args), cls), estimators=(args.estimator,), ranks=(args.rank,), lams=(args.lam,),
                     seeds=(args.seed,))
    return sweep_from_flat(vars(args), cls)


def flag_defaults(cls: type = RunConfig, *, sweep: bool) -> dict[str, Any]:
    """What the run flags of ``run`` (with ``sweep``: of ``sweep``) hold when none is given,
    by destination: each field by name (``sweep``: the swept ones as their comma lists under
    their plural names, ``ranks``: ``exact,1,8,32``) and each data option. ``engine.api``
    starts from these, so a field it is not given takes the value the CLI would."""
    parser = argparse.ArgumentParser(add_help=False)
    add_config_flags(parser, cls, sweep=sweep)
    return vars(parser.parse_args([]))
