"""Compare: live loss, gradient-cosine and memory charts, any other recorded metric
(``app.metric_charts``: system metrics too), the paper's central figure (a quantity
against the rank R at one step) and its Table 3 for the selected runs.

The page reads only the metrics it draws (``_drawn``): those of the loss, mean-cosine and
memory charts, the rank figure and Table 3, each layer's cosine while "per layer" is on,
and the metrics chosen under "Any metric"; the names offered there (and the layers) come
from one query of the names the runs recorded (``_recorded``), so hundreds of runs do not
load every value of every metric. The summary, the rank figure and Table 3 are computed
once per state of the data (``_memo``), not again for each control; the rank figure draws
the rows of the Table 3 shown below it (``app.compare_table``), not a Table 3 of its own. A
render of the page reads the runs once; a rerun of its live fragment alone reads them once more."""

from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from app import compare_table, differences, metric_charts, state, tuning_view, viewstate
from app.display import plain, plot
from engine.analysis import charts, frames, method_frames, progress
from engine.analysis.summary import SUMMARY_METRICS, one_per_seed, summarize, table3
from engine.analysis.where import EXAMPLE, WhereError
from engine.config import comparable_key
from engine.reads.queries import split_batches, where_ids
from storage import ACTIVE_STATUSES, StorageError

lab = state.lab()
store = lab.store
st.title("Compare")
records = {r.id: r for r in store.runs.list_runs()}
# This run's read of every run, taken by the first ``_view`` below; a rerun of the live fragment
# alone finds it taken and reads the runs again (one read of the runs a render, not two).
_unread = [records]
if not records:
    st.info("No runs yet: launch a sweep, then compare its runs here while they train.")
    st.page_link("views/launch.py", label="Launch a sweep", icon=":material/rocket_launch:")
    st.stop()

_URL = "compare.url"  # the query this page last wrote (or applied)
_FOLLOW = "compare.follow"  # the selection is every run of the sweep/tag filter (new ones join)
_KEYS = {"sweep": "compare.sweep", "tag": "compare.tag", "pool": "compare.pool", "x": "compare.x",
         "smoothing": "compare.smoothing", "log_y": "compare.log_y", "group": "compare.group", "facet": "compare.facet",
         "per_layer": "compare.per_layer", "at": "compare.at", "quantity": "compare.rank_quantity",
         "metrics": "compare.metrics", "where": "compare.where", "margin": compare_table.MARGIN_KEY,
         "adjust": compare_table.ADJUST_KEY}
NO_GROUP = "method"
COMMON = "common"  # the "at step" control's value for the latest common step (``ViewState.at`` None)
_SHOWN = {"group": (None, NO_GROUP), "at": (None, COMMON)}  # view value → control value, where they differ


def _apply(view: viewstate.ViewState) -> None:
    """Set every control to show ``view`` (before the controls are drawn, or in a callback)."""
    runs, missing = viewstate.chosen(view, records.values())
    if view.where and view.runs is None:  # a link with a filter and no run list: the runs it matches now
        runs = _where_matches(view.where) or runs
    st.session_state["compare.pick"] = runs
    st.session_state["compare.linked"] = view  # its group and metrics are checked once the runs are known
    st.session_state[_FOLLOW] = view.runs is None and not view.where and (view.sweep is not None or view.tag is not None)
    for name, key in _KEYS.items():
        st.session_state[key] = _control_value(name, getattr(view, name))
    state.set_selected(runs)
    notes = list(view.problems) + ([f"runs {', '.join(map(str, missing))} are not in the database"] if missing else [])
    if outside := [i for i in view.runs or () if i in records and i not in runs]:
        notes.append(f"runs {', '.join(map(str, outside))} are not of its sweep or tag filter")
    for name, known in (("sweep", {r.sweep_id for r in records.values()}), ("tag", {t for r in records.values() for t in r.tags or []})):
        if getattr(view, name) is not None and getattr(view, name) not in known:
            notes.append(f"{name} {getattr(view, name)!r} is not in the database")
    st.session_state["compare.notes"] = notes


