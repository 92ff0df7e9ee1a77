"""The package is installed (editable) into the environment: it imports from any folder,
and the `basis-lab` console script is `python -m engine`."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_imports_and_console_script_work_from_a_folder_outside_the_repo(tmp_path):
    code = "import engine, storage, app.form, engine.analysis.frames; print(engine.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve().parent == (ROOT / "engine").resolve()
    script = Path(sys.executable).with_name("basis-lab")
    assert script.exists(), "the basis-lab console script is not installed"
    help_ = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    module = subprocess.run([sys.executable, "-m", "engine", "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert help_.returncode == module.returncode == 0 and help_.stdout == module.stdout
    assert "resume" in help_.stdout and "worker" in help_.stdout


def test_no_module_edits_sys_path():
    offenders = [p for p in [*ROOT.glob("app/**/*.py"), *ROOT.glob("engine/**/*.py"), *ROOT.glob("bench/*.py")]
                 if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()]
    assert offenders == []
