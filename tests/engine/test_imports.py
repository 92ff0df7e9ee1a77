"""What loads without JAX: the run schema, ``python -m engine --help`` (and a bad flag),
the app's pure modules and the Launch page.

Each check runs in a fresh interpreter, so modules the test session already imported
do not hide an import. ``BLOCK`` puts a finder first on ``sys.meta_path`` that refuses
the JAX family, so any import of it (at module level or inside a function that runs)
fails loudly; Streamlit, pandas and the rest import as usual.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("jax", "jaxlib", "flax", "optax", "orbax")
BLOCK = textwrap.dedent(f"""
    import sys

    class _Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {FRAMEWORKS!r}:
                raise ModuleNotFoundError(f"{{name}} is blocked by the test", name=name)
            return None

    sys.meta_path.insert(0, _Refuse())
""")
LOADED = f"print('LOADED', __import__('json').dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})))"


def python(code: str, *, block: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` (after ``BLOCK`` when ``block``) in a new interpreter at the repository root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = (BLOCK if block else "import sys\n") + textwrap.dedent(code) + "\n" + LOADED
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def loaded(out: subprocess.CompletedProcess) -> list[str]:
    """The JAX-family modules the child had in ``sys.modules`` when it finished."""
    line = next(x for x in out.stdout.splitlines() if x.startswith("LOADED "))
    return json.loads(line[len("LOADED "):])


def test_the_blocker_refuses_jax():
    """The guard itself: with it, importing jax fails; without it, jax loads."""
    out = python("import jax")
    assert out.returncode != 0 and "jax is blocked by the test" in out.stderr
    out = python("import jax", block=False)
    assert out.returncode == 0, out.stderr
    assert "jax" in loaded(out)


def test_the_run_schema_imports_without_jax():
    out = python("""
        import engine.config
        from engine.config import RunConfig, Sweep
        from engine.training import inputs, timing

        config = RunConfig()
        sweep = Sweep(config, estimators=("basis",), ranks=(2, 8), lams=(0.0,), seeds=(0,), with_exact=True)
        assert len(sweep.expand()) == 3
        assert RunConfig.from_dict(config.to_dict()) == config
        assert timing.timing_key(config) == timing.timing_key(config.replace(seed=3, lr=0.5))
    """)
    assert out.returncode == 0, out.stderr
    assert loaded(out) == []


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["sweep", "--help"], ["diagnose", "--help"]])
def test_cli_help_loads_no_jax(argv):
    """``python -m engine … --help`` with JAX installed leaves none of it in ``sys.modules``."""
    out = python(f"""
        import runpy
        sys.argv = ["engine", *{argv!r}]
        try:
            runpy.run_module("engine", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            assert e.code == 0, e.code
    """, block=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m engine")
    assert loaded(out) == []


def test_cli_bad_flag_answers_without_jax():
    """A wrong flag is refused by the parser, with JAX blocked: exit 2, one line naming the field."""
    out = python("""
        from engine.cli.main import main
        try:
            main(["run", "--rank", "many"])
        except SystemExit as e:
            assert e.code == 2, e.code
        else:
            raise AssertionError("the parser accepted --rank many")
    """)
    assert out.returncode == 0, out.stderr
    assert "rank: 'many' is not an integer" in out.stderr
    assert "Traceback" not in out.stderr


def test_app_pure_modules_import_without_jax():
    out = python("""
        import app.form, app.tables, engine.analysis.charts, engine.analysis.frames

        assert app.form.to_sweep(app.form.values_of(app.form.DEFAULT_SWEEP)).expand()
    """)
    assert out.returncode == 0, out.stderr
    assert loaded(out) == []


def test_launch_page_draws_without_jax():
    """The dashboard opens on Launch and previews the default grid (count, runs, time
    estimate) with JAX blocked; the job manager, and JAX, wait for a launch."""
    out = python(f"""
        from streamlit.testing.v1 import AppTest

        at = AppTest.from_file({str(ROOT / "app" / "main.py")!r}, default_timeout=120).run()
        at.switch_page("views/launch.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert not at.error, [e.value for e in at.error]
        assert any(s.value.endswith("runs to launch") for s in at.subheader), [s.value for s in at.subheader]
        assert len(at.dataframe[0].value) > 1
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert loaded(out) == []
