"""Keep every test away from the user's database and token cache."""

import pytest


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture(autouse=True)
def _isolated_paths(monkeypatch, tmp_path, token_cache):
    monkeypatch.setenv("BASIS_LAB_CACHE", str(token_cache))
    monkeypatch.setenv("BASIS_LAB_DB_URL", f"sqlite:///{tmp_path / 'lab.db'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
