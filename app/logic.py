"""The dashboard's logic without Streamlit: launch-form parsing, the runs table,
seed groups and trace labels, EMA smoothing and seed pooling, the incremental
metrics cache, and the frames the charts and tables are drawn from.

Everything here takes and returns plain Python values and pandas DataFrames,
so it is tested without a browser or a Streamlit runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from engine.grid import expand_grid
from engine.summary import MIB, comparable_key, table3
from engine.train import ConfigError, RunConfig

# ----------------------------------------------------------------------------- launch form

RANK_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
PAPER_RANKS = (1, 8, 16, 32, 64)


@dataclass(frozen=True)
class LaunchForm:
    """The values of the Launch page. ``ranks`` may hold ints or typed strings;
    ``seeds`` is text such as ``"0"``, ``"0,1,2"`` or ``"0-4"``; ``batch_size`` and
    ``seq_len`` None mean the preset's."""

    preset: str = "tiny"
    sketched_layers: str = "mlp+head"
    estimators: tuple = ("exact", "basis")
    ranks: tuple = (1, 8, 32)
    lam: float = 0.0
    steps: int = 200
    lr: float = 0.01
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int | None = None
    seq_len: int | None = None
    dataset: str = "classics"
    dataset_options: dict = field(default_factory=dict)
    val_tokens: int = 65536
    val_batches: int = 8
    eval_interval: int = 20
    probe_interval: int = 20
    seeds: str = "0"
    dtype: str = "float32"


# The paper's run (section 4 and its public code): batch 1, T 64, d 64, SGD with
# momentum 0.9 at lr 0.01, 50,000 steps, validation every 1,000, λ = 0.01.
PAPER_FORM = LaunchForm(
    preset="paper", sketched_layers="mlp+head", estimators=("exact", "basis"), ranks=PAPER_RANKS,
    lam=0.01, steps=50_000, lr=0.01, optimizer="sgd", momentum=0.9, weight_decay=0.0,
    batch_size=None, seq_len=None, eval_interval=1000, probe_interval=1000, seeds="0",
)


def parse_seeds(text: str) -> list[int]:
    """``"0"`` → [0]; ``"0,1,2"``, ``"0 1 2"`` and ``"0-2"`` → [0, 1, 2]; order kept,
    duplicates dropped. Raises ``ConfigError`` naming ``seeds`` on anything else."""
    seeds: list[int] = []
    tokens = [t for t in str(text).replace(",", " ").split() if t]
    if not tokens:
        raise ConfigError("seeds: give at least one seed, e.g. 0 or 0,1,2 or 0-4")
    for token in tokens:
        lo, sep, hi = token.partition("-")
        try:
            span = range(int(lo), int(hi) + 1) if sep else [int(token)]
        except ValueError:
            raise ConfigError(f"seeds: {token!r} is not a seed (integers >= 0: 0,1,2 or 0-4)") from None
        if sep and int(hi) < int(lo):
            raise ConfigError(f"seeds: range {token!r} is empty; write low-high, e.g. 0-4")
        for s in span:
            if s < 0:
                raise ConfigError(f"seeds must be integers >= 0 (got {s})")
            if s not in seeds:
                seeds.append(s)
    return seeds


def parse_ranks(values: Iterable) -> list[int]:
    """Multi-select values (ints, or strings a user typed) → sorted unique ints.
    Raises ``ConfigError`` naming ``rank`` on a value that is not an integer >= 1."""
    ranks = set()
    for v in values:
        try:
            r = int(str(v).strip())
        except ValueError:
            raise ConfigError(f"rank must be an integer >= 1 (got {v!r})") from None
        if r < 1:
            raise ConfigError(f"rank must be an integer >= 1 (got {r})")
        ranks.add(r)
    return sorted(ranks)


