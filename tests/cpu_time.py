"""CPU seconds per test, for the suite's time budget on a shared 2-core machine.

Wall-clock durations (``--durations``) swell with whatever else the machine runs; the CPU
time a test spends, in its own process and in the children it waited for
(``getrusage``), does not. Each test's report carries it as the user property ``cpu_s``;
the summary lists the ``--cpu-durations`` (default 25) dearest tests and the total, whose
half is the floor of ``make test``'s wall time on a 2-core machine.

The wall time is that floor only when both cores stay busy to the end. ``pytest-xdist``
hands out whole files (``--dist loadfile``) in the order they were collected (with
``--no-loadscope-reorder``), so the files are collected longest first, by the seconds each
held its worker in a recorded run (:data:`COSTS`; wall time, which counts a test's waits as
well as its CPU): longest processing time first, the last files handed out are short ones
and the workers finish close together. ``--cpu-record`` rewrites that table from the
run it ends. A file it does not list yet counts as the median file, and the summary names
it; an entry whose file is gone is stale (``stale``), which ``tests/test_cpu_costs.py`` fails on.
"""

import json
import resource
import statistics
from pathlib import Path

import pytest

COSTS = Path(__file__).with_name("cpu_costs.json")  # test file → seconds its tests held a worker
_SAMPLES: dict[str, float] = {}
_HELD: dict[str, float] = {}
_UNRECORDED: set[str] = set()  # collected test files COSTS does not list


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=25, metavar="N",
                     help="list the N tests that used the most CPU seconds (0: none)")
    parser.addoption("--cpu-record", action="store_true",
                     help=f"write the seconds each test file held its worker to {COSTS.name}, the order the next run hands files out in")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded() -> dict[str, float]:
    """``COSTS``: test file (relative to the repository root) → seconds; empty when absent."""
    return json.loads(COSTS.read_text()) if COSTS.exists() else {}


def stale(costs: dict[str, float]) -> list[str]:
    """The entries of ``costs`` whose test file no longer exists."""
    root = COSTS.parent.parent
    return sorted(name for name in costs if not (root / name).is_file())


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope, which it keeps within a file
def pytest_collection_modifyitems(items):
    costs = recorded()
    _UNRECORDED.update(_file_of(item.nodeid) for item in items if _file_of(item.nodeid) not in costs)
    if not costs:
        return
    median = statistics.median(costs.values())
    items.sort(key=lambda item: -costs.get(_file_of(item.nodeid), median))  # stable: a file's own order holds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    item.stash[_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _START in item.stash:
        report.user_properties.append(("cpu_s", _cpu_seconds() - item.stash[_START]))


def pytest_runtest_logreport(report):
    _HELD[_file_of(report.nodeid)] = _HELD.get(_file_of(report.nodeid), 0.0) + report.duration
    for name, value in report.user_properties:
        if name == "cpu_s" and report.when == "teardown":
            _SAMPLES[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, config):
    count = config.getoption("--cpu-durations")
    if not count or not _SAMPLES:
        return
    terminalreporter.section(f"{count} dearest tests in CPU seconds (own process and waited children)")
    for nodeid, seconds in sorted(_SAMPLES.items(), key=lambda kv: -kv[1])[:count]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {nodeid}")
    total = sum(_SAMPLES.values())
    terminalreporter.write_line(f"{total:8.1f}s  in all {len(_SAMPLES)} tests ({total / 2:.0f} s on 2 busy cores)")
    if _UNRECORDED and not config.getoption("--cpu-record"):
        terminalreporter.write_line(f"{COSTS.name} has no entry for {', '.join(sorted(_UNRECORDED))}: handed out as "
                                    "the median file; `make test-costs` records them")
    if config.getoption("--cpu-record"):
        ranked = dict(sorted(((f, round(s, 1)) for f, s in _HELD.items()), key=lambda kv: -kv[1]))
        COSTS.write_text(json.dumps(ranked, indent=1) + "\n")
        terminalreporter.write_line(f"the seconds {len(ranked)} files held their workers written to {COSTS}")


_START = pytest.StashKey[float]()
