"""The Runs and Run detail pages: sweep/tag columns and filters, liveness on read,
Resume, Resume all, Clone to Launch, a refused delete's standing error, the workers
panel, the password gate, user text shown as plain text (also in a real Chromium),
and the public start (Procfile) that refuses to run without a password.

AppTest tests run on the per-test database of conftest.py; runs are written the way a
worker would (``fake_run``), and Resume trains real tiny runs.
"""

import dataclasses
import http.server
import json
import os
import re
import shlex
import socket
import subprocess
import threading
import time

import pandas as pd
import pytest

from app import display, form, state, tables
from engine.core.text import unlinked
from engine.runner import liveness
from storage import Database, RunStore
from tests.support.browser import CHROMIUM_ARGS, ROOT, choose, playwright_and_chromium, streamlit_server
from tests.support.pages import app, button, page, store, url  # noqa: F401  (fixtures)
from tests.support.runs import SWEEP_A, SWEEP_B, TINY, InSweep, dead_pid, fake_run, wait_for


def runs_table(at):
    return at.dataframe[0].value


def toasts(at) -> list[str]:
    return [t.value for t in at.toast]


# ----------------------------------------------------------------------------- columns and filters


def test_columns_tell_sweeps_apart_and_filter_by_sweep_and_tag(url, store):
    a = [fake_run(InSweep(store, SWEEP_A, ["pilot"]), TINY), fake_run(InSweep(store, SWEEP_A, ["pilot"]), dataclasses.replace(TINY, rank=8))]
    b = [fake_run(InSweep(store, SWEEP_B, ["ablation", "lam"]), TINY, status="running", steps_done=6)]
    store.runs.set_notes(b[0], "same name, other sweep")
    at = app().run()
    assert not at.exception
    table = runs_table(at)
    assert table["id"].tolist() == b + a[::-1]  # newest first
    assert table["name"].tolist() == ["basis R=32 s0", "basis R=8 s0", "basis R=32 s0"]  # same name twice…
    assert table["sweep"].tolist() == [SWEEP_B, SWEEP_A, SWEEP_A]  # …told apart by sweep and id
    assert [list(t) for t in table["tags"]] == [["ablation", "lam"], ["pilot"], ["pilot"]]
    assert table["steps_text"].tolist() == ["6/40", "40/40", "40/40"]
    assert table["status"].tolist() == ["▶ running", "✓ finished", "✓ finished"]  # decorated in the view only
    assert store.runs.get_run(b[0]).status == "running"
    assert table["progress"].tolist() == [0.15, 1.0, 1.0]  # 6/40: a whole percent
    columns = json.loads(at.dataframe[0].proto.columns)
    assert columns["progress"]["type_config"]["format"] == "percent"
    shown = list(at.dataframe[0].proto.column_order)
    for col in ("id", "name", "sweep", "tags", "status", "progress", "estimator", "rank", "lam", "seed", "steps_text",
                "worker", "train_loss", "val_loss", "mean_cos", "started", "duration_s", "notes"):
        assert col in shown
    assert shown[:4] == ["id", "name", "status", "progress"]  # pinned: a 420 px window keeps them
    assert shown.index("notes") < shown.index("sweep")  # notes stay in view at 1,400 px

    assert at.multiselect(key="runs.sweep").options == [SWEEP_B, SWEEP_A]
    at.multiselect(key="runs.sweep").set_value([SWEEP_B]).run()
    assert runs_table(at)["id"].tolist() == b
    at.multiselect(key="runs.sweep").set_value([]).run()
    assert at.multiselect(key="runs.tag").options == ["ablation", "lam", "pilot"]
    at.multiselect(key="runs.tag").set_value(["pilot"]).run()
    assert runs_table(at)["id"].tolist() == a[::-1]
    at.multiselect(key="runs.tag").set_value(["lam", "pilot"]).run()
    assert runs_table(at)["id"].tolist() == b + a[::-1]
    at.multiselect(key="runs.sweep").set_value([SWEEP_A]).run()
    assert runs_table(at)["id"].tolist() == a[::-1]


PHONE_TABLE_PX = 420 - 2 * 16  # a 420 px window less the page's side padding (the sidebar collapses)


