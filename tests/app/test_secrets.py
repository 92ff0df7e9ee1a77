"""Database passwords never reach a screen: one masking, ``storage.masked_url``, hides the
password of ``user:password@`` and of ``?password=`` (and other secret-named query
parameters), for the CLI's messages, every error and the dashboard's sidebar."""

import pytest

from engine.cli.main import main
from engine.core.text import WORD_JOINER
from storage import masked_url
from tests.support.pages import app

SECRET_URL = "postgresql+psycopg://basislab:SECRETPW@127.0.0.1:1/lab?password=SECRETQ&sslmode=disable"


@pytest.mark.parametrize("url,shown", [
    (SECRET_URL, "postgresql+psycopg://basislab:***@127.0.0.1:1/lab?password=***&sslmode=disable"),
    ("postgresql://u@h/db?sslpassword=SECRETS&application_name=lab", "postgresql://u@h/db?sslpassword=***&application_name=lab"),
    ("postgresql://u:p@ss:SECRET@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:SECRET@h:port/db?password=SECRETQ", "postgresql://u:***@h:port/db?password=***"),  # malformed
    ("sqlite:////tmp/lab.db", "sqlite:////tmp/lab.db"),
])
def test_masked_url_hides_userinfo_and_query_passwords(url, shown):
    assert masked_url(url) == shown


@pytest.mark.parametrize("url", [SECRET_URL, "postgresql+psycopg://u:SECRETPW@h:port/db?password=SECRETQ"])
def test_cli_errors_never_print_a_password(capsys, url):
    assert main(["list", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "SECRET" not in err and "***" in err


def test_the_sidebar_shows_the_database_url_masked(monkeypatch):
    monkeypatch.setenv("BASIS_LAB_DB_URL", SECRET_URL)
    at = app().run()
    shown = [t.value.replace("\\", "").replace(WORD_JOINER, "") for t in [*at.sidebar.caption, *at.error]]
    assert f"Database: {masked_url(SECRET_URL)}" in shown, shown
    assert not any("SECRET" in text for text in shown), shown