def build_grid(form: LaunchForm) -> list[RunConfig]:
    """The runs the form launches: one per estimator × rank × seed (exact once per
    seed), each validated by ``RunConfig``. Raises ``ConfigError`` whose message
    names the bad field."""
    if not form.estimators:
        raise ConfigError("estimators: choose at least one (exact is plain backprop)")
    seeds = parse_seeds(form.seeds)
    ranks = parse_ranks(form.ranks)
    base = RunConfig(
        preset=form.preset, sketched_layers=form.sketched_layers, estimator="exact", lam=form.lam,
        optimizer=form.optimizer, lr=form.lr, momentum=form.momentum, weight_decay=form.weight_decay,
        steps=form.steps, batch_size=form.batch_size, seq_len=form.seq_len, dataset=form.dataset,
        dataset_options=dict(form.dataset_options), val_tokens=form.val_tokens,
        eval_interval=form.eval_interval, val_batches=form.val_batches,
        probe_interval=form.probe_interval, seed=seeds[0], dtype=form.dtype,
    )
    return expand_grid(base, estimators=list(form.estimators), ranks=ranks, seeds=seeds)


def grid_frame(configs: Sequence[RunConfig]) -> pd.DataFrame:
    """One row per config: run, estimator, rank (None when exact), λ, seed, steps."""
    return pd.DataFrame(
        {
            "run": [c.label() for c in configs],
            "estimator": ["exact" if c.is_exact else c.estimator for c in configs],
            "rank": pd.array([None if c.is_exact else c.rank for c in configs], dtype="Int64"),
            "λ": [c.lam for c in configs],
            "seed": [c.seed for c in configs],
            "steps": [c.steps for c in configs],
        }
    )


# ----------------------------------------------------------------------------- runs table

STATUS_LABELS = {  # text symbols, not emoji: they render with any font
    "queued": "○ queued",
    "running": "▶ running",
    "finished": "✓ finished",
    "failed": "✗ failed",
    "cancelled": "■ cancelled",
    "interrupted": "⚠ interrupted",
}
RUNS_COLUMNS = [
    "id", "name", "status", "progress", "estimator", "rank", "lam", "seed", "preset",
    "steps_done", "steps", "train_loss", "val_loss", "mean_cos", "started", "duration_s", "notes",
]


def runs_view(frame: pd.DataFrame, now: datetime | None = None) -> pd.DataFrame:
    """``RunStore.runs_frame()`` → the Runs table: status with an icon, progress in
    [0, 1] (steps done / steps), the last losses and mean cosine, start time (UTC,
    naive) and duration in seconds (to ``now`` for running runs). Ordered by id."""
    if frame.empty:
        return pd.DataFrame(columns=RUNS_COLUMNS)
    now = now or datetime.now(timezone.utc)
    started = pd.to_datetime(frame["started_at"], utc=True)
    ended = pd.to_datetime(frame["finished_at"], utc=True)
    running = frame["status"] == "running"
    end = ended.where(~running, pd.Timestamp(now))
    steps = frame["steps"].astype("Float64")
    done = frame["steps_done"].astype("Float64")
    progress = (done / steps.where(steps > 0)).clip(0, 1)
    progress = progress.where(frame["status"] != "finished", 1.0)
    out = pd.DataFrame(
        {
            "id": frame["id"].astype("int64"),
            "name": frame["name"],
            "status": frame["status"].map(lambda s: STATUS_LABELS.get(s, s)),
            "progress": progress.astype("float64"),
            "estimator": frame["estimator"],
            "rank": frame["rank"],
            "lam": frame["lam"],
            "seed": frame["seed"],
            "preset": frame["preset"],
            "steps_done": frame["steps_done"],
            "steps": frame["steps"],
            "train_loss": frame["last_train_loss"],
            "val_loss": frame["last_val_loss"],
            "mean_cos": frame["last_mean_cos"],
            "started": started.dt.tz_convert(None),
            "duration_s": (end - started).dt.total_seconds(),
            "notes": frame["notes"],
        }
    )
    return out.sort_values("id").reset_index(drop=True)