def test_whole_sweep_ids_and_tags_and_a_phone_keeps_id_name_status_progress(url, store):
    fake_run(InSweep(store, SWEEP_A, ["pilot", "lr sweep", "ablation"]), TINY)
    fake_run(InSweep(store, SWEEP_B), dataclasses.replace(TINY, rank=8))
    at = app().run()
    config = json.loads(at.dataframe[0].proto.columns)
    order = list(at.dataframe[0].proto.column_order)
    pinned = [c for c in order if config.get(c, {}).get("pinned")]
    assert pinned == ["id", "name", "status", "progress"] == order[:4]  # pinned columns stay while the rest scroll
    assert sum(config[c]["width"] for c in pinned) <= PHONE_TABLE_PX
    longest_tags = sum(len(t) * tables.CHAR_PX + tables.CHIP_PAD_PX for t in ("pilot", "lr sweep", "ablation"))
    assert config["sweep"]["width"] >= len(SWEEP_A) * tables.CHAR_PX + tables.CELL_PAD_PX  # the whole id
    assert config["tags"]["width"] >= longest_tags
    assert tables.text_width(["x" * 500]) == 260 and tables.text_width([None]) == 60  # bounded


def test_progress_is_floored_to_a_whole_percent(store):
    run_id = fake_run(store, dataclasses.replace(TINY, steps=150, eval_interval=50, probe_interval=50),
                      status="running", steps_done=20)
    view = tables.runs_view(store.frames.runs_frame())
    assert view.loc[0, "progress"] == pytest.approx(0.13)  # 20/150 = 13.33 %: shown as 13 %
    store.runs.heartbeat(run_id, 149)
    assert tables.runs_view(store.frames.runs_frame()).loc[0, "progress"] == pytest.approx(0.99)  # never 100 % early


def test_pages_only_read_and_the_dashboards_sweep_marks_a_dead_workers_run(url, store, monkeypatch):
    """A run whose worker died stays as stored while the Runs, Run detail and Reports pages
    render (no write session is opened by the script's thread); the dashboard's sweep, on its
    own heartbeat thread, marks it interrupted (cause ``stale``), and Resume all offers it."""
    run_id = fake_run(store, TINY, status="queued", steps_done=5)
    assert store.queue.claim(run_id, f"{socket.gethostname()}:{dead_pid()}")
    writes, session = [], Database.session

    def watched(self, write=False):
        name = threading.current_thread().name
        if write and not name.startswith("basis-"):  # the heartbeats' threads: basis-dashboard-sweep, …
            writes.append(name)
        return session(self, write)

    monkeypatch.setattr(Database, "session", watched)
    sweep = liveness.sweep
    monkeypatch.setattr(liveness, "sweep", lambda store: [])  # held while the pages render
    at = app(selected=[run_id]).run()
    assert not at.exception
    for name in ("detail", "report", "runs"):
        page(at, name)
    assert writes == [] and store.runs.get_run(run_id).status == "running"
    monkeypatch.setattr(liveness, "sweep", sweep)
    wait_for(lambda: store.runs.get_run(run_id).status == "interrupted", timeout=120, what="the dashboard's sweep")
    assert store.runs.get_run(run_id).interruption_cause == "stale"
    assert "no longer running" in store.runs.get_run(run_id).error
    at = app().run()
    assert runs_table(at)["status"].tolist() == ["⚠ interrupted"]
    assert not button(at, "Resume all").disabled
    assert writes == []


# ----------------------------------------------------------------------------- resume

# What Resume trains for real: TINY validated on 2 batches, not the 256 that hold its default
# validation tokens (each eval of those cost seconds; a resume works the same on either).
TRAINED = dataclasses.replace(TINY, val_batches=2)


def test_resume_trains_a_selected_interrupted_run_from_step_0(url, store):
    run_id = fake_run(store, TRAINED, status="running", steps_done=10)
    store.runs.set_status(run_id, "interrupted", error="interrupted: signal")
    at = app(selected=[run_id]).run()
    assert not button(at, "Resume").disabled
    button(at, "Resume").click().run()
    assert not at.exception
    assert f"Resumed \\#{run_id} from step 0 \\(no checkpoint\\)\\." in toasts(at)
    wait_for(lambda: store.runs.get_run(run_id).status == "finished", timeout=600)
    assert store.runs.get_run(run_id).steps_done == TINY.steps
    val = store.metrics([run_id], names=["val_loss"])
    assert val["step"].tolist() == list(range(0, TINY.steps + 1, TINY.eval_interval))  # replaced, not duplicated


