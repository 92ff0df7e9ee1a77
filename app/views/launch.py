"""Launch: a sweep form whose preview shows what it will queue, and how long it will take."""

import dataclasses

import streamlit as st

from app import logic, state
from engine import data, timing
from engine.basis import ESTIMATORS
from engine.train import check_data
from engine.model import PRESETS, SKETCHED_LAYER_CHOICES
from engine.steps import OPTIMIZERS
from engine.train import ConfigError
from storage import StorageError

K = "launch."  # widget keys; main.py keeps them across page switches
FIELDS = [f.name for f in dataclasses.fields(logic.LaunchForm) if f.name != "dataset_options"]
DATA_DEFAULTS = {"data_path": "", "text_field": "text", "max_documents": 20_000, "data_files": ""}


def _fill(form: logic.LaunchForm) -> None:
    """Set every form widget to ``form``'s values (a button callback: runs before the widgets)."""
    for name in FIELDS:
        value = getattr(form, name)
        st.session_state[K + name] = list(value) if isinstance(value, tuple) else value


def _form() -> logic.LaunchForm:
    """The form's current values (data options only for the chosen source)."""
    values = {name: st.session_state[K + name] for name in FIELDS}
    options = {}
    if values["dataset"] == "files":
        options = {"path": st.session_state[K + "data_path"].strip() or None,
                   "text_field": st.session_state[K + "text_field"].strip() or "text"}
        options = {k: v for k, v in options.items() if v is not None}
    elif values["dataset"] == "fineweb-edu":
        options = {"max_documents": st.session_state[K + "max_documents"]}
        if st.session_state[K + "data_files"].strip():
            options["data_files"] = st.session_state[K + "data_files"].strip()
    values["estimators"] = tuple(values["estimators"])
    values["ranks"] = tuple(values["ranks"])
    return logic.LaunchForm(**values, dataset_options=options)


def _preview(configs: list, source_text: str) -> None:
    """How many runs, how long (when a step time is known), which runs; and the Launch button."""
    timings = {}
    for c in configs:
        key = timing.timing_key(c)
        if key not in timings:
            timings[key] = timing.timing_from_history(lab.store, c) or timing.measured(c)
    known = [timings[timing.timing_key(c)] for c in configs]
    n = len(configs)
    plural = "s" if n != 1 else ""
    st.subheader(f"{n} run{plural} to launch")
    if all(known):
        total = timing.grid_seconds(configs, known, state.MAX_CONCURRENT)
        fast, slow = (f"{1000 * f(t.step_s for t in known):.0f}" for f in (min, max))
        measured = sum(t.source == "measured" for t in timings.values())
        origin = f"timed by earlier runs for {len(timings) - measured} model(s), measured for {measured}"
        st.markdown(f"Estimated time **≈ {timing.format_seconds(total)}**")
        st.caption(f"Step time {fast if fast == slow else f'{fast}–{slow}'} ms ({origin}), "
                   "plus start-up, validation and probes.")
    else:
        st.markdown("Estimated time: **unknown** (no finished run of this model yet)")
        if st.button("Measure step time", icon=":material/timer:",
                     help="Compiles the train step of each distinct model in the grid and times a few steps."):
            with st.spinner("Compiling and timing the train step…"):
                for c in configs:
                    if timings[timing.timing_key(c)] is None:
                        timings[timing.timing_key(c)] = timing.measure_step(c)
            st.rerun()
    launch = st.button(f"Launch {n} run{plural}", icon=":material/rocket_launch:", type="primary", width="stretch")
    st.dataframe(logic.grid_frame(configs), hide_index=True, width="stretch", height=min(35 * n + 38, 420),
                 column_order=["run", "steps"], placeholder="—")
    st.caption(f"Data: {source_text}")
    if launch:
        try:
            with st.spinner("Loading the data…"):
                check_data(configs)
        except (data.DataError, ConfigError, OSError) as e:
            st.error(f"The data could not be loaded: {e}", icon=":material/error:")
            return
        try:
            ids = lab.manager.submit(configs)
        except StorageError as e:
            st.error(f"The runs could not be queued: {e}", icon=":material/error:")
            return
        state.set_selected(ids)
        st.success(f"Queued {n} run{plural} (ids {ids[0]}–{ids[-1]}); they are selected for Compare.")
        st.page_link("views/compare.py", label="Watch them on Compare", icon=":material/monitoring:")
        st.page_link("views/runs.py", label="See all runs", icon=":material/table_rows:")


for name in FIELDS:  # first visit: the defaults
    default = getattr(logic.LaunchForm(), name)
    st.session_state.setdefault(K + name, list(default) if isinstance(default, tuple) else default)
for name, default in DATA_DEFAULTS.items():
    st.session_state.setdefault(K + name, default)

