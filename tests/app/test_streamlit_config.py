"""The project's Streamlit settings (``.streamlit/config.toml``) are what a server started
from the repository root runs with, as ``make run`` and the tests' servers start it."""

import subprocess
import sys

from tests.support.browser import ROOT

READ = ("from streamlit import config; config.get_config_options(force_reparse=True); "
        "print(config.get_option('browser.gatherUsageStats'), config.get_where_defined('browser.gatherUsageStats')); "
        "print(config.get_option('client.toolbarMode')); print(config.get_option('runner.postScriptGC'))")


def test_usage_statistics_are_off_when_started_from_the_repository_root():
    out = subprocess.run([sys.executable, "-c", READ], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    stats, toolbar, collect = out.stdout.strip().splitlines()
    value, where = stats.split(" ", 1)
    assert toolbar == "viewer"  # no "Deploy" (to Streamlit's cloud) in the header of an offline workbench
    assert value == "False", out.stdout
    assert collect == "False"  # no full garbage collection after every live refresh
    assert where == str(ROOT / ".streamlit" / "config.toml"), out.stdout  # the project's file, not a user's
    makefile = (ROOT / "Makefile").read_text()
    assert "run: install\n\t$(VENV)/bin/basis-lab-dashboard " in makefile  # from the root, where make runs
