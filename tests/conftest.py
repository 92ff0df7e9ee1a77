"""Keep every test away from the user's database and token cache; a throwaway PostgreSQL.

``db_url`` is the one parametrised database fixture (``sqlite`` and ``postgresql``) and
``store`` a :class:`storage.RunStore` on it.  The PostgreSQL cluster is started once per
session with ``initdb``/``pg_ctl`` in a temporary directory (Unix socket there, no TCP, a
random port number, ``fsync=off``), as an unprivileged user when the suite runs as root,
and each test gets a fresh database.  Where the server is not installed
(``scripts/install_postgres.sh``) or does not start, the PostgreSQL cases skip with the reason.
"""

import pytest

from tests.support.postgres import ThrowawayPostgres


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("token-cache")


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
