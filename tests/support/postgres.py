"""A throwaway PostgreSQL server for the tests and benchmarks: ``initdb`` in a temporary
directory, a Unix socket there and no TCP, a random port number, ``fsync=off``, run as an
unprivileged user when the caller is root (PostgreSQL refuses root). ``skip_reason`` says
why there is none (the server is not installed: ``scripts/install_postgres.sh``)."""

import glob
import itertools
import os
import pwd
import random
import shutil
import subprocess
import tempfile

PG_USER = "basislab-test"  # unix user that runs the server when the caller is root
PG_ROLE = "basislab"  # database superuser created by initdb


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


class ThrowawayPostgres:
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
            self.start_server()
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            self.skip_reason = f"PostgreSQL test cluster did not start: {e} {detail.decode(errors='replace')[-300:]}"
            self.stop()

    def start_server(self):
        """Start the server (again) on its port and socket; returns once it accepts connections."""
        self._run([self.pg_ctl, "-D", self.data, "-l", os.path.join(self.dir, "server.log"), "-w", "-t", "60", "start"])

    def stop_server(self):
        """Stop the server as ``pg_ctl restart`` does (``-m fast``): every connection is cut,
        what was committed is kept (``-m immediate`` would lose the newest commits, as this
        cluster commits without waiting for its log), and its socket is gone until
        ``start_server``."""
        self._run([self.pg_ctl, "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop"])

    def _run(self, cmd):
        subprocess.run([*self.prefix, *cmd], check=True, capture_output=True, cwd=self.dir)

    def _admin(self):
        import psycopg

        return psycopg.connect(host=self.dir, port=self.port, user=PG_ROLE, dbname="postgres", autocommit=True)

    def new_database(self, template: str | None = None):
        """(name, URL) of a new database: empty, or a copy of database ``template``."""
        name = f"t{os.getpid()}_{next(self._names)}"
        with self._admin() as con:
            con.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
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