lab = state.lab()
st.title("Launch a sweep")
st.caption(
    "One run per estimator × rank × seed (exact backprop once per seed). Runs train in the "
    f"background, {state.MAX_CONCURRENT} at a time, and keep going if you leave this page."
)
form_col, preview_col = st.columns([2, 1], gap="large")
with form_col:
    b1, b2, _ = st.columns([1, 1, 2])
    b1.button("Paper settings", icon=":material/description:", on_click=_fill, args=(logic.PAPER_FORM,), width="stretch",
              help="The paper's run: preset paper (T 64, d 64, 2 layers, batch 1), SGD momentum 0.9, "
                   "lr 0.01, λ = 0.01 as in its code, ranks 1–64, 50,000 steps, validation every 1,000.")
    b2.button("Defaults", icon=":material/restart_alt:", on_click=_fill, args=(logic.LaunchForm(),), width="stretch",
              help="A quick tiny-model sweep.")
    st.markdown("**Model and method**")
    c1, c2 = st.columns(2)
    c1.selectbox("Model preset", list(PRESETS), key=K + "preset",
                 format_func=lambda p: f"{p} — {PRESETS[p].description}")
    c2.selectbox("Sketched layers", SKETCHED_LAYER_CHOICES, key=K + "sketched_layers",
                 help="mlp+head: both MLP layers of every block and the LM head (the paper's code).")
    c1.multiselect("Estimators", ESTIMATORS, key=K + "estimators",
                   help="`exact` is plain backprop, the baseline every other run is compared with.")
    c2.multiselect("Ranks R", logic.RANK_CHOICES, key=K + "ranks", accept_new_options=True,
                   help="Sketch size: rows of the sketched activations kept for dW. Type another number to add it.")
    c1, c2, c3 = st.columns(3)
    c1.number_input("Shrink λ", key=K + "lam", step=0.01, format="%.3f",
                    help="Both sketches are scaled by (1 − λ); the paper's code used 0.01.")
    c2.text_input("Seeds", key=K + "seeds", help="One or several: 0 · 0,1,2 · 0-4. Several seeds give mean ± std.")
    c3.selectbox("dtype", ("float32", "bfloat16"), key=K + "dtype")

    st.markdown("**Training**")
    c1, c2, c3, c4 = st.columns(4)
    c1.number_input("Steps", key=K + "steps", step=100)
    c2.number_input("Learning rate", key=K + "lr", step=0.001, format="%.4f")
    c3.selectbox("Optimizer", OPTIMIZERS, key=K + "optimizer")
    if st.session_state[K + "optimizer"] == "sgd":
        c4.number_input("Momentum", key=K + "momentum", step=0.05, format="%.2f")
    else:
        c4.number_input("Weight decay", key=K + "weight_decay", step=0.01, format="%.3f")
    preset = PRESETS.get(st.session_state[K + "preset"], PRESETS["tiny"])
    c1.number_input("Batch size", key=K + "batch_size", step=1, placeholder=f"preset: {preset.batch_size}",
                    help="Empty: the preset's.")
    c2.number_input("Sequence length", key=K + "seq_len", step=1, placeholder=f"preset: {preset.model.seq_len}",
                    help="Empty: the preset's.")
    c3.number_input("Eval interval", key=K + "eval_interval", step=10,
                    help="Steps between validations (validation loss, train loss, tokens/s).")
    c4.number_input("Probe interval", key=K + "probe_interval", step=10,
                    help="Steps between probes of the cosine of sketched dW to exact dW (0 = never).")

    st.markdown("**Data**")
    c1, c2, c3 = st.columns([2, 1, 1])
    c1.selectbox("Dataset", data.SOURCES, key=K + "dataset",
                 help="classics: Shakespeare and the King James Bible, offline. fineweb-edu: the paper's data "
                      "(needs network, or a local copy). files: your own .txt/.jsonl/.parquet.")
    c2.number_input("Validation tokens", key=K + "val_tokens", step=4096, help="Held-out tokens.")
    c3.number_input("Validation batches", key=K + "val_batches", step=1)
    source = st.session_state[K + "dataset"]
    if source == "files":
        d1, d2 = st.columns([3, 1])
        d1.text_input("Path or glob", key=K + "data_path", placeholder="/data/corpus/*.txt")
        d2.text_input("Text field", key=K + "text_field", help="For .jsonl/.parquet.")
    elif source == "fineweb-edu":
        d1, d2 = st.columns([1, 3])
        d1.number_input("Documents", key=K + "max_documents", step=1000)
        d2.text_input("Local copy (optional)", key=K + "data_files", placeholder="path or glob of parquet files")

form = _form()
with preview_col:
    try:
        configs = logic.build_grid(form)
        source_text = data.describe_source(form.dataset, **form.dataset_options)
    except (ConfigError, data.DataError) as e:
        configs = None
        st.error(str(e), icon=":material/error:")
    if configs:
        _preview(configs, source_text)
