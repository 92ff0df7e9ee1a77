"""Tables the commands print."""

from __future__ import annotations


def table_text(frame) -> str:
    """``frame`` as the commands print a table: no index, a missing cell as ``-``. A nullable
    column (an extension dtype: ``Int64``, ``string``) is filled first: pandas 3 prints its NA as
    ``<NA>`` whatever ``na_rep`` says; the others keep their own number formatting."""
    from pandas.api.types import is_extension_array_dtype

    nullable = [c for c in frame.columns if is_extension_array_dtype(frame[c].dtype)]
    if nullable:
        frame = frame.astype({c: object for c in nullable}).fillna({c: "-" for c in nullable})
    return frame.to_string(index=False, na_rep="-")


def print_summary(store, ids) -> None:
    """The final metrics of runs ``ids`` as a table (``engine.reads.queries.run_summary``),
    then the first line of each failed run's error."""
    import pandas as pd

    from engine.analysis.summary import MIB
    from engine.reads.queries import run_summary

    s = run_summary(store, ids)
    table = pd.DataFrame({
        "id": s["run_id"], "run": s["name"], "status": s["status"], "step": s["step"],
        "train": s["train_loss"].round(4), "val": s["val_loss"].round(4),
        "Δval": s["delta_val_vs_exact"].round(4), "cos": s["cos_mean"].round(3),
        "saved MiB": (s["mem_saved_bytes"] / MIB).round(2), "exact MiB": (s["mem_saved_bytes_exact"] / MIB).round(2),
        "saved/exact": s["mem_saved_ratio"].round(4), "temp MiB": (s["mem_temp_bytes"] / MIB).round(2),
        "tok/s": s["tokens_per_s"].round(0), "wall s": s["wall_s"].round(1),
    })
    print(table_text(table))
    for r in (store.runs.get_run(i) for i in ids):
        if r.status == "failed":
            print(f"run {r.id} failed: {r.error.splitlines()[0] if r.error else '?'}")
