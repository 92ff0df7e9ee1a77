"""Compare's view as URL query parameters, so a view can be linked, bookmarked and saved.

``/compare?runs=1,2,5&pool=1`` opens exactly that view. The parameters:

========  =====================================================  ==============
name      meaning                                                default
========  =====================================================  ==============
runs      run ids, comma separated                               (the filter's)
sweep     only runs of this sweep id                             any
tag       only runs carrying this tag                            any
pool      1: seeds pooled into mean ± std, 0: one curve per run  1
x         ``step`` or ``wall_time``                              step
smooth    EMA weight in [0, 0.99]                                0
log       1: logarithmic y axis                                  0
group     colour or facet by this config field or tag            (method)
facet     1: one panel per group value instead of colours        0
layers    1: the cosine chart one panel per sketched layer       0
at        the step the rank figure and Table 3 read              (latest common)
q         the rank figure's quantity (``val_loss``, ``cos_mean``,  val_loss
          ``mem_saved_bytes``)
metrics   metrics charted under "Any metric", comma separated    (none)
          (``tokens_per_s,sys/cpu_percent``)
where     the picker's run filter (``engine.analysis.where``)     none
          as typed; without ``runs``, the view is every run it
          matches
margin    Table 3's equivalence margin δ (nats)                   0.02
holm      1: Table 3's verdicts Holm-adjusted, 0: each row's own  1
========  =====================================================  ==============

With a sweep or tag filter and no ``runs``, the view is every run the filter matches,
so a link keeps showing runs the sweep gains later. ``decode`` never fails: a value it
cannot read is left at its default and named in ``ViewState.problems``. ``url_id`` reads
the id parameters of the other pages (Run detail's ``?run=``, Report's ``?id=``) the same
way. Every number a link holds (``runs``, ``run``, ``id``, ``at``) is read with bounds
(``url_int``): ASCII digits, at most ``MAX_DIGITS`` of them, at most ``storage.limits.INT_MAX``
(what the database's 64-bit columns hold); anything else, a 5,000-digit ``?run=`` included,
is a one-line problem quoting at most ``SHOWN_CHARS`` characters of it.

The other pages keep their controls in their URLs the same way, through ``Param`` (Runs:
``RUNS_PARAMS``, every filter; ``app.state.seed_from_url`` and ``keep_in_url`` do the Streamlit
part): a link sets each control the first time the page is drawn, a value that matches none of
its choices is a one-line problem (``read_params``, ``url_pick``) and leaves the URL, and from
then on the URL follows the controls. No Streamlit here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from engine.analysis.method_frames import RANK_QUANTITIES
from engine.core.choices import EQUIVALENCE_MARGIN
from storage.limits import INT_MAX

X_AXES = ("step", "wall_time")
MAX_DIGITS = len(str(INT_MAX))  # 19: the most digits of an id or a step in a link
SHOWN_CHARS = 40  # the most characters of a refused value a problem quotes
MAX_SMOOTHING = 0.99
MARGIN_RANGE = (0.001, 10.0)  # Table 3's equivalence margin δ: the control's bounds
WHERE = "where"  # the run filter (engine.analysis.where) of the Runs page and Compare's picker, in their URLs


@dataclass(frozen=True)
class ViewState:
    """What Compare shows. ``runs`` None: every run the filters match."""

    runs: tuple[int, ...] | None = None
    sweep: str | None = None
    tag: str | None = None
    pool: bool = True
    x: str = "step"
    smoothing: float = 0.0
    log_y: bool = False
    group: str | None = None
    facet: bool = False
    per_layer: bool = False
    at: int | None = None  # None: the latest common step
    quantity: str = "val_loss"
    metrics: tuple[str, ...] = ()  # charted under "Any metric" (metric names hold no comma)
    where: str | None = None  # the picker's filter text, as typed
    margin: float = EQUIVALENCE_MARGIN  # Table 3's equivalence margin δ
    adjust: bool = True  # Table 3's verdicts Holm-adjusted
    problems: tuple[str, ...] = field(default=(), compare=False)


DEFAULT = ViewState()


def is_id(token: str) -> bool:
    """Whether ``token`` is a run or report id as a URL writes one: ASCII digits only
    (``"²".isdigit()`` and ``"٣".isdigit()`` are true too, and ``int("²")`` fails)."""
    return token.isascii() and token.isdigit()


def shown(value: str) -> str:
    """``value`` quoted for a problem line: at most ``SHOWN_CHARS`` characters of it."""
    return repr(value) if len(value) <= SHOWN_CHARS else f"{value[:SHOWN_CHARS]!r}… ({len(value):,} characters)"


def url_int(token: str) -> int | None:
    """``token`` as a whole number a link may hold (an id, a step): ASCII digits (``is_id``),
    at most ``MAX_DIGITS`` of them and at most ``INT_MAX``; else None. The digits are
    counted before ``int`` reads them, so no length of ``token`` costs more than that."""
    if len(token) > MAX_DIGITS or not is_id(token):
        return None
    value = int(token)
    return value if value <= INT_MAX else None


def url_id(query: Mapping[str, str | Sequence[str]], name: str, known: Iterable[int],
           what: str = "run") -> tuple[int | None, str | None]:
    """(the id that parameter ``name`` of a URL query names, or None; the one-line reason
    it was not used, or None). An id that is not a number ``url_int`` reads, or not among
    ``known``, is a problem: the page shows its default view and says why."""
    value = query.get(name)
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else None
    if value is None:
        return None, None
    token = str(value).strip()
    number = url_int(token)
    if number is None:
        return None, f"{name}={shown(token)} is not a {what} id"
    if number not in set(known):
        return None, f"{what} {number} is not in the database"
    return number, None


def _flag(value: str, name: str, problems: list[str], default: bool) -> bool:
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    problems.append(f"{name}={shown(value)} is not 0 or 1")
    return default


def decode(query: Mapping[str, str | Sequence[str]]) -> ViewState:
    """The view a URL query describes (``st.query_params`` as a dict)."""
    last = {k: (v[-1] if isinstance(v, (list, tuple)) and v else v) for k, v in query.items()}
    q = {k: str(v).strip() for k, v in last.items() if v is not None}
    problems: list[str] = []
    runs = None
    if "runs" in q:
        ids = []
        for token in q["runs"].replace(" ", ",").split(","):
            if not token:
                continue
            if (number := url_int(token)) is not None:
                ids.append(number)
            else:
                problems.append(f"runs: {shown(token)} is not a run id")
        runs = tuple(dict.fromkeys(ids))
    x = q.get("x", DEFAULT.x)
    if x not in X_AXES:
        problems.append(f"x={shown(x)} is not one of {', '.join(X_AXES)}")
        x = DEFAULT.x
    smoothing = DEFAULT.smoothing
    if "smooth" in q:
        try:
            smoothing = float(q["smooth"])
            if not (math.isfinite(smoothing) and 0.0 <= smoothing <= MAX_SMOOTHING):
                raise ValueError
        except ValueError:
            problems.append(f"smooth={shown(q['smooth'])} is not a number in [0, {MAX_SMOOTHING}]")
            smoothing = DEFAULT.smoothing
    at = None
    if "at" in q and q["at"] not in ("", "common"):
        at = url_int(q["at"])
        if at is None:
            problems.append(f"at={shown(q['at'])} is not a step")
    margin = _margin(q, problems)
    quantity = q.get("q", DEFAULT.quantity)
    if quantity not in RANK_QUANTITIES:
        problems.append(f"q={shown(quantity)} is not one of {', '.join(RANK_QUANTITIES)}")
        quantity = DEFAULT.quantity
    return ViewState(
        runs=runs, sweep=q.get("sweep") or None, tag=q.get("tag") or None,
        pool=_flag(q["pool"], "pool", problems, DEFAULT.pool) if "pool" in q else DEFAULT.pool,
        x=x, smoothing=round(smoothing, 2),
        log_y=_flag(q["log"], "log", problems, DEFAULT.log_y) if "log" in q else DEFAULT.log_y,
        group=q.get("group") or None,
        facet=_flag(q["facet"], "facet", problems, DEFAULT.facet) if "facet" in q else DEFAULT.facet,
        per_layer=_flag(q["layers"], "layers", problems, DEFAULT.per_layer) if "layers" in q else DEFAULT.per_layer,
        at=at, quantity=quantity, metrics=tuple(dict.fromkeys(m.strip() for m in q.get("metrics", "").split(",") if m.strip())),
        where=q.get(WHERE) or None, margin=margin,
        adjust=_flag(q["holm"], "holm", problems, DEFAULT.adjust) if "holm" in q else DEFAULT.adjust,
        problems=tuple(problems),
    )


def _margin(q: Mapping[str, str], problems: list[str]) -> float:
    """The link's ``margin`` (δ) when it is a number within ``MARGIN_RANGE``, else the default (a problem)."""
    if "margin" not in q:
        return DEFAULT.margin
    try:
        margin = float(q["margin"])
        if not (math.isfinite(margin) and MARGIN_RANGE[0] <= margin <= MARGIN_RANGE[1]):
            raise ValueError
    except ValueError:
        problems.append(f"margin={shown(q['margin'])} is not a number in [{MARGIN_RANGE[0]:g}, {MARGIN_RANGE[1]:g}]")
        return DEFAULT.margin
    return margin