def filter_runs(view: pd.DataFrame, text: str = "", statuses: Sequence[str] = (), estimators: Sequence[str] = ()) -> pd.DataFrame:
    """Rows whose name or notes contain ``text`` (case-insensitive), whose status is
    in ``statuses`` and estimator in ``estimators`` (empty = any)."""
    keep = pd.Series(True, index=view.index)
    if text.strip():
        needle = text.strip().lower()
        keep &= view["name"].str.lower().str.contains(needle, regex=False) | view["notes"].fillna("").str.lower().str.contains(needle, regex=False)
    if statuses:
        keep &= view["status"].isin([STATUS_LABELS.get(s, s) for s in statuses])
    if estimators:
        keep &= view["estimator"].isin(list(estimators))
    return view[keep].reset_index(drop=True)


def merge_selection(previous: Sequence[int], visible: Sequence[int], chosen: Sequence[int]) -> list[int]:
    """The app-wide selection after the user chose ``chosen`` among the ``visible``
    rows: selected runs hidden by a filter stay selected; order is kept."""
    visible_set = set(int(v) for v in visible)
    kept = [int(i) for i in previous if int(i) not in visible_set]
    return list(dict.fromkeys(kept + [int(c) for c in chosen]))


# ----------------------------------------------------------------------------- run groups

_GROUP_IGNORES = ("seed", "name")


def seed_group_key(config: dict) -> str:
    """Runs with equal keys differ only by seed (and name): their curves are pooled.
    Exact runs ignore rank and λ (they do not change exact backprop)."""
    exact = config.get("estimator") == "exact" or config.get("sketched_layers") == "none"
    ignores = _GROUP_IGNORES + (("rank", "lam") if exact else ())
    return repr(sorted((k, repr(v)) for k, v in config.items() if k not in ignores))


def method_label(estimator: str | None, rank, lam) -> str:
    """``exact``, ``basis R=8``, ``basis R=8 λ=0.01``."""
    if estimator in (None, "exact") or rank is None or (isinstance(rank, float) and math.isnan(rank)):
        return "exact"
    lam_text = f" λ={lam:g}" if lam else ""
    return f"{estimator} R={int(rank)}{lam_text}"


def _differing_fields(configs: Sequence[dict]) -> list[str]:
    """Config fields (other than estimator, rank, λ, seed, name) that differ between ``configs``."""
    ignore = {"estimator", "rank", "lam", "seed", "name"}
    keys = sorted({k for c in configs for k in c} - ignore)
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


def describe_runs(records: Sequence) -> pd.DataFrame:
    """One row per ``storage.RunRecord`` (ordered by id): run_id, name, status,
    estimator, rank, lam, seed, preset, steps, ``key`` (comparable config),
    ``group`` (seed group), ``color_id`` (smallest run id of its group),
    ``group_size``, ``method`` and ``setup`` (the config fields that differ across
    the selection, e.g. ``preset=tiny``; empty when all share one setup)."""
    records = sorted(records, key=lambda r: r.id)
    columns = ["run_id", "name", "status", "estimator", "rank", "lam", "seed", "preset", "steps",
               "key", "group", "color_id", "group_size", "method", "setup"]
    if not records:
        return pd.DataFrame(columns=columns)
    differing = _differing_fields([r.config for r in records])
    rows = []
    for r in records:
        setup = ", ".join(f"{k}={r.config.get(k)}" for k in differing)
        rows.append({
            "run_id": r.id, "name": r.name, "status": r.status, "estimator": r.estimator,
            "rank": r.rank, "lam": r.lam, "seed": r.seed, "preset": r.preset, "steps": r.steps,
            "key": comparable_key(r.config), "group": seed_group_key(r.config),
            "method": method_label(r.estimator, r.rank, r.lam), "setup": setup,
        })
    info = pd.DataFrame(rows)
    info["color_id"] = info.groupby("group")["run_id"].transform("min")
    info["group_size"] = info.groupby("group")["run_id"].transform("size")
    info["rank"] = info["rank"].astype("Int64")
    return info[columns]


