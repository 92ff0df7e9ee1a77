"""CPU seconds per test, for the suite's time budget on a shared 2-core machine.

Wall-clock durations (``--durations``) swell with whatever else the machine runs; the CPU
time a test spends, in its own process and in the children it waited for
(``getrusage``), does not. Each test's report carries it as the user property ``cpu_s``;
the summary lists the ``--cpu-durations`` (default 25) dearest tests and the total, whose
half is the floor of ``make test``'s wall time on 2 workers.
"""

import resource

import pytest

_SAMPLES: dict[str, float] = {}


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=25, metavar="N",
                     help="list the N tests that used the most CPU seconds (0: none)")


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


_START = pytest.StashKey[float]()