def _control_value(name: str, value):
    """What the control of view field ``name`` holds to show ``value``."""
    none, shown = _SHOWN.get(name, (None, None))
    return shown if name in _SHOWN and value is none else value


def _current() -> viewstate.ViewState:
    """The view the controls show now (every control that changes what the page shows)."""
    values: dict[str, Any] = {}
    for name, key in _KEYS.items():
        value = st.session_state.get(key, _control_value(name, getattr(viewstate.DEFAULT, name)))
        values[name] = None if name in _SHOWN and value == _SHOWN[name][1] else value
    return viewstate.ViewState(
        runs=None if st.session_state.get(_FOLLOW) else tuple(st.session_state.get("compare.pick", [])),
        sweep=values["sweep"], tag=values["tag"], pool=bool(values["pool"]), x=values["x"],
        smoothing=float(values["smoothing"]), log_y=bool(values["log_y"]), group=values["group"],
        facet=bool(values["facet"]), per_layer=bool(values["per_layer"]),
        at=None if values["at"] is None else int(values["at"]), quantity=values["quantity"],
        metrics=tuple(values["metrics"] or ()), where=(values["where"] or "").strip() or None,
        margin=round(float(values["margin"]), 6), adjust=bool(values["adjust"]))


def _write_url() -> dict[str, str]:
    """Put the current view in the URL (when it changed); the query written."""
    encoded = viewstate.encode(_current())
    if encoded != st.query_params.to_dict():
        st.query_params.from_dict(encoded)
    st.session_state[_URL] = encoded
    return encoded


def _open_saved() -> None:
    """The saved view chosen in the share box, applied and put in the URL (a callback)."""
    name = st.session_state.get("compare.saved")
    saved = store.views.saved_views().get(name) if isinstance(name, str) else None
    if saved is not None:
        _apply(viewstate.decode(saved))
        st.query_params.from_dict(saved)
        st.session_state[_URL] = dict(saved)


def _filter_changed() -> None:
    """A new sweep or tag filter selects every run it matches (and keeps following it)."""
    sweep, tag = st.session_state.get(_KEYS["sweep"]), st.session_state.get(_KEYS["tag"])
    follow = sweep is not None or tag is not None
    st.session_state[_FOLLOW] = follow
    if follow:
        st.session_state["compare.pick"] = viewstate.matching(records.values(), sweep, tag)
        state.set_selected(st.session_state["compare.pick"])


def _where_matches(text: str) -> list[int]:
    """The runs the filter ``text`` matches; none, with the one-line reason kept for the
    page, when it is bad or matches no run."""
    st.session_state.pop("compare.where_error", None)
    try:
        ids = where_ids(store, text)  # None: a blank filter, every run
        matched = list(records) if ids is None else [i for i in ids if i in records]
    except WhereError as e:
        st.session_state["compare.where_error"] = str(e)
        return []
    if not matched:
        st.session_state["compare.where_error"] = "no run matches this filter; the runs picked stay"
    return matched


def _where_picked() -> None:
    """The filter box (``engine.analysis.where``, as on Runs; kept in the URL's ``where``)
    picks the runs it matches (a callback); a bad filter, or one matching no run, keeps the
    pick and says why in one line."""
    text = (st.session_state.get("compare.where") or "").strip()
    st.session_state.pop("compare.where_error", None)
    if text and (matched := _where_matches(text)):
        _pick(matched)


def _picked() -> None:
    _pick(st.session_state["compare.pick"])


def _pick(runs: list[int]) -> None:
    """Select ``runs``, picked by hand or by the filter box: the selection no longer follows
    the sweep and tag boxes, and a box a picked run is outside of is set to any, so the boxes
    describe what is shown and a link (``runs``, narrowed by them) opens exactly these runs."""
    st.session_state[_FOLLOW] = False
    st.session_state["compare.pick"] = list(runs)
    for name, test in (("sweep", lambda r, v: r.sweep_id == v), ("tag", lambda r, v: v in (r.tags or []))):
        value = st.session_state.get(_KEYS[name])
        if value is not None and not all(test(records[i], value) for i in runs if i in records):
            st.session_state[_KEYS[name]] = None
    state.set_selected(list(runs))