def trace_labels(info: pd.DataFrame, pool_seeds: bool) -> pd.Series:
    """Legend label per run (indexed by run_id): the run name, or for a pooled seed
    group ``method · mean of n seeds`` (shared by its runs), with ``[setup]`` when
    the selection mixes setups. Labels that would still name two curves get
    ``#id`` (the run id, or the group's colour id when pooled)."""
    labels, owners, suffix = {}, {}, {}
    for row in info.itertuples():
        pooled = pool_seeds and row.group_size > 1
        if pooled:
            seeds = int(info.loc[info["group"] == row.group, "seed"].nunique())
            count = f"{seeds} seeds" if seeds == row.group_size else f"{row.group_size} runs"
            base = f"{row.method} · mean of {count}"
        else:
            base = row.name
        label = f"{base} [{row.setup}]" if row.setup else base
        labels[row.run_id] = label
        curve = ("group", row.group) if pooled else ("run", row.run_id)
        owners.setdefault(label, set()).add(curve)
        suffix[row.run_id] = row.color_id if pooled else row.run_id
    return pd.Series(
        {rid: (f"{label} #{suffix[rid]}" if len(owners[label]) > 1 else label) for rid, label in labels.items()},
        dtype=object,
    )


# ----------------------------------------------------------------------------- series

SERIES_COLUMNS = ["trace", "color_id", "x", "y", "lo", "hi", "n"]


def ema(values: Sequence[float], weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing):
    m_t = w·m_{t−1} + (1−w)·x_t, reported as m_t / (1 − w^t). ``weight`` 0 returns
    the values unchanged; NaNs are skipped (they stay NaN in the output)."""
    x = np.asarray(values, dtype=float)
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1) (got {weight})")
    if weight == 0.0 or x.size == 0:
        return x.copy()
    out = np.full_like(x, np.nan)
    m, t = 0.0, 0
    for i, v in enumerate(x):
        if math.isfinite(v):
            t += 1
            m = weight * m + (1.0 - weight) * v
            out[i] = m / (1.0 - weight**t)
    return out


def thin(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most ``max_points`` rows, evenly spaced, first and last kept (for drawing only)."""
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2 (got {max_points})")
    if len(frame) <= max_points:
        return frame
    idx = np.unique(np.linspace(0, len(frame) - 1, max_points).round().astype(int))
    return frame.iloc[idx]


def series(
    metrics: pd.DataFrame,
    info: pd.DataFrame,
    name: str,
    *,
    x: str = "step",
    smoothing: float = 0.0,
    pool_seeds: bool = True,
    max_points: int = 2000,
) -> pd.DataFrame:
    """The curves of metric ``name`` for the runs in ``info`` (see :func:`describe_runs`).

    Each run's values are ordered by step (the last value recorded at a step wins)
    and EMA-smoothed with ``smoothing``. With ``pool_seeds``, runs of one seed group
    (more than one run) become one curve: at each step the mean over the runs that
    reached it, ``lo``/``hi`` = mean ∓ std (ddof 1) and ``n`` the number of runs;
    single runs have ``lo``/``hi`` NaN and n = 1. ``x`` is ``step`` or ``wall_time``
    (seconds; pooled: the mean wall time at that step). Returns columns
    ``SERIES_COLUMNS``, curves in :func:`method_order`, each by x, at most
    ``max_points`` points per curve.
    """
    if x not in ("step", "wall_time"):
        raise ValueError(f"x must be 'step' or 'wall_time' (got {x!r})")
    m = metrics[(metrics["name"] == name) & metrics["run_id"].isin(info["run_id"])]
    if m.empty:
        return pd.DataFrame(columns=SERIES_COLUMNS)
    m = m.sort_values("id").drop_duplicates(["run_id", "step"], keep="last").sort_values(["run_id", "step"])
    labels = trace_labels(info, pool_seeds)
    by_run = info.set_index("run_id")
    parts = []
    for run_id, rows in m.groupby("run_id", sort=True):
        parts.append(pd.DataFrame({
            "run_id": run_id, "step": rows["step"].to_numpy(), "wall_time": rows["wall_time"].to_numpy(),
            "y": ema(rows["value"].to_numpy(), smoothing),
        }))
    curves = pd.concat(parts, ignore_index=True)
    curves["trace"] = curves["run_id"].map(labels)
    curves["color_id"] = curves["run_id"].map(by_run["color_id"] if pool_seeds else pd.Series(by_run.index, index=by_run.index))
    curves["pooled"] = pool_seeds & curves["run_id"].map(by_run["group_size"]).gt(1)
    out = []
    single = curves[~curves["pooled"]]
    if len(single):
        out.append(pd.DataFrame({
            "trace": single["trace"], "color_id": single["color_id"], "x": single[x],
            "y": single["y"], "lo": np.nan, "hi": np.nan, "n": 1,
        }))
    pooled = curves[curves["pooled"]]
    if len(pooled):
        g = pooled.groupby(["trace", "color_id", "step"], sort=True)
        stats = g.agg(y=("y", "mean"), sd=("y", "std"), n=("y", "count"), wall_time=("wall_time", "mean")).reset_index()
        sd = stats["sd"].where(stats["n"] > 1)
        out.append(pd.DataFrame({
            "trace": stats["trace"], "color_id": stats["color_id"],
            "x": stats["step"] if x == "step" else stats["wall_time"],
            "y": stats["y"], "lo": stats["y"] - sd, "hi": stats["y"] + sd, "n": stats["n"],
        }))
    result = pd.concat(out, ignore_index=True)
    result["order"] = result["trace"].map(method_order(info, labels))
    result = result.sort_values(["order", "x"], kind="stable")
    result = pd.concat([thin(t, max_points) for _, t in result.groupby("order", sort=True)])
    result["color_id"] = result["color_id"].astype("int64")
    result["n"] = result["n"].astype("int64")
    return result[SERIES_COLUMNS].reset_index(drop=True)


