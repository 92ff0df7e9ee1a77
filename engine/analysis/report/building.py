"""Building a report from run records and their metric rows alone: no database, no
Streamlit (``engine.reads.reports`` reads the database and stores the result).

``build`` gathers the setup (config by field group, data, device, package versions, git
commit, wall time), the paper's Table 3 (``summary.table3``: paired Δ vs exact, its 95 %
t-interval, its equivalence test against ±δ and verdict; the paper's own figures as a
labelled note), the claims (``claims.judge``, with their rules and the seeds that would
decide each claim), the figures (loss against R with seed error bars and the exact band,
validation curves with seed bands, dW cosine, activation memory and step time against R;
the builders of ``frames`` and ``charts``, the dashboard's own) and the diagnosis rows.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Iterable

import pandas as pd
import plotly.graph_objects as go

from engine.analysis import charts, claims, frames, method_frames
from engine.analysis.parallel import config_text
from engine.analysis.report import tuning as tuning_part
from engine.analysis.report.model import Report, describe_selection
from engine.analysis.summary import table3
from engine.config import GROUPS, method_label, schema, stored
from engine.core.stats import MARGIN, check_margin
from engine.core.units import format_seconds


def build(records: Iterable, metrics: pd.DataFrame, *, diagnoses: pd.DataFrame | None = None,
          selection: dict | None = None, at_step: int | None = None, title: str | None = None,
          created_at: datetime | None = None, margin: float | None = None, others: Iterable = (),
          batches: pd.DataFrame | None = None, campaign: tuning_part.Campaign | None = None,
          test_batches: pd.DataFrame | None = None) -> Report:
    """The report of ``records`` (``storage.RunRecord``) from their metric rows (the columns
    of ``RunStore.metrics``) and diagnosis rows (``claims.DIAGNOSIS_COLUMNS`` plus
    ``step`` and ``cos_mean``; None: none stored); every number read at ``at_step``, or
    per config group at the latest step all its runs reached (``summary.table3``); Δ val
    judged against ±``margin`` nats (None: the selection's ``margin``, else ``MARGIN``).
    ``others``: every stored run, of any selection, whose time on a machine claim (e)'s
    timings must not overlap (``method_frames.run_time_frame``). ``batches``: the runs'
    per-batch validation losses (``RunStore.eval_losses``), for Δ's interval (``test_batches``: those
    of the test split, where Table 3 reads it); the selection's
    ``adjust`` (default True) reads Table 3's verdicts at a family-wise 5 % (Holm). ``campaign``:
    the tuning campaign whose runs these are (``report.tuning``): its protocol, choices and
    sensitivity figure in a section of their own, and its tuned comparison's Table 3 is the one
    the claims read (each method at its own best value), the untuned one shown beside it."""
    records = sorted(records, key=lambda r: r.id)
    selection = dict(selection or {})
    margin = check_margin(margin if margin is not None else selection.get("margin", MARGIN))
    created = (created_at or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    t3 = table3(records, metrics, at_step, margin=margin, batches=batches, adjust=bool(selection.get("adjust", True)),
                test_batches=test_batches)
    section, tuned_figures, tuned_captions = tuning_part.section(campaign) if campaign is not None else (None, {}, {})
    if campaign is not None and campaign.tuned_table() is not None:
        t3 = campaign.tuned_table()
    steps = method_frames.step_time_frame(records, metrics, at_step)
    diag = _diagnoses(diagnoses)
    verdicts = claims.judge(t3, _diagnoses(diagnoses, key_values=True), steps[claims.STEP_TIME_COLUMNS],
                            timings=method_frames.run_time_frame(records, metrics, at_step, others=others),
                            margin=margin)
    figures, captions = _figures(records, metrics, at_step, steps)
    figures, captions = {**tuned_figures, **figures}, {**tuned_captions, **captions}
    notes = []
    unfinished = [r for r in records if r.status != "finished"]
    if unfinished:
        notes.append(f"{len(unfinished)} of {len(records)} runs had not finished when this report was built: "
                     + ", ".join(f"#{r.id} {r.status}" for r in unfinished[:20]) + ("…" if len(unfinished) > 20 else ""))
    if len(t3) and (t3["missing_seeds"] != "").any():
        notes.append("Some methods miss seeds at the compared step (Table 3's 'missing seeds').")
    notes += interruption_notes(records)
    if title is None and campaign is not None:
        title = f"Tuning campaign {campaign.id} ({campaign.name}): its {campaign.role}"
    return Report(title=title or describe_selection(selection), created_at=created, selection=selection,
                  run_ids=[r.id for r in records], at_step=at_step, setup=_setup(records, metrics),
                  table3=t3, step_times=steps, diagnoses=diag, verdicts=verdicts, figures=figures,
                  captions=captions, notes=notes, gathering=gathering(records, selection), tuning=section)


RESUMED = re.compile(r"(resumed from the checkpoint at step \d+|restarted from step 0)")


def interruption_notes(records) -> list[str]:
    """What the report says of runs that were stopped part-way: those still ``interrupted``
    (their numbers stop at their last validation; ``python -m engine resume`` continues
    them), and those resumed (their run notes record each resume: from which checkpoint
    step, or from step 0 when none could be read). A resumed run's metrics after its
    checkpoint were recomputed, with the same batches, so its curves and Table 3 read as
    one run."""
    out = []
    interrupted = [r for r in records if r.status == "interrupted"]
    if interrupted:
        out.append(f"{len(interrupted)} run(s) were interrupted and not resumed when this report was built: "
                   + ", ".join(f"#{r.id} at step {r.steps_done:,} of {r.steps or 0:,}" for r in interrupted[:20])
                   + ("…" if len(interrupted) > 20 else "") + ". Their numbers stop at their last validation; "
                   "`python -m engine resume --all` (or Resume all on the Runs page) continues them from their last "
                   "checkpoint.")
    resumed = [(r, RESUMED.findall(r.notes or "")) for r in records]
    resumed = [(r, found) for r, found in resumed if found]
    if resumed:
        out.append(f"{len(resumed)} run(s) were interrupted and resumed: "
                   + "; ".join(f"#{r.id} {', '.join(found)}" for r, found in resumed[:20])
                   + ("…" if len(resumed) > 20 else "") + ". A resumed run recomputes what followed its checkpoint "
                   "with the same batches, so its curves and Table 3 values read as one uninterrupted run.")
    return out


def gathering(records, selection: dict) -> list[str]:
    """How to gather the data claims (a) and (b) need: they are judged on estimator
    diagnoses (``python -m engine diagnose``: every estimator's dW on a trained run's own
    state, batches and sketch keys), not on the training runs; the run named is the
    furthest-trained finished run of the selection (the newest of equals)."""
    finished = [r for r in records if r.status == "finished"]
    run = max(finished, key=lambda r: (r.steps_done, r.id)).id if finished else "RUN"
    chosen = (f"--sweep {selection['sweep']}" if selection.get("sweep") else
              f"--tags {','.join(selection['tags'])}" if selection.get("tags") else
              "--runs " + " ".join(map(str, selection["runs"])) if selection.get("runs") else "")
    return [
        "(a) and (b) are judged on estimator diagnoses, not on the training runs: they compare balanced with uniform "
        "hashing (balanced vs countsketch, basis vs scalars) and the scalars on and off (scalars vs countsketch, "
        "basis vs balanced) on the same states, batches and sketch keys.",
        f"Diagnose a trained run: python -m engine diagnose {run} --estimators balanced,countsketch,basis,scalars "
        "--ranks 4,16,64 (or the Diagnosis page); R = 1 is left out, as there the two hashings are the same. More "
        "keys (--keys) narrow the intervals: see what would decide each claim above.",
        f"Then rebuild this report: python -m engine report {chosen + ' ' if chosen else ''}--out report.html (or "
        "Rebuild on the Report page); the diagnoses stored for its runs are read in.",
    ]


def _figures(records, metrics, at_step, steps) -> tuple[dict[str, go.Figure], dict[str, str]]:
    figures, captions = {}, {}
    info = frames.describe_runs(records)

    def add(name, fig, caption):
        figures[name], captions[name] = fig, caption

    loss = method_frames.rank_frame(records, metrics, "val_loss", at_step)
    add("loss_vs_rank", charts.rank_figure(loss, y_title="validation loss (nats/token)",
                                           title="Validation loss against the rank R"),
        "Validation loss at the compared step against R (log axis): the mean over seeds with ± 1 std error bars; "
        "exact backprop as a band (mean ± std) across the ranks.")
    curves = frames.series(metrics, info, "val_loss", pool_seeds=True)
    add("validation", charts.line_figure(curves, y_title="validation loss (nats/token)",
                                         title="Validation loss (mean over seeds, ± 1 std band)", height=440),
        "Validation curves of every method: the mean over its seeds at each evaluation, with a ± 1 std band.")
    cosine = method_frames.rank_frame(records, metrics, "cos_mean", at_step)
    if len(cosine[cosine["estimator"] != "exact"]):
        add("cosine", charts.rank_figure(cosine, y_title="mean cosine of sketched dW to exact dW",
                                         title="dW cosine against R"),
            "Mean cosine of each sketched layer's dW to the exact dW on the same batch (the last probe at or before "
            "the compared step), mean ± std over seeds.")
    memory = method_frames.rank_frame(records, metrics, "mem_saved_bytes", at_step)
    add("memory", charts.rank_figure(memory, y_title="saved for backward (MiB)", title="Activation memory against R"),
        "Bytes the compiled train step keeps for the backward pass, in MiB, against R; exact backprop as a band.")
    add("step_time", charts.rank_figure(steps, y_title="train step (ms)", title="Time per train step against R"),
        "Milliseconds per train step against R, mean ± std over seeds; exact backprop as a band.")
    return figures, captions


def _diagnoses(diagnoses: pd.DataFrame | None, key_values: bool = False) -> pd.DataFrame:
    """The pooled-layer rows; with ``key_values`` their per-key values too (for the claims,
    not for the stored report), where the frame has them."""
    columns = [*claims.DIAGNOSIS_COLUMNS, "step", "cos_mean"]
    if key_values and diagnoses is not None and claims.KEY_VALUES in diagnoses.columns:
        columns.append(claims.KEY_VALUES)
    if diagnoses is None or diagnoses.empty:
        return pd.DataFrame(columns=columns)
    d = diagnoses[diagnoses["layer"] == claims.POOLED_LAYER]
    return d[columns].sort_values(["diagnosis_id", "estimator", "lam", "rank"], kind="stable").reset_index(drop=True)


def _setup(records, metrics: pd.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """The runs, their config by field group (the schema's groups), data and environment."""
    setup: dict[str, list[tuple[str, str]]] = {}
    if not records:
        return {"Runs": [("runs", "none")]}
    statuses = pd.Series([r.status for r in records]).value_counts()
    wall = metrics.groupby("run_id")["wall_time"].max() if len(metrics) else pd.Series(dtype=float)
    started = [r.started_at for r in records if r.started_at]
    finished = [r.finished_at for r in records if r.finished_at]
    methods = list(dict.fromkeys(method_label(r.estimator, r.rank, r.lam) for r in records))
    runs = [
        ("runs", f"{len(records)} ({', '.join(f'{n} {s}' for s, n in statuses.items())})"),
        ("methods", ", ".join(methods)),
        ("seeds", ", ".join(map(str, sorted({r.seed for r in records if r.seed is not None})))),
        ("sweeps", ", ".join(sorted({r.sweep_id for r in records if r.sweep_id})) or "—"),
        ("tags", ", ".join(sorted({t for r in records for t in r.tags})) or "—"),
        ("wall time", f"{format_seconds(float(wall.sum()))} of training summed over runs"
                      + (f"; {format_seconds((max(finished) - min(started)).total_seconds())} from the first start to "
                         "the last finish" if started and finished else "")),
        ("first started", _time(min(started)) if started else "—"),
        ("last finished", _time(max(finished)) if finished else "—"),
    ]
    setup["Runs"] = runs
    configs = [r.config for r in records]
    for group, title in GROUPS.items():
        rows = []
        for f, spec, _ in schema():
            if spec.group != group or spec.swept or f.name == "name":
                continue
            values = list(dict.fromkeys(json.dumps(c.get(f.name), sort_keys=True, default=str) for c in configs))
            shown = [config_text(json.loads(v), spec.none) for v in values]
            rows.append((spec.label, shown[0] if len(shown) == 1 else "varies: " + " / ".join(shown)))
        if group == "data":
            rows.append(("tokens per step (B·T)", _varies(_rows(c) for c in configs)))
        setup[title] = rows
    versions: dict[str, set] = {}
    for r in records:
        for k, v in (r.versions or {}).items():
            versions.setdefault(k, set()).add(str(v))
    env = [("device", _varies(r.device for r in records)),
           ("git commit", _varies(r.git_commit for r in records))]
    env += [(f"{k} version", " / ".join(sorted(v))) for k, v in sorted(versions.items(), key=lambda kv: kv[0].lower())]
    setup["Environment"] = env
    return setup


def _rows(config: dict) -> str:
    run = stored(config)
    return str(run.rows) if run is not None else "—"


def _varies(values) -> str:
    shown = list(dict.fromkeys("—" if v is None else str(v) for v in values))
    return shown[0] if len(shown) == 1 else "varies: " + " / ".join(shown)


def _time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