for name, key in _KEYS.items():  # a first visit: the defaults
    st.session_state.setdefault(key, _control_value(name, getattr(viewstate.DEFAULT, name)))
hint = st.empty()  # a fixed slot: the charts below keep their place (and zoom) when the hint goes
query = st.query_params.to_dict()
if query and query != st.session_state.get(_URL):  # a link, a bookmark or a reload: show exactly that view
    _apply(viewstate.decode(query))
elif "compare.pick" in st.session_state:  # the picker is on the page: it holds the selection
    if st.session_state.get(_FOLLOW):  # runs the sweep or tag gained since
        st.session_state["compare.pick"] = viewstate.matching(records.values(), st.session_state.get(_KEYS["sweep"]),
                                                              st.session_state.get(_KEYS["tag"]))
    st.session_state["compare.pick"] = [i for i in st.session_state["compare.pick"] if i in records]  # less deleted ones
    state.set_selected(st.session_state["compare.pick"])
else:
    default = [i for i in state.selected() if i in records]
    if not default:  # nothing selected yet: the latest sweep alone (the sweep filter set to it)
        latest = records[max(records)].sweep_id
        if latest:
            st.session_state[_KEYS["sweep"]] = latest
            st.session_state[_FOLLOW] = True
            default = viewstate.matching(records.values(), latest, None)
            hint.caption(plain(f"Nothing selected: showing the latest sweep, {latest} ({len(default)} runs). "
                               "Pick runs below or on the Runs page."))
        else:  # launched without a sweep (an old database): the runs comparable to the newest, also without one
            newest = comparable_key(records[max(records)].config)
            default = [i for i in sorted(records) if not records[i].sweep_id
                       and comparable_key(records[i].config) == newest][-12:]
            hint.caption("Nothing selected: showing the latest runs like the newest one. Pick runs below or on "
                         "the Runs page.")
    st.session_state["compare.pick"] = default
    state.set_selected(default)
for note in st.session_state.pop("compare.notes", []):
    st.warning(plain(f"The link's {note}; shown without it."), icon=":material/link_off:")

sweeps = sorted({r.sweep_id for r in records.values() if r.sweep_id}, reverse=True)
tags = sorted({t for r in records.values() for t in (r.tags or [])})
for key, options in ((_KEYS["sweep"], sweeps), (_KEYS["tag"], tags)):
    if st.session_state.get(key) not in (None, *options):
        st.session_state[key] = None  # a filter value no run has any more
st.text_input("Pick the runs where", key="compare.where", placeholder=EXAMPLE, on_change=_where_picked, persist_state=state.KEEP,
              help="The Runs page's filter: any run or config field or metric (its final value), with and, or, not, "
                   "( ), ==, !=, <, <=, >, >=, contains and in [..]. Enter picks every run it matches.")
if where_error := st.session_state.get("compare.where_error"):
    st.error(plain(f"Filter not applied: {where_error}"), icon=":material/filter_alt_off:")
f1, f2, f3 = st.columns([2, 2, 6])
f1.selectbox("Sweep", [None, *sweeps], persist_state=state.KEEP, key=_KEYS["sweep"], on_change=_filter_changed,
             format_func=lambda v: "any sweep" if v is None else v, help="Compare every run of one launch.")
f2.selectbox("Tag", [None, *tags], persist_state=state.KEEP, key=_KEYS["tag"], on_change=_filter_changed,
             format_func=lambda v: "any tag" if v is None else v, help="Compare every run carrying this tag.")
f3.multiselect("Runs", options=sorted(records, reverse=True), persist_state=state.KEEP, key="compare.pick",
               format_func=lambda i: f"#{i} {records[i].name}", on_change=_picked)