def method_order(info: pd.DataFrame, labels: pd.Series) -> dict[str, int]:
    """Position of each trace label in legends and tables: by setup, exact first,
    then estimator, rank, λ, and the first run id."""
    rows = info.assign(label=info["run_id"].map(labels), sketched=info["estimator"] != "exact")
    rows = rows.sort_values(["setup", "sketched", "estimator", "rank", "lam", "run_id"], na_position="first", kind="stable")
    return {label: i for i, label in enumerate(dict.fromkeys(rows["label"]))}


def layer_names(metrics: pd.DataFrame, prefix: str = "cos/") -> list[str]:
    """The per-layer suffixes of metrics named ``prefix<layer>``, sorted."""
    names = metrics["name"].drop_duplicates()
    return sorted(n[len(prefix):] for n in names if n.startswith(prefix))


# ----------------------------------------------------------------------------- metrics cache


class MetricsCache:
    """The metric rows of a chosen set of runs, kept current by reading only rows
    with ids above the largest already read (metric ids only grow, see storage).

    ``update(store, run_ids)`` returns every row of ``run_ids`` exactly once, ordered
    by id: rows of runs no longer asked for are dropped, runs newly asked for are
    read from the start, and the others from the last id read.
    """

    def __init__(self) -> None:
        self.frame = pd.DataFrame(columns=["id", "run_id", "step", "wall_time", "name", "value"])
        self.run_ids: frozenset[int] = frozenset()
        self.last_id = 0

    def update(self, store, run_ids: Iterable[int]) -> pd.DataFrame:
        wanted = list(dict.fromkeys(int(i) for i in run_ids))
        if set(self.run_ids) - set(wanted):
            self.frame = self.frame[self.frame["run_id"].isin(wanted)]
        old = [i for i in wanted if i in self.run_ids]
        added = [i for i in wanted if i not in self.run_ids]
        parts, marks = [], []
        # Two reads see the database at two moments; only ids up to the smaller of
        # their maxima are known complete, so the next read starts there and the
        # rows it reads again are dropped by id.
        if old:
            rows = store.metrics(old, after_id=self.last_id)
            parts.append(rows)
            marks.append(int(rows["id"].max()) if len(rows) else self.last_id)
        if added:
            rows = store.metrics(added)
            parts.append(rows)
            marks.append(int(rows["id"].max()) if len(rows) else self.last_id)
        fresh = [p for p in parts if len(p)]
        if fresh:
            frame = pd.concat([self.frame, *fresh], ignore_index=True) if len(self.frame) else pd.concat(fresh, ignore_index=True)
            frame = frame.drop_duplicates("id", keep="first") if len(fresh) > 1 or len(self.frame) else frame
            if added or len(fresh) > 1:
                frame = frame.sort_values("id", kind="stable")
            self.frame = frame.reset_index(drop=True)
        self.run_ids = frozenset(wanted)
        self.last_id = min(marks) if marks else self.last_id
        return self.frame


