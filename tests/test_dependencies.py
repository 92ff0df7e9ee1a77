"""Every package the lab's code imports is one it declares: each third-party module that
``engine``, ``storage`` or ``app`` imports (read from the source, not from what happens to be
loaded) belongs to a distribution named in pyproject.toml's ``dependencies`` or in a runtime
extra (``cuda``), never one that arrives only as a dependency of a dependency (as ``psutil``,
``jinja2`` and ``markupsafe`` once did). A module no installed distribution provides (an
extra's, such as ``pynvml``, outside its extra) cannot be mapped here and is left to the extra."""

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
OURS = ("engine", "storage", "app")
NOT_RUNTIME = ("test",)  # the extras that the lab's own code may not need


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra, listed in project.get("optional-dependencies", {}).items():
        if extra not in NOT_RUNTIME:
            requirements += listed
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _imported() -> dict[str, set[str]]:
    """Top-level third-party module → the files of ours that import it."""
    found: dict[str, set[str]] = {}
    for package in OURS:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in (*OURS, "__future__"):
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    declared, providers = _declared(), packages_distributions()
    imported = _imported()
    assert {"jax", "sqlalchemy", "streamlit", "psutil", "jinja2"} <= set(imported)  # the scan sees our imports
    undeclared = {module: sorted(files)[:3] for module, files in imported.items()
                  if providers.get(module) and not {canonicalize_name(d) for d in providers[module]} & declared}
    assert not undeclared, f"declare these in pyproject.toml's dependencies (then `make lock`): {undeclared}"
