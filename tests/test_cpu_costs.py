"""``tests/cpu_costs.json``, the order ``make test`` hands test files out in (``tests/cpu_time.py``),
names only test files that exist: an entry left behind by a removed or renamed file is stale."""

from tests import cpu_time


def test_every_recorded_file_exists():
    assert cpu_time.stale(cpu_time.recorded()) == [], "remove them from tests/cpu_costs.json, or `make test-costs`"


def test_an_entry_whose_file_is_gone_is_stale():
    costs = {"tests/test_cpu_costs.py": 1.0, "tests/engine/test_no_such_file.py": 2.0}
    assert cpu_time.stale(costs) == ["tests/engine/test_no_such_file.py"]
