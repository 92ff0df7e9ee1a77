"""Keep every test away from the user's database and token cache; a throwaway PostgreSQL.

``db_url`` is the one parametrised database fixture (``sqlite`` and ``postgresql``): a new
database at the newest schema, copied from a template migrated once per process
(``tests.support.templates``); ``empty_db_url`` one with no schema yet, for the migrations'
tests; ``store`` a :class:`storage.RunStore` on ``db_url``.  The PostgreSQL cluster is started once per
session with ``initdb``/``pg_ctl`` in a temporary directory (Unix socket there, no TCP, a
random port number, ``fsync=off``), as an unprivileged user when the suite runs as root,
and each test gets a fresh database.  Where the server is not installed
(``scripts/install_postgres.sh``) or does not start, the PostgreSQL cases skip with the reason.

Two persistent compilation caches serve the whole session, in one temporary folder. Every
``python -m engine`` a test starts inherits ``BASIS_LAB_COMPILE_CACHE`` (the setting a user
has) naming ``runs/`` there, and enables the lab's own bounded cache
(``engine.training.compile_cache``) as a user's process does. pytest's own processes (and the
children that copy their settings: ``tests.support.xla.twin_env``) write ``pytest/``, which
``PYTEST_CACHE`` names, without a bound: with one, JAX lists and reads the size of every entry
at each write (jax/_src/lru_cache.py), and they write thousands of small programs. The two
never share a folder, since a bounded JAX cache expects every entry to have the access-time
file that only a bounded writer makes (it warns on each write where one is missing). The suite
trains the same tiny configurations many times, each ``train`` jitting fresh step
functions, and compiling them dominated its time; a cached executable is the one XLA
compiled, memory analysis included. Nothing else of the suite's settings reaches those
processes: they compile with a user's defaults. pytest's own processes compile with JAX's
public ``jax_disable_most_optimizations`` (``tests.support.xla`` says why) and run their
garbage collector less often (``tests.support.collector``).
"""

import os
import shutil
import tempfile

import pytest

from engine.training import compile_cache
from tests.support import collector, xla
from tests.support.postgres import ThrowawayPostgres
from tests.support.templates import PostgresTemplate, SqliteTemplate

pytest_plugins = ["tests.cpu_time"]


_UNBOUNDED = {"jax_persistent_cache_min_compile_time_secs": 0, "jax_persistent_cache_min_entry_size_bytes": 0}
PYTEST_CACHE = "BASIS_LAB_TEST_PYTEST_CACHE"  # the folder of pytest's own processes' cache (module docstring)


def pytest_configure(config):
    """Name the session's compilation cache (unless the caller named one: pytest-xdist's
    workers inherit their controller's), removed at the end by whoever made it; point this
    process at it and compile bound (``tests.support.xla``)."""
    import jax

    if PYTEST_CACHE not in os.environ:
        path = tempfile.mkdtemp(prefix="basis-lab-xla-cache-")
        os.environ.setdefault(compile_cache.ENV, os.path.join(path, "runs"))
        os.environ[PYTEST_CACHE] = os.path.join(path, "pytest")
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    if compile_cache.cache_dir() is not None:
        folder = os.environ[PYTEST_CACHE]
        os.makedirs(folder, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", folder)
        for name, value in _UNBOUNDED.items():
            jax.config.update(name, value)
    xla.compile_bound()
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
