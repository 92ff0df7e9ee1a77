"""``engine.api.Lab``'s reads: runs, metrics, Table 3 and tuning campaigns as pandas frames,
through the functions the CLI reads with (``engine.reads.queries``). Reading never writes."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import pandas as pd

from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.core.stats import check_margin
from engine.reads.queries import run_table3, runs_where, where_ids
from storage import RunStore
from storage.outputs import OutputExistsError
from storage.store import empty_metrics_frame


class Reads:
    """The read methods of ``engine.api.Lab``, on its ``store``. A bad filter raises
    ``engine.analysis.where.WhereError`` (a ``ValueError``) naming the fix."""

    store: RunStore

    def runs(self, where: Optional[str] = None) -> pd.DataFrame:
        """One row per run the filter matches (None: every run), by id: the run fields
        (``id``, ``name``, ``status``, ``estimator``, ``rank``, ``lam``, ``seed``, ``preset``,
        ``steps``, ``steps_done``, ``sweep``, ``tags``, …), every config field
        (``lr``, ``batch_size``, ``dataset_options.source``, …) and, per metric, its latest
        (final) value in a column named as the metric (``val_loss``, ``cos/head``, …).

        >>> Lab().runs("rank >= 8 and lam == 0 and tags contains pilot")[["id", "name", "val_loss"]]  # doctest: +SKIP
        """
        return runs_where(self.store, where, metrics="all")

    def metrics(self, where: Optional[str] = None, names: Optional[Sequence[str]] = None) -> pd.DataFrame:
        """Every recorded value of the matched runs, long: one row per value with
        ``run_id``, ``run_name``, ``name``, ``step``, ``wall_time``, ``value``,
        ordered by run, metric and step. ``names``: only these metrics (None: all).
        The whole table in memory, built from :meth:`metrics_chunks`; for many runs,
        iterate that instead.

        >>> Lab().metrics("estimator == exact", names=["val_loss"]).groupby("run_id")["value"].min()  # doctest: +SKIP
        """
        empty, *parts = self._metric_frames(where, names, None)
        return pd.concat(parts, ignore_index=True) if parts else empty

    def metrics_chunks(self, where: Optional[str] = None, names: Optional[Sequence[str]] = None,
                       rows: Optional[int] = None) -> Iterator[pd.DataFrame]:
        """:meth:`metrics` in frames of whole runs, about ``rows`` rows each (default
        ``storage.stream.CHUNK_ROWS``; a run with more is one frame of its own), by run id:
        memory is bounded by the chunk, not by the table. Same columns and order:
        ``pd.concat(list(lab.metrics_chunks(w, n)), ignore_index=True)`` is ``lab.metrics(w, n)``.
        The rows are read in one snapshot, as the frames are taken.

        >>> for part in Lab().metrics_chunks(names=["val_loss"]):  # doctest: +SKIP
        ...     best = part.groupby("run_id")["value"].min()
        """
        frames = self._metric_frames(where, names, rows)
        next(frames)  # the empty frame of columns
        return frames

    def _metric_frames(self, where: Optional[str], names: Optional[Sequence[str]],
                       rows: Optional[int]) -> Iterator[pd.DataFrame]:
        """A frame of no rows (the columns), then the chunks of :meth:`metrics_chunks`."""
        ids = where_ids(self.store, where)
        records = self.store.runs.list_runs()
        ids = [r.id for r in records] if ids is None else ids
        wanted = set(ids)
        run_names = {r.id: r.name for r in records if r.id in wanted}
        names = [names] if isinstance(names, str) else (None if names is None else list(names))

        def shaped(frame: pd.DataFrame) -> pd.DataFrame:
            frame = frame.assign(run_name=frame["run_id"].map(run_names))
            frame = frame.sort_values(["run_id", "name", "step", "id"], kind="stable").reset_index(drop=True)
            return frame[["run_id", "run_name", "name", "step", "wall_time", "value"]]

        yield shaped(empty_metrics_frame())
        for chunk in self.store.metrics.chunks(ids, names=names, size=rows, whole_runs=True):
            yield shaped(chunk)

    def summary(self, where: Optional[str] = None, at_step: Optional[int] = None,
                margin: float = MARGIN, adjust: bool = True) -> pd.DataFrame:
        """The paper's Table 3 of the matched runs, as ``python -m engine summary --where``
        computes it (``engine.analysis.summary.table3``): one row per method of each
        comparable setup, seeds paired at one step, Δ val loss vs exact with a 95 %
        t-interval, its 90 % interval and TOST against ±``margin`` nats, and its verdict
        (``engine.core.stats.VERDICT_RULE``), Holm-adjusted over the table unless not ``adjust``;
        its ``read`` column says at which step each setup was read and why. ``at_step``: read every
        run at this step (default: per setup, the latest step all its live runs reached).

        >>> Lab().summary("tags contains reproduce")[["estimator", "rank", "val_loss_mean", "verdict"]]  # doctest: +SKIP
        """
        if at_step is not None and at_step < 0:
            raise ValueError(f"at_step must be >= 0 (got {at_step})")
        return run_table3(self.store, where_ids(self.store, where), at_step=at_step, margin=check_margin(margin),
                          adjust=bool(adjust))

    # ------------------------------------------------------------------ tuning campaigns

    def campaigns(self) -> pd.DataFrame:
        """One row per tuning campaign (``python -m engine tune``), oldest first: ``id``, ``name``,
        ``stage`` (tuning, evaluating), ``fields`` (what is tuned), ``trials`` per method, the
        ``tune_seeds`` and ``eval_seeds``, ``budget_steps`` per method and the two sweeps."""
        from engine.reads import campaigns

        rows = []
        for c in self.store.campaigns.list():
            spec = campaigns.spec_of(c)
            rows.append({"id": c.id, "name": c.name, "stage": c.stage, "fields": ", ".join(r.text() for r in spec.ranges),
                         "trials": spec.trials, "tune_seeds": list(spec.tune_seeds),
                         "eval_seeds": list(spec.eval_seeds), "budget_steps": spec.budget_steps(),
                         "trials_sweep": c.tune_sweep_id, "comparison_sweep": c.eval_sweep_id, "created_at": c.created_at})
        return pd.DataFrame(rows, columns=["id", "name", "stage", "fields", "trials", "tune_seeds", "eval_seeds",
                                           "budget_steps", "trials_sweep", "comparison_sweep", "created_at"])

    def trials(self, campaign: int) -> pd.DataFrame:
        """Every trial of campaign ``campaign``, one row per run: ``run_id``, ``method``, ``trial``
        (index of its point), ``seed``, ``status``, ``steps_done``, ``val_loss`` at the last step
        (NaN until then, +inf diverged), ``diverged`` and a column per tuned field (``lr``, …).

        >>> Lab().trials(1).pivot_table("val_loss", "lr", "method")  # doctest: +SKIP
        """
        from engine.reads import campaigns

        return campaigns.trials(self.store, self.store.campaigns.get(campaign))

    def choices(self, campaign: int) -> pd.DataFrame:
        """Per method of campaign ``campaign``, the value chosen from its trials
        (``engine.analysis.tuning.choose``): ``method``, ``chosen`` ({field: value}, {} while no trial
        has finished on every tuning seed), one ``chosen_<field>`` column per tuned field, the
        chosen ``trial``, its mean ``val_loss`` over the tuning seeds, ``edge`` (a field chosen at
        the smallest or largest value tried: widen the range), ``budget_steps`` and ``spent_steps``."""
        from engine.analysis import tuning
        from engine.reads import campaigns

        record = self.store.campaigns.get(campaign)
        spec = campaigns.spec_of(record)
        choices = tuning.choose(spec, campaigns.trials(self.store, record))
        for name in spec.fields:
            choices[f"chosen_{name}"] = [c.get(name, float("nan")) for c in choices["chosen"]]
        return choices

    def tuned_summary(self, campaign: int, untuned: bool = False, adjust: bool = True) -> pd.DataFrame:
        """Table 3 of campaign ``campaign``'s comparison: every method at its own chosen value
        (``untuned``: at the untuned value), paired on the evaluation seeds and read on the
        held-out test split where every run recorded it (its ``split`` column says); empty until
        the comparison is queued."""
        from engine.reads import campaigns

        record = self.store.campaigns.get(campaign)
        tables = dict(campaigns.comparison_tables(self.store, record, adjust=bool(adjust)))
        wanted = [t for title, t in tables.items() if ("untuned" in title) == bool(untuned)]
        return wanted[0] if wanted else pd.DataFrame()

    def export(self, out: str, where: Optional[str] = None, format: str = "long", force: bool = False) -> int:
        """Write the matched runs (None: every run) as ``python -m engine export`` does: ``format``
        ``long`` or ``wide`` to the CSV file ``out`` (the number of rows written), or
        ``tensorboard`` into the folder ``out``, a folder of event files per run (the number of
        runs written; ``tensorboard --logdir OUT`` shows them). An existing output is refused
        unless ``force``; a bad path or format raises a ``ValueError`` naming the fix, and
        nothing is written. Memory is bounded by a chunk of metric rows, not by the table."""
        ids = where_ids(self.store, where)
        try:
            if format == "tensorboard":
                from engine.runner.tensorboard import export_tensorboard

                return len(export_tensorboard(self.store, ids, out, force=force))
            if format not in ("long", "wide"):
                raise ValueError(f"unknown export format {format!r}; use 'long', 'wide' or 'tensorboard'")
            from engine.config import shape_columns
            from storage import export_csv

            return export_csv(self.store, out, ids, fmt=format, force=force, shape=shape_columns)
        except OutputExistsError as e:  # named as a call names it, not as the command line's --force
            raise e.spelled("force=True") from None
