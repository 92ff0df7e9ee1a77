"""Per-key values of diagnosis rows (revision 0007): stored as sent, read back by shape,
checked against the row's keys and batches, absent (None) for rows stored without them."""

import numpy as np
import pytest

from tests.support.runs import new_run


def _row(**extra):
    return {"layer": "all", "estimator": "basis", "rank": 4, "lam": 0.0, "bias2": 0.1, "bias2_se": 0.01,
            "variance": 0.5, "mse": 0.6, "cos_mean": 0.9, "keys": 3, "batches": 2, **extra}


def test_key_values_round_trip_and_old_rows_read_none(store):
    run = new_run(store, "r")
    diag = store.diagnostics.create_diagnostic(run, 0, {})
    values = np.arange(14, dtype=float).reshape(2, 7) / 7  # 2 batches × (1 + 2·3)
    store.diagnostics.add_diagnostic_results(diag, [_row(key_values=values), _row(estimator="balanced")])
    frame = store.diagnostics.diagnostic_results(diag, key_values=True)
    np.testing.assert_array_equal(frame["key_values"][0], values)
    assert frame["key_values"][1] is None
    assert "key_values" not in store.diagnostics.diagnostic_results(diag).columns  # the plain read stays as it was


def test_key_values_that_do_not_fit_the_row_are_refused_and_nothing_is_written(store):
    run = new_run(store, "r")
    diag = store.diagnostics.create_diagnostic(run, 0, {})
    with pytest.raises(ValueError, match=r"do not fit keys 3 and batches 2: need \(batches, 1 \+ 2·keys\)"):
        store.diagnostics.add_diagnostic_results(diag, [_row(), _row(key_values=np.zeros((2, 5)))])
    assert store.diagnostics.diagnostic_results(diag).empty