ids = state.selected()
if not ids:
    st.info("Pick one or more runs above (or tick them on the Runs page), or choose a sweep or a tag.")
    st.stop()

info_all = frames.describe_runs([records[i] for i in ids if i in records])
group_options = [NO_GROUP, *frames.group_choices(info_all)]
if (linked := st.session_state.pop("compare.linked", None)) is not None:  # a link's colour-by and metrics: of these runs?
    recorded_now = store.metrics.metric_names([i for i in ids if i in records])
    for note in viewstate.unknown_in(linked, group_options[1:], recorded_now):
        st.warning(plain(f"The link's {note}; shown without it."), icon=":material/link_off:")
    st.session_state[_KEYS["metrics"]] = [m for m in linked.metrics if m in recorded_now]
c1, c2, c3, c4, c5, c6 = st.columns([1.2, 1.8, 0.8, 1.1, 1.3, 0.8])
x, smoothing, log_y = metric_charts.curve_controls(_KEYS, state.KEEP, (c1, c2, c3))
pool = c4.toggle("pool seeds", persist_state=state.KEEP, key=_KEYS["pool"],
                 help="Runs that differ only by seed become one curve: the mean with a ± std band.")
if st.session_state.get(_KEYS["group"]) not in group_options:
    st.session_state[_KEYS["group"]] = NO_GROUP
group_by: str | None = c5.selectbox("Colour by", group_options, persist_state=state.KEEP, key=_KEYS["group"],
                        help="Colour the loss and cosine curves by a config field, a tag or the sweep instead of "
                             "by method (W&B's and Aim's group by).")
group_by = None if group_by == NO_GROUP else group_by
facet = c6.toggle("facet", persist_state=state.KEEP, key=_KEYS["facet"], disabled=group_by is None,
                  help="One panel per value of the colour-by field, curves coloured by method.") and group_by is not None

view = _current()
encoded = _write_url()
with st.popover("Share or save this view", icon=":material/share:"):
    base = str(getattr(st.context, "url", "") or "").split("?")[0] or "/compare"
    st.caption("Link to exactly this view (copy it with the icon at the right of the box):")
    st.code(viewstate.link(base, view), language=None, wrap_lines=True)
    name = st.text_input("Save as", persist_state=state.KEEP, key="compare.save_name", placeholder="e.g. R sweep, pooled, log y",
                         help="Saved views are stored in the database, for everyone who uses it.")
    if st.button("Save view", icon=":material/bookmark_add:", key="share.save", disabled=not (name or "").strip()):
        try:
            store.views.save_view(name, encoded)
        except (ValueError, StorageError) as e:
            st.error(plain(e), icon=":material/error:")
        else:
            st.toast(plain(f"Saved the view {name.strip()!r}."))
    saved = store.views.saved_views()
    if saved:
        s1, s2 = st.columns([3, 1], vertical_alignment="bottom")
        s1.selectbox("Saved views", list(saved), persist_state=state.KEEP, key="compare.saved")
        s2.button("Open", key="share.open", on_click=_open_saved, icon=":material/open_in_browser:")
        if st.button("Delete this saved view", key="share.delete", icon=":material/delete:"):
            store.views.delete_view(st.session_state["compare.saved"])
            st.rerun()


def _status_line(runs: dict, metrics, duplicates: dict[int, int]) -> None:
    """One progress summary of the selection (``engine.analysis.progress``): runs by status,
    steps done of all, and the time left from the step rates the running runs show; one
    bar while runs train. Its height does not change as runs end and start, so what is
    below does not move."""
    summary = progress.progress(runs.values(), metrics)
    if summary.active:
        st.progress(summary.fraction, text=plain(summary.text()))
    else:
        st.caption(plain(summary.text()))
    if duplicates:
        st.caption(plain("Left out as duplicates (the same setup and seed as a run that trained further, which "
                         "stands for them): " + ", ".join(f"#{d} (see #{k})" for d, k in sorted(duplicates.items()))
                         + "."))


