"""Table 3 as text for people: ``display_frame`` (the table as strings), the notes printed
under it on every surface (``notes``: where each setup was read and on which split, how the
verdicts were read, what Δ's interval holds, duplicates, the paper's own numbers) and
``render`` (plain text, Markdown or LaTeX). Pure functions of a ``table3`` frame
(``engine.analysis.summary``, which re-exports every name here)."""

from __future__ import annotations

import pandas as pd
from tabulate import tabulate

from engine.analysis.split_read import TEST
from engine.core.choices import SUMMARY_FORMATS

MIB = 2**20

# Table 3 of the paper: final validation loss after 50,000 steps on FineWeb-edu, one run per
# method (exact: None), at the paper preset.
PAPER_TABLE3 = {None: 6.616, 64: 6.573, 32: 6.575, 16: 6.675, 8: 6.762, 1: 7.221}
PAPER_SETTING = "50,000 steps on FineWeb-edu, one run per method"
TEXT_FORMATS = tuple(f for f in SUMMARY_FORMATS if f != "csv")  # ``render``'s; CSV is an export


def paper_note(table: pd.DataFrame) -> str | None:
    """The paper's Table 3 as a labelled note, when ``table`` holds paper-preset rows
    (None otherwise): its setting, and why its numbers are not compared with the rows."""
    if table.empty or not (table["preset"] == "paper").any():
        return None
    values = "; ".join(("exact" if r is None else f"basis R={r}") + f" {v:.3f}"
                       for r, v in sorted(PAPER_TABLE3.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))
    return (f"The paper's Table 3 ({PAPER_SETTING}), final validation loss: {values}. It is not compared with the "
            "rows above: other data, another length, and no seed spread to test against.")


def duplicates_note(table: pd.DataFrame) -> str | None:
    """Which runs ``table3`` left out as duplicates (None: none), in one sentence."""
    if table.empty or "duplicates" not in table or not table["duplicates"].fillna("").astype(bool).any():
        return None
    listed = ", ".join(d for d in table["duplicates"].fillna("") if d)
    return (f"Left out as duplicates (the same setup and seed as a run that trained further, which stands for each): "
            f"runs {listed}.")


def _num(value, spec: str) -> str:
    return "—" if value is None or pd.isna(value) else format(value, spec)


def _ci90_heading(table: pd.DataFrame) -> str:
    margins = sorted({float(m) for m in table["margin"].dropna()})
    return "90% CI" + (f" vs ±{margins[0]:g}" if len(margins) == 1 else "")


def _texts(table: pd.DataFrame, column: str) -> pd.Series:
    """``column`` of ``table`` as text, "" where it is empty or missing (a report stored before it existed)."""
    if column not in table:
        return pd.Series("", index=table.index, dtype=object)
    return pd.Series(["" if pd.isna(v) else str(v) for v in table[column]], index=table.index, dtype=object)


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """``table3`` as text for people: ``mean ± std``, the interval as ``[low, high]``,
    ``—`` for what is unknown; ``setup`` (first, so a row says which setup it is) only
    when the groups differ, ``tuned`` (after λ) only when some row has free fields,
    ``split`` (after step) only when some row reads the test split. The equivalence
    interval is headed by its margin."""
    t = table
    out = pd.DataFrame({
        "setup": t["setup"],
        "method": t["estimator"],
        "rank": [_num(r, "d") for r in t["rank"]],
        "λ": ["—" if e == "exact" else _num(v, "g") for e, v in zip(t["estimator"], t["lam"])],  # exact shrinks nothing
        "seeds": t["seeds"],
        "step": [_num(v, "d") for v in t["step"]],
        "val loss": [_num(m, ".4f") + ("" if pd.isna(sd) else f" ± {sd:.4f}") for m, sd in zip(t["val_loss_mean"], t["val_loss_std"])],
        "Δ val vs exact": [_num(m, "+.4f") for m in t["delta_val_mean"]],
        "verdict": t["verdict"],
        "95% CI": ["—" if pd.isna(lo) else f"[{lo:+.4f}, {hi:+.4f}]" for lo, hi in zip(t["delta_val_ci95_low"], t["delta_val_ci95_high"])],
        _ci90_heading(t): ["—" if pd.isna(lo) else f"[{lo:+.4f}, {hi:+.4f}]"
                           for lo, hi in zip(t["delta_val_ci90_low"], t["delta_val_ci90_high"])],
        "SE seeds / val": ["—" if pd.isna(a) else f"{a:.4f} / " + ("—" if pd.isna(n) or not n else _num(b, ".4f"))
                           for a, b, n in zip(t["delta_val_se_seed"], t["delta_val_se_batch"], t["val_batches"])],
        "diverged": [v or "—" for v in t["diverged"].fillna("")] if "diverged" in t else "—",
        "Δ per seed": [v or "—" for v in t["delta_val_by_seed"]],
        "train loss": [_num(m, ".4f") + ("" if pd.isna(sd) else f" ± {sd:.4f}") for m, sd in zip(t["train_loss_mean"], t["train_loss_std"])],
        "cos": [_num(c, ".3f") for c in t["cos_mean"]],
        "saved MiB": [_num(b / MIB if pd.notna(b) else b, ".3f") for b in t["mem_saved_bytes_mean"]],
        "saved ÷ exact": [_num(r, ".4f") for r in t["mem_saved_ratio"]],
        "missing seeds": [m or "—" for m in t["missing_seeds"]],
    })
    if (t["setup"] == "").all():
        out = out.drop(columns="setup")
    if "diverged" not in t or not t["diverged"].fillna("").astype(bool).any():
        out = out.drop(columns="diverged")
    tuned, split = _texts(t, "tuned"), _texts(t, "split")
    if tuned.astype(bool).any():
        out.insert(out.columns.get_loc("λ") + 1, "tuned", [v or "—" for v in tuned])
    if (split == TEST).any():
        out.insert(out.columns.get_loc("step") + 1, "split", [v or "—" for v in split])
    loss, delta = loss_headings(split)
    return out.rename(columns={VAL_HEADINGS[0]: loss, VAL_HEADINGS[1]: delta})


