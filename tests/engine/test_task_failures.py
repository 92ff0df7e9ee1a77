"""What ends a task (``engine.errors``): the worker survives any failure of a run, and the run's
record tells a user error (one line) from an expected failure (``failed: …``) from a bug
(``bug: …``), keeping the whole traceback of the latter two."""

from __future__ import annotations

import dataclasses
import errno

import pytest

from engine.config import ConfigError, RunConfig
from engine.errors import BUG, FAILED, SharedFailure, failure_text, is_bug
from engine.runner.jobs import JobManager
from engine.training.loop import TrainingDiverged
from storage import DatabaseFullError

DEPTH = 40  # deeper than any cut a record might make (the old one kept 8 frames)
TINY = RunConfig(preset="tiny", steps=3)


def _model(depth: int):
    """A call into ``depth`` + 1 distinct functions (``f<depth>`` … ``f0``, of a file ``model.py``),
    the last raising a bug: what a model's shape error looks like from the worker."""
    source = "def f0():\n    raise TypeError(\"unsupported operand type(s) for +: 'NoneType' and 'int'\")\n"
    source += "".join(f"def f{i}():\n    f{i - 1}()\n" for i in range(1, depth + 1))
    namespace: dict = {}
    exec(compile(source, "model.py", "exec"), namespace)
    return namespace[f"f{depth}"]


def _every_frame(text: str) -> bool:
    return all(f'File "model.py", line {2 * i + 2 if i else 2}, in f{i}\n' in text for i in range(DEPTH + 1))


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:
        return e


class XlaRuntimeError(RuntimeError):
    """Stands for ``jax.errors.JaxRuntimeError``'s base by its name (``is_bug`` reads names, not jax)."""


@pytest.mark.parametrize("error, bug", [
    (TypeError("x"), True), (KeyError("x"), True), (ValueError("x"), True), (RuntimeError("x"), True),
    (AttributeError("x"), True), (XlaRuntimeError("INTERNAL: a compiler crash"), True),
    (ConfigError("lr must be > 0; pass --lr"), False), (OSError(errno.ENOSPC, "No space left"), False),
    (TrainingDiverged("loss is nan at step 5", 5), False), (DatabaseFullError("disk full"), False),
    (XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 GiB"), False),
])
def test_bugs_are_told_from_expected_failures(error, bug):
    assert is_bug(error) is bug


def test_a_real_device_out_of_memory_is_an_expected_failure_and_a_real_runtime_error_a_bug():
    """JAX's own error class, whatever its version names it: 400 TB on the CPU is refused with
    RESOURCE_EXHAUSTED, not a bug; the same class with another status is one."""
    import jax.numpy as jnp

    try:
        jnp.zeros((10**7, 10**7)).block_until_ready()
    except Exception as e:  # noqa: BLE001 - the class under test is JAX's, whatever its name
        oom = e
    else:
        pytest.fail("400 TB fitted")
    assert "RESOURCE_EXHAUSTED" in str(oom) and not is_bug(oom)
    assert is_bug(type(oom)("INTERNAL: a compiler crash"))


def test_a_shared_failure_is_a_bug_exactly_when_its_cause_is():
    for cause, bug in ((TypeError("x"), True), (OSError("x"), False)):
        try:
            try:
                raise cause
            except Exception as e:
                raise SharedFailure("the cohort that trained this run failed") from e
        except SharedFailure as shared:
            assert is_bug(shared) is bug
            assert failure_text(shared).startswith(f"{BUG if bug else FAILED}: SharedFailure")
            assert f"{type(cause).__name__}: x" in failure_text(shared)  # the cause's traceback too


def test_a_user_error_is_its_one_line_and_anything_else_keeps_every_frame():
    assert failure_text(_raised(ConfigError("lr must be > 0; pass --lr\nmore"))) == "lr must be > 0; pass --lr"
    full = failure_text(_raised(OSError(errno.ENOSPC, "No space left on device")))
    assert full.startswith("failed: OSError: [Errno 28] No space left on device\nTraceback (most recent call last):")
    try:
        _model(DEPTH)()
    except TypeError as e:
        text = failure_text(e)
    assert text.splitlines()[0] == "bug: TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'"
    assert _every_frame(text)


def test_a_bug_deep_in_a_run_is_recorded_whole_and_the_worker_trains_the_next_run(store, monkeypatch, tmp_path):
    def train(config, **hooks):
        if config.seed == 1:
            _model(DEPTH)()
        yield from ()

    monkeypatch.setattr("engine.runner.execution.train", train)
    manager = JobManager(store, checkpoints=tmp_path / "ckpt", cohorts="off")  # one worker thread
    try:
        buggy, after = manager.submit([dataclasses.replace(TINY, seed=1), dataclasses.replace(TINY, seed=2)])
        assert manager.wait([buggy, after], timeout=300)
    finally:
        manager.shutdown()
    run = store.runs.get_run(buggy)
    assert run.status == "failed"
    assert run.error.splitlines()[0] == "bug: TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'"
    assert _every_frame(run.error) and "Traceback (most recent call last):" in run.error
    assert store.runs.get_run(after).status == "finished"  # the same worker thread went on


def test_a_bug_in_a_write_ends_its_run_as_a_bug_with_its_traceback():
    """A write that raised something other than a ``StorageError`` (the writer keeps it whole)
    ends the run ``failed`` as a bug, every frame kept, not as the database refusing it."""
    from engine.runner.execution import _ended_by

    try:
        1 / 0
    except ZeroDivisionError as e:
        bug = e
    status, error, cause = _ended_by(bug, 1, None)
    assert status == "failed" and cause is None
    assert error.startswith("bug: ZeroDivisionError: division by zero") and "Traceback" in error and "1 / 0" in error