_READ = (*SUMMARY_METRICS, method_frames.LOAD_METRIC, method_frames.CORES_METRIC)  # progress, loss, memory, Table 3


def _recorded(records_now: dict) -> list[str]:
    """Every metric name the runs recorded (one query); kept for the session while every
    run has ended and none changed (a resumed run changes status and history version)."""
    key = tuple(sorted((r.id, r.status, r.history_version) for r in records_now.values()))
    kept = st.session_state.get("compare.recorded")
    if kept is not None and kept[0] == key:
        return kept[1]
    names = store.metrics.metric_names(list(records_now))
    if all(r.status not in ACTIVE_STATUSES for r in records_now.values()):
        st.session_state["compare.recorded"] = (key, names)
    return names


def _drawn(recorded: list[str]) -> list[str]:
    """The metric names the page draws now (see the module): of ``recorded``, ``_READ``,
    the memory breakdown's, each layer's cosine while "per layer" is on, and the chosen ones."""
    chosen = set(st.session_state.get(_KEYS["metrics"]) or ())
    prefixes: tuple[str, ...] = (frames.BREAKDOWN_PREFIX, frames.BREAKDOWN_EXACT_PREFIX)
    prefixes += ("cos/",) if st.session_state.get(_KEYS["per_layer"]) else ()
    return [n for n in recorded if n in _READ or n in chosen or n.startswith(prefixes)]


def _memo(records_now: dict, metrics, key: tuple, compute):
    """``compute()`` once per state of the data: kept while the selection, the runs' statuses
    and the metric rows read stay the same (rows only grow, by id; a replaced history is
    re-read, and fewer rows change the count), so a rerun for a control (smoothing, log y, x
    axis, …) does not recompute the summary, the rank figure and Table 3 of hundreds of runs."""
    data = (tuple((r.id, r.status) for r in records_now.values()), len(metrics),
            int(metrics["id"].max()) if len(metrics) else 0)
    memo: tuple[tuple, dict] | None = st.session_state.get("compare.memo")
    if memo is None or memo[0] != data:
        memo = st.session_state["compare.memo"] = (data, {})
    if key not in memo[1]:
        memo[1][key] = compute()
    return memo[1][key]


def _view() -> None:
    """Everything below the controls; a live fragment when runs are active. Each section
    is one container, so what appears or goes inside one (a note, a progress row) does not
    move the charts of the others (a moved chart is drawn afresh and loses its zoom)."""
    every = _unread.pop() if _unread else {r.id: r for r in store.runs.list_runs()}
    records_now = {i: r for i, r in every.items() if i in ids}
    if not records_now:
        st.info("The selected runs were deleted.")
        return
    kept, duplicates = one_per_seed(records_now.values())
    records_now = {r.id: r for r in kept}
    left_out = frames.common_seeds(kept)[1] if pool else {}  # seeds pooled for some methods, not all
    info = frames.describe_runs(kept)
    recorded = _recorded(records_now)
    metrics = state.metrics(store, list(records_now), _drawn(recorded))
    with st.container():
        _status_line(records_now, metrics, duplicates)
    if all(r.status not in ACTIVE_STATUSES for r in kept) != all_ended:
        st.rerun()  # all runs ended (or one started): redraw with the matching refresh rate
    for section in (partial(tuning_view.section, store), partial(_loss, left_out=left_out), partial(_cosine, recorded=recorded), _memory,
                    partial(_any_metric, recorded=recorded), _by_rank, _apart):  # a campaign's section first
        with st.container():
            section(records_now, info, metrics)


