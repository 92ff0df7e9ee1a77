"""The dashboard as installed: ``basis-lab-dashboard`` (``app.serve``) builds the Streamlit command
for the package's own ``app/main.py``, and a built wheel carries the app, its assets and both
console scripts."""

import configparser
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from app import serve

ROOT = Path(__file__).resolve().parents[2]


def _printed(capsys, *argv: str) -> list[str]:
    assert serve.main(["--print-command", *argv]) == 0
    return shlex.split(capsys.readouterr().out)


def test_dashboard_command_runs_streamlit_on_the_packaged_main_at_the_port(capsys, monkeypatch):
    monkeypatch.delenv("PORT", raising=False)
    cmd = _printed(capsys)
    assert cmd[:5] == [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py")]
    assert cmd[5:] == ["--server.port", "8501", "--server.address", "127.0.0.1", "--server.headless", "true",
                       "--browser.gatherUsageStats", "false",  # offline from any folder, not only the repository
                       "--client.toolbarMode", "viewer",  # and no "Deploy" to Streamlit's cloud in the header
                       "--runner.postScriptGC", "false"]  # no 130 ms collection after each live refresh
    assert _printed(capsys, "--port", "8600")[6] == "8600"
    monkeypatch.setenv("PORT", "8700")  # `make run PORT=8700` exported, or a platform's $PORT
    assert _printed(capsys)[6] == "8700"
    assert _printed(capsys, "--port", "8600")[6] == "8600"  # the flag wins over $PORT


@pytest.mark.parametrize("port", ["0", "65536", "http", "8600.5"])
def test_dashboard_refuses_a_port_out_of_range_in_one_line(port, capsys, monkeypatch):
    monkeypatch.delenv("PORT", raising=False)
    with pytest.raises(SystemExit) as exit_:
        serve.main(["--port", port, "--print-command"])
    assert exit_.value.code == 2
    err = capsys.readouterr()
    assert err.out == "" and "give an integer in 1..65535" in err.err.splitlines()[-1]


def test_the_dashboard_server_gets_the_environment_as_it_is_no_malloc_settings_of_ours(monkeypatch):
    """The server is no training process (``engine.training.allocator``): the process it becomes
    gets glibc's default malloc, the user's own GLIBC_TUNABLES kept and none of the lab's added."""
    for given in (None, "glibc.malloc.tcache_count=0"):
        calls = []
        monkeypatch.setattr(serve.os, "execv", lambda path, argv: calls.append((argv, dict(serve.os.environ))))
        if given is None:
            monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
        else:
            monkeypatch.setenv("GLIBC_TUNABLES", given)
        serve.main(["--port", "8600"])
        (argv, env), = calls
        assert argv[1:4] == ["-m", "streamlit", "run"] and "8600" in argv
        assert env.get("GLIBC_TUNABLES") == given


def test_dashboard_help_starts_no_server_and_loads_no_streamlit(tmp_path):
    code = "import sys; from app import serve; serve.main(['--help'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "--port" in out.stdout and "basis-lab-dashboard" in out.stdout
    check = "import sys, app.serve; print('streamlit' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert loaded.stdout.strip() == "False", loaded.stderr


def test_wheel_carries_the_app_its_assets_and_both_console_scripts(tmp_path):
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("engine", "storage", "app"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                            str(src)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("basis_lab-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = configparser.ConfigParser()
        scripts.read_string(z.read(entry_points).decode())
        z.extractall(tmp_path / "site")
    assert {"app/__init__.py", "app/views/__init__.py", "app/main.py", "app/serve.py", "app/icon.png",
            "app/chart.js", "app/views/runs.py"} <= names
    assert dict(scripts["console_scripts"]) == {"basis-lab": "engine.cli.main:main_exit",
                                                "basis-lab-dashboard": "app.serve:main"}
    # installed (unpacked) elsewhere, the command serves that copy's main.py, beside its icon
    code = "from app import serve; serve.main(['--print-command'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    main = Path(shlex.split(out.stdout)[4])
    assert main == (tmp_path / "site" / "app" / "main.py").resolve() and main.with_name("icon.png").is_file()
