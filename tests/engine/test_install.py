"""The package is installed (editable) into the environment: it imports from any folder,
and the `basis-lab` console script is `python -m engine`; the locks it installs from pin
every package with hashes, and the runtime lock holds no test tools."""

import re
import subprocess
import sys
import tomllib
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


def _lock(name: str) -> dict[str, tuple[str, int]]:
    """``package -> (version, number of hashes)`` of a pip-compile lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = None
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("--hash=sha256:"):
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        else:
            assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+ \\", line), f"{name}: not an exact pin: {line}"
            current, version = line.removesuffix(" \\").split("==")
            pins[_canonical(current)] = (version, 0)
            current = _canonical(current)
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(spec: str) -> str:
    return _canonical(re.match(r"[A-Za-z0-9._-]+", spec).group(0))


def test_the_locks_pin_everything_with_hashes_and_keep_test_tools_out_of_the_runtime():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, test = _lock("requirements.txt"), _lock("requirements-test.txt")
    assert all(hashes > 0 for _, hashes in [*runtime.values(), *test.values()])
    declared = {_requirement_name(d) for d in project["dependencies"]}
    assert declared <= set(runtime) and {"tabulate", "filelock"} <= declared
    assert "jaxlib" not in declared and "jaxlib" in runtime  # jax brings its own jaxlib
    tools = {_requirement_name(d) for d in project["optional-dependencies"]["test"]}
    dev_tools = {"pytest", "playwright", "ruff", "import-linter", "mypy"}
    assert dev_tools <= tools <= set(test)
    assert "psycopg" in declared and "psycopg" in runtime  # PostgreSQL workers run from `make run`'s environment
    assert not dev_tools & set(runtime)  # Markdown, in the test extra, is also a runtime dependency's
    assert all(test[name][0] == version for name, (version, _) in runtime.items())  # one version of each
    cuda_extra = {_requirement_name(d) for d in project["optional-dependencies"]["cuda"]}
    assert cuda_extra == {"jax", "nvidia-ml-py"}


def test_the_cuda_lock_is_the_runtime_lock_plus_the_cuda_extra_all_hashed():
    """``make install-cuda`` installs requirements-cuda.txt with --require-hashes: every pin
    hashed, the runtime pins unchanged, JAX's CUDA plugin at the locked jax's own version."""
    runtime, cuda = _lock("requirements.txt"), _lock("requirements-cuda.txt")
    assert all(hashes > 0 for _, hashes in cuda.values())
    assert all(cuda[name][0] == version for name, (version, _) in runtime.items())
    assert {"nvidia-ml-py", "jax-cuda12-plugin", "jax-cuda12-pjrt", "nvidia-cudnn-cu12"} <= set(cuda) - set(runtime)
    assert cuda["jax-cuda12-plugin"][0] == cuda["jax-cuda12-pjrt"][0] == runtime["jax"][0]
    assert not {"pytest", "playwright", "ruff", "import-linter", "mypy"} & set(cuda)