# ----------------------------------------------------------------------------- memory


MEMORY_QUANTITIES = {
    "mem_saved_bytes": "Saved for backward",
    "mem_peak_bytes": "Peak device memory",
    "mem_temp_bytes": "XLA temp of the step",
}
MEMORY_COLUMNS = ["trace", "color_id", "quantity", "mib", "baseline_mib", "ratio"]


def memory_frame(summary: pd.DataFrame, info: pd.DataFrame, pool_seeds: bool = True) -> pd.DataFrame:
    """Memory of each run (or pooled seed group, averaged) against the exact baseline
    of its config, in MiB: saved-activation bytes against ``mem_saved_bytes_exact``;
    peak and XLA temp bytes against the exact run of the same comparable config and
    seed (NaN baseline when there is none). ``ratio`` = mib / baseline_mib.
    ``summary`` is ``engine.summary.summarize``; quantities no run recorded are left out."""
    if summary.empty:
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    s = summary.merge(info[["run_id", "key", "color_id", "group"]], on="run_id")
    labels = trace_labels(info, pool_seeds)
    s["trace"] = s["run_id"].map(labels)
    if not pool_seeds:
        s["color_id"] = s["run_id"]
    exact = s[s["estimator"] == "exact"].drop_duplicates(["key", "seed"], keep="last").set_index(["key", "seed"])
    order = method_order(info, labels)
    rows = []
    for column, quantity in MEMORY_QUANTITIES.items():
        if column not in s or s[column].isna().all():
            continue
        if column == "mem_saved_bytes":
            baseline = s["mem_saved_bytes_exact"]
        else:
            baseline = pd.Series([exact[column].get((k, sd), np.nan) if column in exact else np.nan
                                  for k, sd in zip(s["key"], s["seed"])], index=s.index)
        part = pd.DataFrame({"trace": s["trace"], "color_id": s["color_id"], "run_id": s["run_id"],
                             "mib": s[column] / MIB, "baseline_mib": baseline / MIB})
        part = part.dropna(subset=["mib"])
        part = part.groupby(["trace", "color_id"], sort=False).agg(mib=("mib", "mean"), baseline_mib=("baseline_mib", "mean")).reset_index()
        part["quantity"] = quantity
        rows.append(part.sort_values("trace", key=lambda t: t.map(order), kind="stable"))
    if not rows:
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    out = pd.concat(rows, ignore_index=True)
    out["ratio"] = out["mib"] / out["baseline_mib"]
    out["color_id"] = out["color_id"].astype("int64")
    return out[MEMORY_COLUMNS]


BREAKDOWN_PREFIX = "mem_bytes/"
BREAKDOWN_EXACT_PREFIX = "mem_bytes_exact/"
BREAKDOWN_COLUMNS = ["bar", "color_id", "category", "mib"]