def _bit(value: bool) -> str:
    return "1" if value else "0"


_PARAMS = (  # URL parameter, view field, the field's text (None: left out), in the URL's order
    ("runs", "runs", lambda v: None if v is None else ",".join(map(str, v))),
    ("sweep", "sweep", lambda v: v or None),
    ("tag", "tag", lambda v: v or None),
    ("pool", "pool", _bit),
    ("x", "x", str),
    ("smooth", "smoothing", lambda v: f"{v:g}"),
    ("log", "log_y", _bit),
    ("group", "group", lambda v: v or None),
    ("facet", "facet", _bit),
    ("layers", "per_layer", _bit),
    ("at", "at", lambda v: None if v is None else str(v)),
    ("q", "quantity", str),
    ("metrics", "metrics", lambda v: ",".join(v) or None),
    (WHERE, "where", lambda v: v or None),
    ("margin", "margin", lambda v: f"{v:g}"),
    ("holm", "adjust", _bit),
)


def encode(view: ViewState) -> dict[str, str]:
    """The URL query of ``view``: ``runs`` when set, the filters, and every other setting
    that differs from its default (``decode(encode(v)) == v``)."""
    out: dict[str, str] = {}
    for param, name, text in _PARAMS:
        value = getattr(view, name)
        if value != getattr(DEFAULT, name) and (shown := text(value)) is not None:
            out[param] = shown
    return out


