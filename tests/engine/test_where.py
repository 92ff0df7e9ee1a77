"""Run filters (``engine.analysis.where``): the parser's precedence, each operator and its
errors; ``--where`` on list, export and summary end to end; and ``engine.api.Lab``."""

import dataclasses

import pandas as pd
import pytest

from engine.analysis import where as w
from engine.api import Lab
from engine.cli import main as cli
from engine.reads.queries import run_table3, runs_where
from storage import RunStore
from tests.support.runs import TINY, InSweep, fake_run

# ----------------------------------------------------------------------------- parser


def test_precedence_not_binds_tighter_than_and_than_or():
    tree = w.parse("a == 1 or b == 2 and not c == 3")
    assert tree == w.BoolOp("or", (w.Compare("a", "==", 1.0),
                                   w.BoolOp("and", (w.Compare("b", "==", 2.0), w.Not(w.Compare("c", "==", 3.0))))))
    grouped = w.parse("(a == 1 or b == 2) and c == 3")
    assert grouped.op == "and" and grouped.parts[0].op == "or"
    assert w.parse("NOT a = x AND b In [1, 'two', \"th ree\"]") == w.BoolOp(
        "and", (w.Not(w.Compare("a", "==", "x")), w.Compare("b", "in", (1.0, "two", "th ree"))))
    assert w.parse("x not in [1]") == w.Not(w.Compare("x", "in", (1.0,)))
    assert w.parse("cos/head >= -1e-3") == w.Compare("cos/head", ">=", -0.001)
    assert w.parse("sweep == 20261122-101500-3fa9c1").value == "20261122-101500-3fa9c1"  # not a number
    assert w.parse("done == true or x == none").parts[1].value is None
    assert w.fields_of(w.parse("a > 1 and (b < 2 or a < 3)")) == ["a", "b"]


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("rank >", "expected a value at character 7"),
    ("rank 8", "expected an operator after 'rank'"),
    ("(rank > 1", "expected ')'"),
    ("rank > 1 rank", "expected 'and', 'or' or ')'"),
    ("rank in 1", "expected '[' after 'in'"),
    ("rank in [1, 2", "expected ',' or ']'"),
    ("name == 'abc", "unclosed quote at character 9"),
    ("rank ~ 1", "cannot read '~ 1' at character 6"),
    ("and rank > 1", "expected a field name"),
    ("8 > rank", "expected a field name"),
])
def test_bad_syntax_is_one_line_naming_where(text, says):
    with pytest.raises(w.WhereError) as e:
        w.parse(text)
    message = str(e.value)
    assert "\n" not in message
    assert says.replace(" at character 7", "") in message
    if "character" in says:
        assert says.split(" at ")[-1] in message


DEEP = "(" * 400 + "rank == 8" + ")" * 400  # each would cost Python frames: a RecursionError before the limits
NOTS = "not " * 1000 + "rank == 8"
LONG = " or ".join(["rank == 8"] * 1000)


@pytest.mark.parametrize("text, says", [
    (DEEP, f"nests 'not' and parentheses more than {w.MAX_DEPTH} deep (at character {w.MAX_DEPTH + 1}); the most is"),
    (NOTS, f"nests 'not' and parentheses more than {w.MAX_DEPTH} deep"),
    (LONG, f"the filter is {len(LONG):,} characters long; the most is {w.MAX_LENGTH:,}: shorten it"),
])
def test_a_filter_deeper_or_longer_than_the_limits_is_one_line_naming_the_limit(text, says):
    with pytest.raises(w.WhereError) as e:
        w.parse(text)
    assert says in str(e.value) and "\n" not in str(e.value)
    at_limit = "(" * w.MAX_DEPTH + "rank == 8" + ")" * w.MAX_DEPTH
    assert w.parse(at_limit) == w.Compare("rank", "==", 8.0)  # the limit itself is fine
    assert w.parse("not " * w.MAX_DEPTH + "rank == 8") is not None
    assert len(w.parse(" or ".join(["rank == 8"] * 500)).parts) == 500  # long, flat and within the length


