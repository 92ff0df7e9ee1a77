"""Keep every test away from the user's database and token cache; a throwaway PostgreSQL.

``db_url`` is the one parametrised database fixture (``sqlite`` and ``postgresql``): a new
database at the newest schema, copied from a template migrated once per process
(``tests.support.templates``); ``empty_db_url`` one with no schema yet, for the migrations'
tests; ``store`` a :class:`storage.RunStore` on ``db_url``.  The PostgreSQL cluster is started once per
session with ``initdb``/``pg_ctl`` in a temporary directory (Unix socket there, no TCP, a
random port number, ``fsync=off``), as an unprivileged user when the suite runs as root,
and each test gets a fresh database.  Where the server is not installed
(``scripts/install_postgres.sh``) or does not start, the PostgreSQL cases skip with the reason.

One persistent XLA compilation cache serves the whole session: this process and every
``python -m engine`` it starts (they inherit the environment). The suite trains the same tiny
configurations many times, each ``train`` jitting fresh step functions, and compiling them
dominated its time; a cached executable is the one XLA compiled, memory analysis included.
Unless ``XLA_FLAGS`` is set, this process compiles with ``tests.support.xla.COMPILE_BOUND``
and the processes it starts with ``TRAINING`` (that module says why), and lowers its programs
into shared MLIR contexts (``tests.support.mlir_contexts``: a fresh one per program cost
``test_basis.py``, thousands of small programs, a fifth of its time), and its garbage
collector runs less often (``tests.support.collector``).
"""

import os
import shutil
import sys
import tempfile

import pytest

from tests.support import collector, mlir_contexts, xla
from tests.support.postgres import ThrowawayPostgres
from tests.support.templates import PostgresTemplate, SqliteTemplate

pytest_plugins = ["tests.cpu_time"]

_JAX_CACHE = {"jax_persistent_cache_min_compile_time_secs": 0, "jax_persistent_cache_min_entry_size_bytes": 0}


def pytest_configure(config):
    """Point JAX at a compilation cache for the session (unless one is set already), before
    any test module imports JAX; removed at the end."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        path = tempfile.mkdtemp(prefix="basis-lab-xla-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = path
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    for name, value in _JAX_CACHE.items():
        os.environ.setdefault(name.upper(), str(value))
    if "jax" in sys.modules:  # imported before us: its flags have read the environment already
        jax = sys.modules["jax"]
        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        for name, value in _JAX_CACHE.items():
            jax.config.update(name, value)
    if "XLA_FLAGS" not in os.environ:
        os.environ["XLA_FLAGS"] = xla.COMPILE_BOUND
        import jax

        jax.devices()  # this process's CPU backend starts, reading XLA_FLAGS once
        os.environ["XLA_FLAGS"] = xla.TRAINING  # what the processes it starts inherit
        xla.OWN = xla.COMPILE_BOUND
    else:  # set by the caller, or inherited: pytest-xdist's workers get the controller's TRAINING
        xla.OWN = os.environ["XLA_FLAGS"]
    mlir_contexts.share()
    collector.tune()


def pytest_collection_finish(session):
    """What collection imported lives for the whole session: out of the collector's way."""
    collector.freeze()


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory):
    """The session's token cache: one for all of pytest-xdist's workers (their base
    temporary directories share a parent), so the corpus is tokenized once, not per
    worker; the cache's file lock lets one worker build while the others wait."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "token-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(autouse=True)
def _isolated_paths(monkeypatch, tmp_path, token_cache):
    monkeypatch.setenv("BASIS_LAB_CACHE", str(token_cache))
    monkeypatch.setenv("BASIS_LAB_DB_URL", f"sqlite:///{tmp_path / 'lab.db'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def pg_cluster():
    cluster = ThrowawayPostgres()
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


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory):
    return SqliteTemplate(tmp_path_factory.mktemp("schema-template"))


@pytest.fixture(scope="session")
def pg_template(pg_cluster):
    if pg_cluster.skip_reason:
        pytest.skip(pg_cluster.skip_reason)
    return PostgresTemplate(pg_cluster)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A new database at the newest schema, with its own identity, on each backend: a SQLite
    file in tmp_path, or a PostgreSQL database (copies of a template: tests.support.templates)."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_template").copy(tmp_path / "lab.db")
        return
    template = request.getfixturevalue("pg_template")
    name, url = template.copy()
    yield url
    template.cluster.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request, tmp_path):
    """An empty database on each backend (no schema yet), for the tests of the migrations."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lab.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url):
    from storage import RunStore

    s = RunStore(db_url)
    yield s
    s.close()