def matching(records: Iterable, sweep: str | None, tag: str | None) -> list[int]:
    """Ids of the runs (``storage.RunRecord``) of ``sweep`` carrying ``tag`` (None: any), by id."""
    return sorted(r.id for r in records if (sweep is None or r.sweep_id == sweep)
                  and (tag is None or tag in (r.tags or [])))


def chosen(view: ViewState, records: Iterable) -> tuple[list[int], list[int]]:
    """(the run ids the view shows, in its order, among ``records``; the ids it names that
    are not there, e.g. deleted). Without ``runs``: every run its filters match."""
    records = list(records)
    known = {r.id for r in records}
    if view.runs is None:
        if view.sweep is None and view.tag is None:
            return [], []
        return matching(records, view.sweep, view.tag), []
    allowed = set(matching(records, view.sweep, view.tag))
    return [i for i in view.runs if i in allowed], [i for i in view.runs if i not in known]


@dataclass(frozen=True)
class Param:
    """A page's control kept in its URL, as ``where`` is: URL parameter ``name``, the widget's
    session-state ``key``; ``many``: a multiselect, the parameter repeated once per value
    (``?status=failed&status=interrupted``, so a value may hold a comma); ``unknown``: the
    problem a value outside the control's choices is, ``{value}`` and ``{choices}`` filled in."""

    name: str
    key: str
    many: bool = False
    unknown: str = "{name}={value} is not one of {choices}"