FRAME = pd.DataFrame({
    "id": [1, 2, 3, 4],
    "name": ["exact s0", "basis R=8 s0", "basis R=32 s1", "Basis R=8 λ"],
    "rank": pd.array([None, 8, 32, 8], dtype="Int64"),
    "lam": [0.0, 0.0, 0.0, 0.25],
    "tags": [["pilot"], ["pilot", "x"], [], ["ablation"]],
    "val_loss": [6.6, 6.4, float("nan"), 6.9],
    "created_at": pd.to_datetime(["2026-11-20 00:00", "2026-11-24 00:00", "2026-11-25 10:00", "2026-11-25 12:00"], utc=True),
})


def ids(text):
    return FRAME.loc[w.evaluate(text, FRAME), "id"].tolist()


@pytest.mark.parametrize("text, expected", [
    ("rank == 8", [2, 4]),
    ("rank != 8", [1, 3]),  # a missing rank is not 8
    ("rank < 32", [2, 4]),
    ("rank <= 32", [2, 3, 4]),
    ("rank > 8", [3]),
    ("rank >= 8", [2, 3, 4]),  # the exact run has no rank: no ordering holds
    ("val_loss < 6.5", [2]),  # NaN matches no ordering
    ("rank == none", [1]),
    ("rank != none", [2, 3, 4]),
    ("tags contains pilot", [1, 2]),  # an element of a list, exactly
    ("tags contains pil", []),
    ("name contains basis", [2, 3, 4]),  # a substring, case-insensitive
    ("name == 'basis R=8 s0'", [2]),
    ("name in ['exact s0', \"Basis R=8 λ\"]", [1, 4]),
    ("rank in [8, 32]", [2, 3, 4]),
    ("rank not in [8]", [1, 3]),
    ("created_at >= 2026-11-25", [3, 4]),
    ("created_at < '2026-11-25 11:00'", [1, 2, 3]),
    ("rank >= 8 and lam == 0 and val_loss < 6.5 and tags contains pilot", [2]),
    ("rank == 32 or lam > 0 and tags contains ablation", [3, 4]),
    ("(rank == 32 or lam > 0) and tags contains ablation", [4]),
    ("not rank == 8 and not tags contains pilot", [3]),
    ("not (rank == 8 or lam == 0)", []),
])
def test_each_operator_on_a_frame(text, expected):
    assert ids(text) == expected


def test_unknown_field_and_mistyped_comparison_name_the_fix():
    with pytest.raises(w.WhereError, match=r"unknown field 'val_los'; did you mean val_loss\?"):
        ids("val_los < 6")
    with pytest.raises(w.WhereError, match="name holds text, not numbers; compare it with == or contains"):
        ids("name > 3")
    with pytest.raises(w.WhereError, match="rank holds numbers; compare it with a number"):
        ids("rank > abc")
    with pytest.raises(w.WhereError, match="not a date"):
        ids("created_at > yesterday")
    # a field known elsewhere (a metric of other runs) is missing on every row
    assert FRAME.loc[w.evaluate("tokens_per_s > 1", FRAME, known=["tokens_per_s"]), "id"].tolist() == []


# ----------------------------------------------------------------------------- on a store


@pytest.fixture
def lab_store(tmp_path, monkeypatch):
    """Exact and basis R=8 and R=32 runs of two seeds in a pilot sweep (val loss falling
    towards 6.0 + the rank's share), one R=8 λ=0.25 run tagged ablation, one failed run."""
    store = RunStore(f"sqlite:///{tmp_path / 'w.db'}")
    pilot = InSweep(store, "20261125-100000-aaaaaa", ["pilot"])
    for seed in (0, 1):
        fake_run(pilot, dataclasses.replace(TINY, estimator="exact", seed=seed), final=6.0)
        fake_run(pilot, dataclasses.replace(TINY, rank=8, lam=0.0, seed=seed), final=6.2)
        fake_run(pilot, dataclasses.replace(TINY, rank=32, lam=0.0, seed=seed), final=6.6)
    fake_run(InSweep(store, "20261125-110000-bbbbbb", ["ablation"]), dataclasses.replace(TINY, rank=8, lam=0.25, lr=0.05),
             final=7.0)
    fake_run(store, dataclasses.replace(TINY, rank=1), status="failed", steps_done=5, error="NaN loss")
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    yield store
    store.close()


