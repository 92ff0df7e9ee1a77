"""The password gate: with ``BASIS_LAB_PASSWORD`` set, every page asks for it first.

The typed password is compared with ``hmac.compare_digest`` (constant time). A
correct entry unlocks this browser session only; "Lock" locks it again. Without the
variable the dashboard is open, which is what ``make run`` (bound to localhost) wants;
the Procfile's public start refuses to run without one (see README).
"""

from __future__ import annotations

import hmac
import os

import streamlit as st

ENV_PASSWORD = "BASIS_LAB_PASSWORD"
_UNLOCKED = "gate.unlocked"


def password() -> str | None:
    """The configured password, or None when the dashboard is open."""
    return os.environ.get(ENV_PASSWORD) or None


def check(typed: str, expected: str) -> bool:
    """Whether ``typed`` is the password, in time independent of where they differ."""
    return hmac.compare_digest(typed.encode("utf-8"), expected.encode("utf-8"))


def unlocked() -> bool:
    """True when the page may be drawn; otherwise draws the password form."""
    expected = password()
    if expected is None or st.session_state.get(_UNLOCKED):
        return True
    st.title("BASIS Lab")
    with st.form("gate"):
        typed = st.text_input("Password", type="password", help=f"Set by {ENV_PASSWORD} where the dashboard runs.")
        go = st.form_submit_button("Unlock", type="primary")
    if go:
        if check(typed, expected):
            st.session_state[_UNLOCKED] = True
            st.rerun()
        st.error("Wrong password.")
    return False


def logout_button() -> None:
    if password() is not None and st.button("Lock", icon=":material/lock:", help="Ask for the password again."):
        st.session_state.pop(_UNLOCKED, None)
        st.rerun()