def _loss(records_now: dict, info, metrics, left_out: dict[str, list]) -> None:
    st.subheader("Loss")
    if left_out:  # pooled curves over other seeds than Table 3's pairs: said
        st.caption(plain("Pooled curves average each method's own seeds (their labels count them); Table 3 pairs each "
                         "method with exact on the seeds both have. Seeds not every method of the setup has, in the "
                         "curves but not in every pair: " + "; ".join(f"{m} seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}"
                                                          for m, v in left_out.items()) + "."))
    if facet and group_by is not None:  # one panel per value of the chosen field, curves by method
        for metric, y_title, title, key in (("val_loss", "validation loss (nats/token)", "Validation loss", "val"),
                                            ("train_loss", "train loss (nats/token)", "Train loss (mean since last eval)",
                                             "train")):
            panels = {name: frames.series(metrics, part, metric, x=x, smoothing=smoothing, pool_seeds=pool)
                      for name, part in frames.facets(info, group_by).items()}
            plot(charts.panels_figure(panels, x=x, y_title=y_title, title=f"{title}, by {group_by}", log_y=log_y,
                                      shared_y=True), key)
    else:
        shown = frames.grouped(info, group_by)
        left, right = st.columns(2)
        with left:
            s = frames.series(metrics, shown, "val_loss", x=x, smoothing=smoothing, pool_seeds=pool)
            plot(charts.line_figure(s, x=x, y_title="validation loss (nats/token)", title="Validation loss",
                                    log_y=log_y, height=460), "val")
        with right:
            s = frames.series(metrics, shown, "train_loss", x=x, smoothing=smoothing, pool_seeds=pool)
            plot(charts.line_figure(s, x=x, y_title="train loss (nats/token)", title="Train loss (mean since last eval)",
                                    log_y=log_y, height=460), "train")


def _cosine(records_now: dict, info, metrics, recorded: list[str]) -> None:
    st.subheader("Gradient quality: cosine of sketched dW to exact dW")
    layers = frames.layer_names(pd.DataFrame({"name": recorded}))
    if not layers:
        st.info("Cosines are probed every probe interval (exact runs too: theirs is the reference 1.0); "
                "none of the selected runs has one yet.")
    else:
        per_layer = st.toggle("per layer", persist_state=state.KEEP, key=_KEYS["per_layer"],
                              help="Probed every probe interval on a fixed batch; exact runs are probed too, as the reference 1.0.")
        if per_layer:
            panels = {layer: frames.series(metrics, info, f"cos/{layer}", x=x, smoothing=smoothing, pool_seeds=pool)
                      for layer in layers}
            plot(charts.panels_figure(panels, x=x, y_title="cosine", title="Cosine per sketched layer"), "cos_layers")
        elif facet and group_by is not None:
            panels = {name: frames.series(metrics, part, "cos_mean", x=x, smoothing=smoothing, pool_seeds=pool)
                      for name, part in frames.facets(info, group_by).items()}
            plot(charts.panels_figure(panels, x=x, y_title="cosine (mean over sketched layers)",
                                      title=f"Mean cosine over sketched layers, by {group_by}"), "cos")
        else:
            s = frames.series(metrics, frames.grouped(info, group_by), "cos_mean", x=x, smoothing=smoothing,
                              pool_seeds=pool)
            plot(charts.line_figure(s, x=x, y_title="cosine (mean over sketched layers)",
                                    title="Mean cosine over sketched layers"), "cos")


def _memory(records_now: dict, info, metrics) -> None:
    st.subheader("Memory")
    summary_end = _memo(records_now, metrics, ("summary",), lambda: summarize(records_now.values(), metrics))
    mem = frames.memory_frame(summary_end, info, pool_seeds=pool)
    if mem.empty:
        st.info("Memory figures are recorded at step 0 of each run; none yet.")
    else:
        plot(charts.memory_figure(mem, title="Activation memory per train step, against exact backprop of the same config"), "memory")
        notes = ["**Saved for backward**: residual bytes a train step keeps for its backward pass (parameters excluded).",
                 "The number on each bar is run ÷ exact (below 1: the run keeps less).",
                 "Every figure is **per device**: a run on N devices holds B/N sequences (and, with sharded "
                 "parameters, 1/N of its state) on each."]
        if "Peak device memory" not in set(mem["quantity"]):
            notes.append("**Peak device memory** is recorded at the end of GPU runs only.")
        st.caption(" ".join(notes))
    breakdown = frames.breakdown_frame(metrics, info, pool_seeds=pool)
    if not breakdown.empty:
        plot(charts.breakdown_figure(breakdown, title="Saved for backward, by category"), "breakdown")