RUNS_PARAMS = (  # the Runs page's filters, in the URL's order
    Param("search", "runs.search"),
    Param("status", "runs.status", True, "status {value} is not a run status; the statuses are {choices}"),
    Param("estimator", "runs.estimator", True, "estimator {value} is no run's estimator; they are {choices}"),
    Param("sweep", "runs.sweep", True, "sweep {value} is not in the database"),
    Param("tag", "runs.tag", True, "tag {value} is on no run"),
    Param(WHERE, "runs.where"),
)
MAX_LISTED = 8  # the most choices a problem lists


def values_of(query: Mapping[str, str | Sequence[str]], name: str) -> list[str]:
    """Every value of parameter ``name`` (repeated, or once), stripped, blanks dropped, in order."""
    value = query.get(name)
    values = [value] if isinstance(value, str) else list(value or [])
    return [str(v).strip() for v in values if v is not None and str(v).strip()]


def listed(choices: Sequence) -> str:
    """``choices`` as a problem lists them: the first ``MAX_LISTED``, then how many more."""
    shown_ = ", ".join(map(str, list(choices)[:MAX_LISTED]))
    more = len(choices) - MAX_LISTED
    return (shown_ + (f" and {more} more" if more > 0 else "")) or "none"


def read_params(query: Mapping[str, str | Sequence[str]], params: Sequence[Param],
                choices: Mapping[str, Sequence[str]]) -> tuple[dict[str, str | list[str]], list[str]]:
    """(each control's value by key, from a URL query; the problems): a text parameter's last
    value ("" when absent); a ``many`` parameter's values among ``choices[name]`` (when given),
    each other one dropped and named in a one-line problem."""
    values: dict[str, str | list[str]] = {}
    problems: list[str] = []
    for p in params:
        given = values_of(query, p.name)
        if not p.many:
            values[p.key] = given[-1] if given else ""
            continue
        allowed = choices.get(p.name)
        kept = [v for v in dict.fromkeys(given) if allowed is None or v in allowed]
        problems += [p.unknown.format(name=p.name, value=shown(v), choices=listed(allowed or ()))
                     for v in dict.fromkeys(given) if v not in kept]
        values[p.key] = kept
    return values, problems


def url_pick(query: Mapping[str, str | Sequence[str]], name: str, choices: Sequence,
             what: str) -> tuple[object | None, str | None]:
    """(the value of parameter ``name`` among ``choices``, or None; the one-line problem when the
    link's value is not among them). Choices that are whole numbers are read with ``url_int``;
    ``what`` names what a value should be (``"a saved state of run #3"``)."""
    given = values_of(query, name)
    if not given:
        return None, None
    token = given[-1]
    numbers = bool(choices) and all(isinstance(c, int) for c in choices)
    value = url_int(token) if numbers else token
    if value is None or value not in choices:
        return None, f"{name}={shown(token)} is not {what}; the choices are {listed(choices)}"
    return value, None


def unknown_in(view: ViewState, groups: Sequence[str], metrics: Sequence[str]) -> list[str]:
    """The one-line problems of a Compare view's ``group`` and ``metrics`` that are not among
    what its runs offer (``groups``: the colour-by fields; ``metrics``: the metric names they
    recorded), each naming the value and the choices. ``decode`` cannot tell: the choices come
    from the runs, so Compare asks once it has read them, and drops what is named here."""
    problems = [] if view.group is None or view.group in groups else [
        f"group={shown(view.group)} is not a field to colour by; the choices are {listed(groups)}"]
    problems += [f"metrics: {shown(m)} is not a metric of these runs; the choices are {listed(metrics)}"
                 for m in view.metrics if m not in metrics]
    return problems


def param_text(value) -> str | list[str] | None:
    """A control's value as its URL parameter holds it: text stripped, a list as a list of
    texts, None for what the URL leaves out (blank, empty, None)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value] or None
    return str(value).strip() or None


def link(base: str, view: ViewState) -> str:
    """The full URL of ``view`` on the Compare page at ``base`` (``http://host:port/compare``)."""
    from urllib.parse import urlencode

    query = urlencode(encode(view), safe=",")
    return f"{base}?{query}" if query else base