def test_resume_all_resumes_interrupted_runs_and_trains_orphaned_queued_runs(url, store):
    done = fake_run(store, TRAINED)
    interrupted = fake_run(store, TRAINED, status="running", steps_done=10)
    store.runs.set_status(interrupted, "interrupted", error="interrupted: worker gone")
    orphan = fake_run(store, dataclasses.replace(TRAINED, seed=1), status="queued", steps_done=0)  # the same programs
    assert store.runs.get_run(orphan).owner is None
    at = app().run()
    button(at, "Resume all").click().run()
    assert not at.exception
    [message] = toasts(at)
    assert f"\\#{interrupted} from step 0" in message and f"\\#{orphan}" in message
    wait_for(lambda: all(store.runs.get_run(i).status == "finished" for i in (interrupted, orphan)), timeout=600)
    assert [store.runs.get_run(i).steps_done for i in (done, interrupted, orphan)] == [TINY.steps] * 3
    at.run()
    assert button(at, "Resume all").disabled  # nothing left to resume


def test_resume_text_names_the_checkpoint_step():
    text = display.resume_text({3: 200, 4: None, 5: 100}, [3, 4])
    assert text == "Resumed #3 from checkpoint step 200, #4 from step 0 (no checkpoint). Not resumable now: #5."
    assert display.resume_text({7: None}, []) == "Nothing was resumed. Not resumable now: #7."


# ----------------------------------------------------------------------------- clone to launch


def _launch_values(at) -> dict:
    return {w.name: at.session_state[w.key] for w in form.widgets()}


def test_clone_to_launch_fills_the_form_with_the_selected_runs(url, store):
    configs = [dataclasses.replace(TINY, rank=2, seed=0, steps=30, lr=0.02), dataclasses.replace(TINY, rank=8, seed=1, steps=30, lr=0.02)]
    ids = [fake_run(store, c) for c in configs]
    at = app(selected=ids).run()
    button(at, "Clone to Launch").click().run()
    assert not at.exception
    assert at.title[0].value == "Launch a sweep"
    assert at.text_input(key="launch.ranks").value == "2, 8"
    assert at.text_input(key="launch.seeds").value == "0, 1"
    assert at.number_input(key="launch.steps").value == 30
    assert at.number_input(key="launch.lr").value == pytest.approx(0.02)
    expected = form.values_of(form.clone_sweep([store.runs.get_run(i).config for i in ids]))
    assert {k: v for k, v in _launch_values(at).items() if k in expected} == expected
    assert [c.label() for c in form.to_sweep(_launch_values(at)).expand()] == [
        "basis R=2 s0", "basis R=8 s0", "basis R=2 s1", "basis R=8 s1"]


def test_clone_to_launch_from_run_detail(url, store):
    run_id = fake_run(store, dataclasses.replace(TINY, estimator="exact", seed=3, steps=25))
    at = app().run()
    at.session_state["detail.run"] = run_id
    page(at, "detail")
    button(at, "Clone to Launch").click().run()
    assert at.title[0].value == "Launch a sweep"
    assert at.multiselect(key="launch.estimators").value == ["exact"]
    assert at.text_input(key="launch.seeds").value == "3"
    assert at.number_input(key="launch.steps").value == 25


# ----------------------------------------------------------------------------- delete, workers


def test_the_refused_delete_error_stays_until_dismissed(url, store):
    run_id = fake_run(store, TINY, status="running", steps_done=5)
    at = app(selected=[run_id]).run()
    button(at, "Delete").click().run()
    refused = display.plain(f"Run(s) {run_id} are running: stop them first, then delete.")
    assert at.error[0].value == refused
    at.run()
    at.run()  # refreshes do not wipe it
    assert at.error[0].value == refused
    assert [r.id for r in store.runs.list_runs()] == [run_id]
    at.button(key="runs.error.dismiss").click().run()
    assert not at.error


def test_workers_panel_shows_active_stopped_and_gone(url, store):
    store.workers.register_worker("gpu-box:41:aa", "gpu-box", 41, device="gpu: H100")
    store.workers.register_worker("laptop:7:bb", "laptop", 7, device="cpu: cpu")
    store.workers.end_worker("laptop:7:bb")
    pid = dead_pid()
    store.workers.register_worker(f"here:{pid}:cc", socket.gethostname(), pid, device="cpu: cpu")
    fake_run(store, TINY)
    at = app().run()
    assert len(at.dataframe[1].value) == 3  # a dashboard that has not trained yet is no worker
    mine = state._lab(url).manager.worker_id  # its job manager starts on first use
    at.run()
    workers = at.dataframe[1].value
    states = dict(zip(workers["id"], workers["state"]))
    assert states["gpu-box:41:aa"] == "▶ active"
    assert states["laptop:7:bb"] == "■ stopped"
    assert states[f"here:{pid}:cc"] == "⚠ gone"
    assert states[mine] == "▶ active"  # this dashboard's own job manager
    assert any(e.label.startswith("Workers ·") and "1 gone" in e.label and "1 stopped" in e.label for e in at.expander)