def test_runs_where_reads_run_config_and_final_metric_fields(lab_store):
    frame = runs_where(lab_store, "rank >= 8 and lam == 0 and val_loss < 6.5 and tags contains pilot")
    assert frame["name"].tolist() == ["basis R=8 s0", "basis R=8 s1"]
    # the final val loss is the last one written: 6.2 + 4.8·e^-4 + 0.01·seed at step 40
    final = lab_store.metrics(frame["id"].tolist(), names=["val_loss"]).groupby("run_id")["value"].last()
    assert frame["val_loss"].tolist() == final.tolist()
    assert runs_where(lab_store, "lr == 0.05")["id"].tolist() == [7]  # a config field
    assert runs_where(lab_store, "status == failed or estimator == exact")["id"].tolist() == [1, 4, 8]
    assert runs_where(lab_store, "cos/head > 0.6")["id"].tolist() == [2, 3, 5, 6, 7]  # probes: sketched runs only
    with pytest.raises(w.WhereError, match="did you mean cos/head"):
        runs_where(lab_store, "cos/haed > 0")


def test_final_metrics_are_the_latest_step_of_each_name(store):  # SQLite and PostgreSQL
    run = fake_run(store, TINY)
    other = fake_run(store, dataclasses.replace(TINY, seed=1), final=7.0)
    store.metrics.add_metrics(run, [(40, 9.0, "val_loss", 1.5)])  # (run, name, step) is unique: ignored
    store.metrics.add_metrics(run, [(41, 9.5, "val_loss", 1.25)])  # the latest step wins
    finals = store.metrics.final_metrics([run], names=["val_loss", "train_loss"])
    history = store.metrics([run], names=["train_loss"])
    assert finals["name"].tolist() == ["train_loss", "val_loss"]
    assert finals["value"].tolist() == [history.sort_values(["step", "id"])["value"].iloc[-1], 1.25]
    assert finals["step"].tolist() == [40, 41]
    every = store.metrics.final_metrics()
    assert set(every["run_id"]) == {run, other} and not every.duplicated(["run_id", "name"]).any()
    assert "cos_mean" in store.metrics.metric_names() and store.metrics.final_metrics([]).empty