def breakdown_frame(metrics: pd.DataFrame, info: pd.DataFrame, pool_seeds: bool = True) -> pd.DataFrame:
    """Saved-for-backward bytes by category (``mem_bytes/<category>``) for every run
    that recorded them, each followed by its exact baseline
    (``mem_bytes_exact/<category>``, bar ``<label> · exact``), in MiB; the last value of
    each metric. Empty (columns ``BREAKDOWN_COLUMNS``) when no run has a breakdown."""
    m = metrics[metrics["name"].str.startswith((BREAKDOWN_PREFIX, BREAKDOWN_EXACT_PREFIX)) & metrics["run_id"].isin(info["run_id"])]
    if m.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    last = m.sort_values("id").drop_duplicates(["run_id", "name"], keep="last")
    labels = trace_labels(info, pool_seeds)
    colors = info.set_index("run_id")["color_id"] if pool_seeds else pd.Series(info["run_id"].values, index=info["run_id"])
    exact = last["name"].str.startswith(BREAKDOWN_EXACT_PREFIX)
    frame = pd.DataFrame({
        "run_id": last["run_id"].to_numpy(),
        "bar": [labels[r] + (" · exact" if e else "") for r, e in zip(last["run_id"], exact)],
        "color_id": last["run_id"].map(colors).to_numpy(),
        "category": [n.split("/", 1)[1] for n in last["name"]],
        "exact": exact.to_numpy(),
        "mib": last["value"].to_numpy() / MIB,
        "order": last["run_id"].map(labels).map(method_order(info, labels)).to_numpy(),
    })
    frame = frame.groupby(["bar", "color_id", "category", "exact"], sort=False).agg(mib=("mib", "mean"), order=("order", "min")).reset_index()
    frame = frame.sort_values(["order", "exact"], kind="stable")
    frame["color_id"] = frame["color_id"].astype("int64")
    return frame[BREAKDOWN_COLUMNS].reset_index(drop=True)


# ----------------------------------------------------------------------------- summary table


def _mean_std(mean: float, std: float, signed: bool = False) -> str:
    """``6.616``, ``6.616 ± 0.012`` (std when finite), ``+0.044`` when ``signed``; ``—`` for NaN."""
    if mean is None or not np.isfinite(mean):
        return "—"
    text = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return f"{text} ± {std:.3f}" if std is not None and np.isfinite(std) else text


def summary_table(summary: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 3 form for the runs of ``summary`` (``summarize``), seeds
    pooled within each comparable config: method, rank, λ, seeds, step, memory
    compression (exact saved bytes / saved bytes, ``×``), final train and validation
    loss and Δ val to exact (``mean ± std`` when there are several seeds, ``—``
    when unknown), and ``paper val loss`` (the paper's Table 3, after 50,000 steps)
    when any row is of the paper preset. A ``setup`` column names the config
    differences when the runs mix setups. Ordered by setup, exact first, then rank."""
    if summary.empty:
        return pd.DataFrame()
    s = summary.merge(info[["run_id", "key", "setup"]], on="run_id")
    parts = []
    for (key, setup), sub in s.groupby(["key", "setup"], sort=False):
        t = table3(sub.drop(columns=["key", "setup"]))
        t["setup"] = setup
        parts.append(t)
    t = pd.concat(parts, ignore_index=True)
    t["_order"] = (t["estimator"] != "exact").astype(int)
    t = t.sort_values(["setup", "_order", "estimator", "rank", "lam"], kind="stable", na_position="first")
    out = pd.DataFrame({
        "setup": t["setup"],
        "method": [("exact" if e == "exact" else e) for e in t["estimator"]],
        "rank": t["rank"].astype("Int64"),
        "λ": t["lam"],
        "seeds": t["seeds"],
        "step": t["step"],
        "memory compression": [f"{c:.3f}×" if np.isfinite(c) else "—" for c in t["compression"]],
        "train loss": [_mean_std(m, sd) for m, sd in zip(t["train_loss"], t["train_loss_std"])],
        "val loss": [_mean_std(m, sd) for m, sd in zip(t["val_loss"], t["val_loss_std"])],
        "Δ val vs exact": [_mean_std(m, sd, signed=True) for m, sd in zip(t["delta_vs_exact"], t["delta_vs_exact_std"])],
        "paper val loss": [f"{p:.3f}" if np.isfinite(p) else "—" for p in t["paper_val_loss"]],
    })
    if not t["paper_val_loss"].notna().any():
        out = out.drop(columns="paper val loss")
    if (out["setup"] == "").all():
        out = out.drop(columns="setup")
    return out.reset_index(drop=True)