def _any_metric(records_now: dict, info, metrics, recorded: list[str]) -> None:
    metric_charts.any_metric_section(metrics, info, key=_KEYS["metrics"], persist=state.KEEP, x=x, smoothing=smoothing,
                                     pool=pool, log_y=log_y, group_by=group_by, facet=facet, names=recorded)


def _by_rank(records_now: dict, info, metrics) -> None:
    st.subheader("Against the rank R at one step (the paper's central figure)")
    steps = sorted(set(metrics.loc[metrics["name"] == "val_loss", "step"]))
    if not steps:
        st.info("This figure and the summary appear after the first validation (step 0).")
        return
    choices = [COMMON, *steps]
    if st.session_state.get(_KEYS["at"], COMMON) not in choices:
        st.session_state[_KEYS["at"]] = COMMON  # its step belongs to runs no longer selected
    c1, c2 = st.columns([3, 2])
    at = c1.select_slider(
        "at step", options=choices, persist_state=state.KEEP, key=_KEYS["at"],
        format_func=lambda v: "latest common step" if v == COMMON else f"{v:,}",
        help="Seeds are compared at one step only, in this figure and in the summary below: by default the "
             "latest step every run of a setup has validated at; a run that has not reached the chosen step "
             "counts as a missing seed.")
    at_step = None if at == COMMON else at
    quantity = c2.radio("quantity", list(method_frames.RANK_QUANTITIES), horizontal=True, persist_state=state.KEEP, key=_KEYS["quantity"],
                        format_func=lambda q: method_frames.RANK_QUANTITIES[q][0])
    name, y_title, _ = method_frames.RANK_QUANTITIES[quantity]
    margin, adjust = compare_table.chosen()
    table = _table3(records_now, metrics, at_step, margin, adjust)  # once: the figure draws its rows
    by_rank = _memo(records_now, metrics, ("rank", quantity, at_step), partial(
        method_frames.rank_frame, records_now.values(), metrics, quantity, at_step, table=table))
    plot(charts.rank_figure(by_rank, y_title=y_title, title=f"{name.capitalize()} against rank R"), "by_rank")
    st.caption("One line per estimator (and λ); each point the mean over seeds at the step, its error bar ± one "
               "std over seeds (none for one seed); exact backprop is the horizontal band, mean ± std.")
    controlled = compare_table.controls(state.KEEP)
    if controlled != (margin, adjust):  # read before the controls were drawn; should they differ, theirs hold
        table = _table3(records_now, metrics, at_step, *controlled)
    compare_table.section(table, controlled[0])


def _table3(records_now: dict, metrics, at_step, margin: float, adjust: bool):
    """``table3`` of the runs with their validation batches, once per state of the data (``_memo``)."""
    def compute():
        batches, test_batches = split_batches(store, records_now, metrics)
        return table3(records_now.values(), metrics, at_step=at_step, margin=margin, adjust=adjust,
                      batches=batches, test_batches=test_batches)
    return _memo(records_now, metrics, ("table3", at_step, margin, adjust), compute)


def _apart(records_now: dict, info, metrics) -> None:
    differences.section(store, records_now)


def _live() -> None:
    """The live part; a control of it that changed the view (at step, quantity, per layer)
    reruns the whole page, so the URL and the share link above follow."""
    state.guarded(_view)()
    if viewstate.encode(_current()) != st.session_state.get(_URL):
        st.rerun()


all_ended = all(records[i].status not in ACTIVE_STATUSES for i in ids)
st.fragment(run_every=state.refresh_every(not all_ended))(_live)()
