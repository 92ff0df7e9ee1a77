"""The password gate: with ``BASIS_LAB_PASSWORD`` set, every page asks for it first.

The typed password is compared with ``hmac.compare_digest`` (constant time). A
correct entry unlocks this browser session only; "Lock" locks it again. Without the
variable the dashboard is open, which is what ``make run`` (bound to localhost) wants;
the Procfile's public start refuses to run without one (see README).

Guessing is slowed per client (``Throttle``): after ``FREE_TRIES`` wrong passwords in a
row a client must wait 1 s, then 2 s, 4 s … (at most ``MAX_WAIT_S``) before its next try
is even checked; a right password clears its count. Twenty guesses take over ten minutes
instead of seconds. A new tab or session of the same client does not start afresh.

The client (``identify``) is what the server can tell apart even on loopback:

- with ``BASIS_LAB_TRUSTED_PROXY=1`` (the dashboard runs behind a reverse proxy that
  appends the address it saw to ``X-Forwarded-For``), that header's last hop: the one
  address the trusted proxy wrote (the hops before it are whatever the client sent);
  never without the setting, as any client can send the header;
- else the connection's IP address, as the server sees it;
- else (Streamlit reports no address for a connection from 127.0.0.1 or ::1: ``make
  run``, or a proxy on this host that is not trusted) one shared ``LOOPBACK`` bucket for
  every such client, so fresh sessions never reset the count; behind a proxy on this
  host, set ``BASIS_LAB_TRUSTED_PROXY`` so that its clients wait each for their own.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import threading
import time
from typing import Callable

import streamlit as st

ENV_PASSWORD = "BASIS_LAB_PASSWORD"
ENV_TRUSTED_PROXY = "BASIS_LAB_TRUSTED_PROXY"  # "1" (true, yes): X-Forwarded-For's last hop names the client
LOOPBACK = "loopback"  # the one client of every connection without an address
_UNLOCKED = "gate.unlocked"
FREE_TRIES = 3  # wrong passwords in a row a client may type before it has to wait
MAX_WAIT_S = 300.0
_MAX_CLIENTS = 10_000  # entries kept before clients that may try again are forgotten


def wait_after(failures: int) -> float:
    """Seconds a client waits after ``failures`` wrong passwords in a row:
    0 below ``FREE_TRIES``, then 2^(failures − FREE_TRIES), at most ``MAX_WAIT_S``."""
    return 0.0 if failures < FREE_TRIES else min(2.0 ** (failures - FREE_TRIES), MAX_WAIT_S)


class Throttle:
    """Wrong passwords per client, for the whole server process (every session)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[int, float]] = {}  # client → (failures in a row, may try again at)

    def wait(self, client: str) -> float:
        """Seconds before ``client`` may try again (0: now)."""
        with self._lock:
            _, until = self._clients.get(client, (0, 0.0))
            return max(0.0, until - self.clock())

    def failed(self, client: str) -> None:
        with self._lock:
            now = self.clock()
            if len(self._clients) >= _MAX_CLIENTS:  # forget those free to try (their next wait restarts at 0)
                self._clients = {c: v for c, v in self._clients.items() if v[1] > now}
            failures = self._clients.get(client, (0, 0.0))[0] + 1
            self._clients[client] = (failures, now + wait_after(failures))

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._clients.pop(client, None)


THROTTLE = Throttle()


def _address(text: str | None) -> str | None:
    """``text`` as an IP address (normalised), or None when it is not one."""
    try:
        return str(ipaddress.ip_address((text or "").strip()))
    except ValueError:
        return None


def identify(forwarded: list[str], ip: str | None, trusted: bool) -> str:
    """The throttle's key of a client (the rule of the module docstring): the last hop of
    the ``X-Forwarded-For`` headers ``forwarded`` when the proxy is ``trusted`` and that
    hop is an address, else the connection's address ``ip``, else ``LOOPBACK``."""
    hops = [hop for line in forwarded for hop in line.split(",") if hop.strip()]
    last = _address(hops[-1]) if trusted and hops else None
    address = last or (_address(ip) if isinstance(ip, str) else None)
    return f"ip:{address}" if address else LOOPBACK


def client() -> str:
    """Who is typing, as ``identify`` tells from this session's connection."""
    headers = getattr(st.context, "headers", None)
    forwarded = headers.get_all("X-Forwarded-For") if headers is not None else []
    trusted = os.environ.get(ENV_TRUSTED_PROXY, "").strip().lower() in ("1", "true", "yes")
    return identify(forwarded, getattr(st.context, "ip_address", None), trusted)


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
        who = client()
        wait = THROTTLE.wait(who)
        if wait > 0:  # not even checked: a right guess now would tell a guesser it is right
            st.error(f"Too many wrong passwords: try again in {math.ceil(wait)} s.")
            return False
        if check(typed, expected):
            THROTTLE.succeeded(who)
            st.session_state[_UNLOCKED] = True
            st.rerun()
        THROTTLE.failed(who)
        wait = THROTTLE.wait(who)
        st.error("Wrong password." + (f" Try again in {math.ceil(wait)} s." if wait > 0 else ""))
    return False


def logout_button() -> None:
    if password() is not None and st.button("Lock", icon=":material/lock:", help="Ask for the password again."):
        st.session_state.pop(_UNLOCKED, None)
        st.rerun()
