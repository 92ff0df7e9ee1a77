"""The pages' one boundary (``app.state.guarded``): a user error is one error line on the page,
a bug keeps its traceback (Streamlit shows it)."""

import types

import pytest

from app import state
from app.text import plain
from engine.config import ConfigError
from storage import RunNotFoundError, StorageError


@pytest.fixture
def shown(monkeypatch):
    """What the guard shows with ``st.error``."""
    lines = []
    monkeypatch.setattr(state, "st", types.SimpleNamespace(error=lambda text, icon=None: lines.append(text)))
    return lines


@pytest.mark.parametrize("error, line", [
    (StorageError("no database at /x; check the path"), "Database error: no database at /x; check the path"),
    (RunNotFoundError("no run with id or name 'x'"), "Database error: no run with id or name 'x'"),
    (ConfigError("lam must be in [0, 1) (got 2)\nmore detail"), "lam must be in [0, 1) (got 2)"),
])
def test_a_user_error_is_one_line_on_the_page(shown, error, line):
    def view():
        raise error

    assert state.guarded(view)() is None
    assert shown == [plain(line)]  # escaped as Markdown, one line


@pytest.mark.parametrize("bug", [ValueError("a bug"), KeyError("a bug"), AttributeError("a bug")])
def test_a_bug_is_not_hidden_by_the_guard(shown, bug):
    def view():
        raise bug

    with pytest.raises(type(bug)):
        state.guarded(view)()
    assert shown == []


def test_the_guarded_view_returns_its_value(shown):
    assert state.guarded(lambda a, b=0: a + b)(1, b=2) == 3 and shown == []