def test_cli_list_export_and_summary_take_where(lab_store, tmp_path, capsys):
    assert cli.main(["list", "--where", "tags contains pilot and rank == 8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:]] == ["5", "2"]  # newest first

    csv = tmp_path / "pilot.csv"
    assert cli.main(["export", "--out", str(csv), "--where", "estimator == exact"]) == 0
    exported = pd.read_csv(csv)
    assert sorted(exported["run_id"].unique()) == [1, 4]
    assert cli.main(["export", "--out", str(tmp_path / "b.csv"), "--runs", "1", "2", "--where", "rank == 8"]) == 0
    assert sorted(pd.read_csv(tmp_path / "b.csv")["run_id"].unique()) == [2]  # --runs and --where: both
    capsys.readouterr()

    assert cli.main(["summary", "--format", "csv", "--where", "tags contains pilot and rank != 32"]) == 0
    table = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    expected = run_table3(lab_store, [1, 2, 4, 5])
    assert table["estimator"].tolist() == ["exact", "basis"] == expected["estimator"].tolist()
    assert table["seeds"].tolist() == [2, 2]
    assert table["delta_val_mean"].iloc[1] == pytest.approx(expected["delta_val_mean"].iloc[1])


@pytest.mark.parametrize("argv", [
    ["list", "--where", "rank >"],
    ["list", "--where", "rnak > 1"],
    ["summary", "--where", "rank == 999"],
])
def test_cli_bad_where_is_a_one_line_error_and_writes_nothing(lab_store, tmp_path, capsys, argv):
    out = tmp_path / "never.csv"
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert cli.main(["export", "--out", str(out), "--where", argv[-1]]) == 2
    assert not out.exists()
    if "rnak" in argv[-1]:
        assert "did you mean rank" in err


@pytest.mark.parametrize("where", [DEEP, NOTS, LONG])
def test_cli_refuses_a_too_deep_or_too_long_where_in_one_line(lab_store, capsys, where):
    for command in (["list"], ["summary"]):
        assert cli.main([*command, "--where", where]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: the filter ") and err.count("\n") == 1 and "the most is" in err, err


def test_a_blank_where_is_no_filter(lab_store, capsys):
    assert cli.main(["list", "--where", "   "]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:]] == [str(i) for i in range(8, 0, -1)]  # every run
    with Lab() as lab:
        assert lab.runs("  \t ")["id"].tolist() == list(range(1, 9))


# ----------------------------------------------------------------------------- the Python API


def test_lab_api_is_the_cli_over_frames(lab_store):
    with Lab() as lab:  # the CLI's database ($BASIS_LAB_DB_URL)
        runs = lab.runs()
        assert runs["id"].tolist() == list(range(1, 9))
        assert {"val_loss", "cos_mean", "tokens_per_s", "lr", "batch_size", "tags", "sweep"} <= set(runs.columns)
        pilot = lab.runs("tags contains pilot and val_loss < 6.5")
        assert pilot["id"].tolist() == [1, 2, 4, 5]

        long = lab.metrics("estimator == exact", names=["val_loss"])
        assert list(long.columns) == ["run_id", "run_name", "name", "step", "wall_time", "value"]
        assert sorted(long["run_id"].unique()) == [1, 4] and set(long["name"]) == {"val_loss"}
        assert long.groupby("run_id")["value"].last().tolist() == runs.set_index("id").loc[[1, 4], "val_loss"].tolist()
        assert long.groupby("run_id")["step"].is_monotonic_increasing.all()

        summary = lab.summary("tags contains pilot")
        expected = run_table3(lab_store, [1, 2, 3, 4, 5, 6])
        pd.testing.assert_frame_equal(summary, expected)
        assert lab.summary("rank == 999").empty
        with pytest.raises(ValueError, match="unknown field 'vall_loss'; did you mean val_loss"):
            lab.runs("vall_loss < 1")
        for deep in (DEEP, NOTS):  # the project's one-line error, not a RecursionError
            with pytest.raises(w.WhereError, match=f"more than {w.MAX_DEPTH} deep"):
                lab.runs(deep)
            with pytest.raises(w.WhereError, match=f"more than {w.MAX_DEPTH} deep"):
                lab.summary(deep)
    assert Lab(lab_store.url).runs("status == failed")["error"].tolist() == ["NaN loss"]


def test_an_empty_lab_knows_the_standard_metrics_and_config_fields(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    RunStore(url).close()
    with Lab(url) as lab:
        assert lab.runs("val_loss < 6 and lr > 0").empty  # known before any run records them
        assert lab.metrics().empty and lab.summary().empty
        with pytest.raises(w.WhereError, match="unknown field 'throughput'"):
            lab.runs("throughput > 1")



def test_lab_summary_judges_against_the_margin_it_is_given(tmp_path):
    """``Lab.summary(margin=...)`` is ``run_table3`` at that margin; a bad margin is refused."""
    import pytest

    from engine.api import Lab
    from storage import RunStore

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    RunStore(url).close()
    with Lab(url) as lab:
        assert lab.summary(margin=0.05).empty
        with pytest.raises(ValueError):
            lab.summary(margin=-1)