def test_an_idle_workers_run_is_an_empty_cell_drawn_as_the_placeholder(url, store):
    """An idle worker's training run is a missing number (the grid draws the table's
    placeholder, as every table of the dashboard does), never the text ``<NA>``."""
    run_id = fake_run(store, TINY, status="running", steps_done=0)
    store.workers.register_worker("gpu-box:41:aa", "gpu-box", 41, device="gpu: H100")
    store.workers.worker_heartbeat("gpu-box:41:aa", run_id)
    store.workers.register_worker("gpu-box:42:bb", "gpu-box", 42, device="gpu: H100")  # idle
    at = app().run()
    table = next(d for d in at.dataframe if "heartbeat_age_s" in d.value.columns)
    runs = dict(zip(table.value["id"], table.value["current_run"]))
    assert runs["gpu-box:41:aa"] == run_id and runs["gpu-box:42:bb"] is pd.NA
    assert table.proto.placeholder == "—"


def test_the_count_says_the_time_left_of_the_active_runs_with_one_colon(url, store):
    """The caption above the table, while a run is running and its time left is not known yet."""
    fake_run(store, TINY, status="running", steps_done=0)
    at = app().run()
    [count] = [c.value for c in at.caption if c.value.startswith("1 running")]
    assert count == ("1 running · 1 in all — for the queued and running runs, time left: known after the first "
                     "validations of a running run")
    assert count.count(":") == 1


# ----------------------------------------------------------------------------- plain text, detail


EVIL = "![x](http://127.0.0.1:9/img) <img src=x> **bold**"


def test_names_notes_and_errors_are_escaped_on_both_pages(url, store):
    run_id = fake_run(store, TINY, status="failed", steps_done=10, error=f"boom: [link]({EVIL})")
    store.runs.rename_run(run_id, EVIL)
    store.runs.set_notes(run_id, f"note {EVIL}")
    at = app(selected=[run_id]).run()
    assert runs_table(at)["name"].tolist() == [EVIL]  # a grid cell: plain already
    button(at, "Delete").click().run()
    listed = [m.value for m in at.markdown if m.value.startswith("- #") or m.value.startswith("- \\#")]
    assert listed == [f"- #{run_id} {display.plain(EVIL)} (failed)"]
    at.button(key="runs.delete.cancel").click().run()

    at.session_state["detail.run"] = run_id
    page(at, "detail")
    assert at.subheader[0].value.startswith(display.plain(EVIL))
    assert display.plain(f"note {EVIL}") == at.info[0].value
    assert display.plain(f"This run failed: boom: [link]({EVIL})") == at.error[0].value
    assert "sweep" in at.caption[0].value and "no checkpoint" in at.caption[0].value
    assert button(at, "Resume") and button(at, "Clone to Launch")


def test_run_detail_resumes_a_cancelled_run(url, store):
    run_id = fake_run(store, TRAINED, status="cancelled", steps_done=20)
    at = app().run()
    at.session_state["detail.run"] = run_id
    page(at, "detail")
    button(at, "Resume").click().run()
    assert f"Resumed \\#{run_id} from step 0 \\(no checkpoint\\)\\." in toasts(at)
    wait_for(lambda: store.runs.get_run(run_id).status == "finished", timeout=600)


def test_run_detail_stops_a_run_only_after_a_confirmation_naming_it(url, store):
    run_id = fake_run(store, TINY, status="running", steps_done=5)
    other = fake_run(store, dataclasses.replace(TINY, rank=8), status="running", steps_done=5)
    at = app().run()
    at.session_state["detail.run"] = run_id
    page(at, "detail")
    button(at, "Stop this run").click().run()
    assert [m.value for m in at.markdown if m.value.startswith("- #")] == [f"- #{run_id} basis R=32 s0 (running)"]
    at.button(key="confirm.stop.cancel").click().run()
    assert not store.runs.cancel_requested(run_id)
    button(at, "Stop this run").click().run()
    at.button(key="confirm.stop.ok").click().run()
    assert store.runs.cancel_requested(run_id) and not store.runs.cancel_requested(other)
    assert f"Stop requested for \\#{run_id}\\." in toasts(at)


