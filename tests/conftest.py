"""Keep every test away from the user's database and token cache; a throwaway PostgreSQL.

``db_url`` is the one parametrised database fixture (``sqlite`` and ``postgresql``) and
``store`` a :class:`storage.RunStore` on it.  The PostgreSQL cluster is started once per
session with ``initdb``/``pg_ctl`` in a temporary directory (Unix socket there, no TCP, a
random port number, ``fsync=off``), as an unprivileged user when the suite runs as root,
and each test gets a fresh database.  Where the server is not installed
(``scripts/install_postgres.sh``) or does not start, the PostgreSQL cases skip with the reason.
"""

import glob
import itertools
import os
import pwd
import random
import shutil
import subprocess
import tempfile

import pytest

PG_USER = "basislab-test"  # unix user that runs the server when the suite runs as root
PG_ROLE = "basislab"  # database superuser created by initdb


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture(autouse=True)
def _isolated_paths(monkeypatch, tmp_path, token_cache):
    monkeypatch.setenv("BASIS_LAB_CACHE", str(token_cache))
    monkeypatch.setenv("BASIS_LAB_DB_URL", f"sqlite:///{tmp_path / 'lab.db'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _pg_bin(name):
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _server_user():
    """(prefix to run a command as the server's user, its uid) — root cannot run PostgreSQL."""
    if os.geteuid() != 0:
        return [], os.geteuid()
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
                       check=False, capture_output=True)
    try:
        uid = pwd.getpwnam(PG_USER).pw_uid
        user = PG_USER
    except KeyError:
        user, uid = "nobody", pwd.getpwnam("nobody").pw_uid
    return ["runuser", "-u", user, "--"], uid


class PgCluster:
    def __init__(self):
        self.skip_reason = None
        self.dir = None
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not (initdb and pg_ctl):
            self.skip_reason = "PostgreSQL server not installed (initdb/pg_ctl not found); run scripts/install_postgres.sh as root"
            return
        try:
            import psycopg  # noqa: F401
        except ImportError:
            self.skip_reason = 'psycopg not installed; pip install "psycopg[binary]"'
            return
        self.pg_ctl = pg_ctl
        self.prefix, uid = _server_user()
        self.dir = tempfile.mkdtemp(prefix="basislab-pg-")
        os.chown(self.dir, uid, -1)
        self.data = os.path.join(self.dir, "data")
        self.port = random.randint(20000, 60000)
        self._names = itertools.count()
        try:
            self._run([initdb, "-D", self.data, "-U", PG_ROLE, "--auth=trust", "-E", "UTF8", "--no-sync"])
            with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
                f.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{self.dir}'\nport = {self.port}\n"
                        "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n")
            self._run([pg_ctl, "-D", self.data, "-l", os.path.join(self.dir, "server.log"), "-w", "-t", "60", "start"])
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            self.skip_reason = f"PostgreSQL test cluster did not start: {e} {detail.decode(errors='replace')[-300:]}"
            self.stop()

    def _run(self, cmd):
        subprocess.run([*self.prefix, *cmd], check=True, capture_output=True, cwd=self.dir)

    def _admin(self):
        import psycopg

        return psycopg.connect(host=self.dir, port=self.port, user=PG_ROLE, dbname="postgres", autocommit=True)

    def new_database(self):
        name = f"t{os.getpid()}_{next(self._names)}"
        with self._admin() as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return name, f"postgresql+psycopg://{PG_ROLE}@/{name}?host={self.dir}&port={self.port}"

    def drop_database(self, name):
        with self._admin() as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self):
        if self.dir and os.path.isdir(os.path.join(self.dir, "data")):
            subprocess.run([*self.prefix, self.pg_ctl, "-D", self.data, "-m", "immediate", "stop"],
                           capture_output=True, cwd=self.dir)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster():
    cluster = PgCluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster):
    """URL of a fresh, empty PostgreSQL database (skips where there is no server)."""
    if pg_cluster.skip_reason:
        pytest.skip(pg_cluster.skip_reason)
    name, url = pg_cluster.new_database()
    yield url
    pg_cluster.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh database on each backend: a SQLite file in tmp_path, or a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lab.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url):
    from storage import RunStore

    s = RunStore(db_url)
    yield s
    s.close()