VAL_HEADINGS = ("val loss", "Δ val vs exact")


def loss_headings(splits) -> tuple[str, str]:
    """The headings of the loss and Δ columns for rows that read ``splits``: ``val loss`` and
    ``Δ val vs exact`` when every row read validation, ``test loss`` and ``Δ test vs exact``
    when every row read the test split, ``loss`` and ``Δ loss vs exact`` when they differ (the
    ``split`` column then says which row read which)."""
    read = {TEST if v == TEST else "val" for v in splits}
    if read == {TEST}:
        return "test loss", "Δ test vs exact"
    return VAL_HEADINGS if read <= {"val"} else ("loss", "Δ loss vs exact")


def read_notes(table: pd.DataFrame, whole: bool | None = None) -> list[str]:
    """Where each setup of ``table3`` was read and why (``read``), one sentence a setup; with
    ``whole`` True / False, only the setups whose read is / is not whole (``read_whole``)."""
    if table.empty or "read" not in table:
        return []
    reads = table.drop_duplicates("setup")
    if whole is not None:
        reads = reads[reads["read_whole"].fillna(False).astype(bool) == whole]
    return [(f"[{setup}] " if setup else "") + text for setup, text in zip(reads["setup"], reads["read"]) if text]


def split_notes(table: pd.DataFrame) -> list[str]:
    """Which split each setup of ``table3`` was read on and why (``split_note``), one sentence a
    setup that has something to say (``engine.analysis.split_read``)."""
    if table.empty or "split_note" not in table:
        return []
    reads = table.drop_duplicates("setup")
    return [(f"[{setup}] " if setup else "") + text for setup, text in zip(reads["setup"], _texts(reads, "split_note"))
            if text]


def holm_note(table: pd.DataFrame) -> str | None:
    """How the verdicts of ``table3`` were read: over the table at a family-wise 5 % (Holm),
    or each row at its own level when some row has a test and none was adjusted."""
    tests = int(table["holm_tests"].max()) if len(table) and "holm_tests" in table else 0
    if tests:
        return (f"The verdicts hold at 5 % for the whole table: Holm's adjustment over its {tests} tests (each row's "
                "TOST, difference and non-equivalence tests), so a row whose 90 % interval lies inside ±δ can still "
                "read inconclusive; --no-adjust reads each row at its own 5 % level.")
    if len(table) and table["tost_p"].notna().sum() > 1:
        return "Each row's verdict is read at its own 5 % level (not adjusted for the table's several rows)."
    return None


def noise_note(table: pd.DataFrame) -> str | None:
    """What Δ's interval holds: seed noise and, where per-batch losses were stored, the
    validation batches' sampling error (``SE seeds / val``)."""
    tested = table[table["delta_val_se_seed"].notna()] if len(table) and "delta_val_se_seed" in table else table
    if tested.empty:
        return None
    seeds_only = tested[tested["val_batches"] == 0]
    on_test = bool((_texts(tested, "split") == TEST).any())
    evaluated = "the evaluated split's own batches (validation, or test where column 'split' says so)" if on_test \
        else "the validation set's own batches"
    text = (f"Δ's intervals hold two sources of noise, the seeds and {evaluated} (column "
            "'SE seeds / val': the two standard errors; t on Satterthwaite's degrees of freedom)")
    if len(seeds_only):
        text += (f"; rows with '—' for val have no per-batch {'' if on_test else 'validation '}losses stored (runs of "
                 "an older version): their interval holds the seed noise alone")
    return text + "."


def notes(table: pd.DataFrame) -> list[str]:
    """Every note printed under ``table3`` on every surface (summary, report, Compare)."""
    found = [*read_notes(table), *split_notes(table), holm_note(table), noise_note(table), duplicates_note(table), paper_note(table)]
    return [n for n in found if n]


def render(table: pd.DataFrame, fmt: str = "table") -> str:
    """``table3`` as text for people: ``table`` (aligned plain text), ``markdown`` or
    ``latex`` (``TEXT_FORMATS``), followed by its ``notes``."""
    if fmt not in TEXT_FORMATS:
        raise ValueError(f"unknown summary format {fmt!r}; use one of {', '.join(TEXT_FORMATS)}")
    if table.empty:
        return "no runs to summarise\n"
    shown = display_frame(table)
    said = notes(table)
    if fmt == "table":
        return shown.to_string(index=False) + "\n" + "".join(f"\nNote: {n}" for n in said) + ("\n" if said else "")
    if fmt == "markdown":
        # tabulate itself: pandas' to_markdown asks for tabulate >= 0.9
        text = tabulate(shown.astype(str).values.tolist(), headers=list(shown.columns), tablefmt="pipe",
                        disable_numparse=True) + "\n"
        return text + "".join(f"\n*Note: {n}*\n" for n in said)
    styler = shown.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    return styler.to_latex(hrules=True, column_format="l" * shown.shape[1]) + "".join(f"% Note: {n}\n" for n in said)