def test_row_positions_map_to_run_ids_and_a_new_row_list_is_a_new_table():
    assert tables.ids_at([14, 15, 20], [0, 2, 7]) == [14, 20]
    assert tables.table_key("t", [14, 15]) == tables.table_key("t", [14, 15])
    assert tables.table_key("t", [14, 15]) != tables.table_key("t", [15, 16])
    assert tables.table_key("t", [14]) != tables.table_key("t", [15])  # the same one row, another run


# ----------------------------------------------------------------------------- password gate, public start


def test_the_password_gate_shows_only_its_form_until_the_right_password(url, store, monkeypatch):
    monkeypatch.setenv("BASIS_LAB_PASSWORD", "correct horse")
    fake_run(store, TINY)
    at = app().run()
    assert [t.value for t in at.title] == ["BASIS Lab"]
    assert len(at.text_input) == 1 and not at.dataframe and not at.sidebar.toggle
    at.text_input[0].input("wrong")
    button(at, "Unlock").click().run()
    assert at.error[0].value == "Wrong password." and not at.dataframe
    at.text_input[0].input("correct horse")
    button(at, "Unlock").click().run()
    assert at.title[0].value == "Runs" and len(runs_table(at)) == 1
    page(at, "detail")
    assert at.title[0].value == "Run detail"


def _procfile_web() -> str:
    [line] = [line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith("web:")]
    return line[len("web:"):].strip()


def test_the_procfile_refuses_to_serve_without_a_password(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BASIS_LAB_PASSWORD"}
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "streamlit").write_text('#!/bin/sh\necho "streamlit $*"\n')
    (fake_bin / "streamlit").chmod(0o755)
    env.update(PORT="8765", PATH=f"{fake_bin}:{env['PATH']}")
    refused = subprocess.run(["bash", "-c", _procfile_web()], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0
    assert "BASIS_LAB_PASSWORD" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert "streamlit" not in refused.stdout
    env["BASIS_LAB_PASSWORD"] = "s3cret"
    started = subprocess.run(["bash", "-c", _procfile_web()], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == ["streamlit", "run", "app/main.py", "--server.port", "8765",
                                      "--server.address", "0.0.0.0", "--server.headless", "true"]


def test_make_run_binds_localhost():
    """``make run`` starts the dashboard command without an address of its own, and that
    command's Streamlit listens on 127.0.0.1 (this machine only)."""
    from app import serve

    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^run:.*\n\t(.*)$", makefile, re.M).group(1)
    assert "basis-lab-dashboard" in recipe and "--address" not in recipe
    args = serve.build_parser().parse_args(shlex.split(recipe.split("basis-lab-dashboard", 1)[1].replace("$(PORT)", "8600")))
    assert " --server.address 127.0.0.1 " in " ".join(serve.command(args.port, args.address)) + " "


# ----------------------------------------------------------------------------- real browser


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):
        type(self).hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.browser
def test_user_text_fetches_nothing_in_a_real_browser(tmp_path, token_cache):
    sync_playwright, chromium = playwright_and_chromium()

    _Counter.hits = []
    trap = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    threading.Thread(target=trap.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{trap.server_address[1]}"
    name = f"![x]({host}/img)"
    notes = f"see [the notes]({host}/notes) ![n]({host}/n.png) <img src='{host}/tag.png'>"
    error = f"diverged, details at [here]({host}/err) ![e]({host}/e.png)"

    db = f"sqlite:///{tmp_path / 'browser.db'}"
    store = RunStore(db)
    run_id = fake_run(store, TINY, status="failed", steps_done=10, error=error)
    store.runs.rename_run(run_id, name)
    store.runs.set_notes(run_id, notes)
    store.close()

    env = dict(os.environ, BASIS_LAB_DB_URL=db, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    env.pop("BASIS_LAB_PASSWORD", None)
    try:
        with streamlit_server(env, tmp_path / "streamlit.log") as port, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.set_default_timeout(120_000)
                page.goto(f"http://127.0.0.1:{port}/runs")
                page.get_by_role("heading", name="Runs").wait_for()
                page.get_by_text("1 failed · 1 in all").wait_for()
                assert "Page not found" not in page.content()
                page.get_by_text(name, exact=True).first.wait_for(state="attached")  # the grid's cell text

                page.goto(f"http://127.0.0.1:{port}/detail?run={run_id}")
                page.get_by_role("heading", name="Run detail").wait_for()
                page.get_by_text("Validation loss").first.wait_for()
                heading = page.locator('[data-testid="stHeading"]').filter(has_text="failed")
                assert heading.inner_text().startswith(unlinked(name))  # markdown text: autolinks broken invisibly
                page.get_by_text(unlinked(notes), exact=True).wait_for()
                page.get_by_text(unlinked(f"This run failed: {error}"), exact=True).wait_for()
                time.sleep(2)  # let any image or prefetch the page might start arrive
                assert page.locator(f'img[src^="{host}"]').count() == 0
                assert page.locator(f'a[href^="{host}"]').count() == 0  # not even GFM's autolink of a bare URL
            finally:
                browser.close()
    finally:
        trap.shutdown()
    assert _Counter.hits == []


TICK_ROW_0 = (12, 35 + 17)  # the row marker of the grid's first row, from its top left corner


def _tick_first_row(page, attempts: int = 4) -> None:
    """Tick the grid's first row. The grid is a canvas that may still be laying out when
    it first shows, so a click can select nothing; it is tried again only once the app is
    idle (no rerun under way) and still shows no selection, so a slow rerun of a click
    that did tick is never answered by a second, un-ticking click."""
    selected = page.get_by_text("1 selected", exact=True)
    running = page.locator('[data-testid="stStatusWidget"]')
    grid = page.locator('[data-testid="stDataFrame"]').first
    for _ in range(attempts):
        running.wait_for(state="hidden", timeout=60_000)
        grid.wait_for(state="visible")
        box = grid.bounding_box()
        if box is None:  # re-rendered between the two calls
            continue
        page.mouse.click(box["x"] + TICK_ROW_0[0], box["y"] + TICK_ROW_0[1])
        try:
            selected.wait_for(timeout=20_000)
            return
        except Exception:  # noqa: BLE001 — playwright's TimeoutError: no selection shown yet
            running.wait_for(state="hidden", timeout=60_000)
            page.wait_for_timeout(1_000)
            if selected.count():
                return
    selected.wait_for()


@pytest.mark.browser
def test_a_tick_follows_its_run_not_its_row_in_a_real_browser(tmp_path, token_cache):
    """Filter to running, tick the only row (run A), Stop it through the confirmation that
    names it; A leaves the filter and B starts, taking A's row: B is not ticked, and
    nothing can be stopped by a second click."""
    sync_playwright, chromium = playwright_and_chromium()
    db = f"sqlite:///{tmp_path / 'tick.db'}"
    store = RunStore(db)
    a = fake_run(store, dataclasses.replace(TINY, steps=400), status="running", steps_done=10)
    b = fake_run(store, dataclasses.replace(TINY, rank=8, steps=400), status="queued", steps_done=0)
    fake_run(store, dataclasses.replace(TINY, rank=2))
    env = dict(os.environ, BASIS_LAB_DB_URL=db, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    env.pop("BASIS_LAB_PASSWORD", None)
    try:
        with streamlit_server(env, tmp_path / "streamlit.log") as port, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.set_default_timeout(60_000)
                page.goto(f"http://127.0.0.1:{port}/runs")
                page.get_by_text("3 in all").wait_for()
                choose(page, "stMultiSelect", "Status", "running")
                page.keyboard.press("Escape")
                page.get_by_text("basis R=32 s0", exact=True).first.wait_for(state="attached")
                page.get_by_text("Tick rows to").wait_for()
                _tick_first_row(page)
                page.get_by_role("button", name="Stop…").click()
                dialog = page.get_by_role("dialog")
                dialog.get_by_text(f"#{a} basis R=32 s0 (running)").wait_for()
                assert store.runs.get_run(a).status == "running" and not store.runs.cancel_requested(a)
                dialog.get_by_role("button", name=f"Stop #{a}").click()
                dialog.wait_for(state="detached")
                assert store.runs.cancel_requested(a) and not store.runs.cancel_requested(b)
                store.runs.set_status(a, "cancelled")  # what its worker does at the next step
                store.runs.set_status(b, "running")  # and the next run starts
                store.runs.heartbeat(b, 1)
                page.get_by_text("basis R=8 s0", exact=True).first.wait_for(state="attached")  # B took the row
                page.get_by_text("Tick rows to").wait_for()
                assert page.get_by_text("1 selected", exact=True).count() == 0
                assert page.get_by_role("button", name="Stop…").is_disabled()
                assert not store.runs.cancel_requested(b) and store.runs.get_run(b).status == "running"
            finally:
                browser.close()
    finally:
        store.close()


def test_the_runs_page_offers_a_backup_of_the_database(url, store):
    fake_run(store, TINY)
    at = app().run()
    assert not at.exception
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Back up the database" in labels
