"""The password gate slows guessing per client: after ``FREE_TRIES`` wrong passwords a
client waits 1 s, 2 s, 4 s … (at most ``MAX_WAIT_S``) before its next try is checked,
also from a new session of the same address; the right password clears the count."""

from types import SimpleNamespace

from streamlit.runtime import context

from app import gate
from tests.support.pages import app, button, store, url  # noqa: F401  (fixtures)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_waits_double_after_the_free_tries_up_to_the_cap():
    assert [gate.wait_after(n) for n in range(1, 7)] == [0, 0, 1, 2, 4, 8]
    assert gate.wait_after(40) == gate.MAX_WAIT_S
    clock = Clock()
    throttle = gate.Throttle(clock)
    for _ in range(gate.FREE_TRIES - 1):
        throttle.failed("a")
        assert throttle.wait("a") == 0
    throttle.failed("a")
    throttle.failed("a")
    assert throttle.wait("a") == 2 and throttle.wait("b") == 0  # per client
    clock.now += 1.5
    assert throttle.wait("a") == 0.5
    throttle.succeeded("a")
    assert throttle.wait("a") == 0


def _submit(at, typed):
    at.text_input[0].input(typed)
    button(at, "Unlock").click().run()
    return at.error[0].value if at.error else None


def test_twenty_fast_guesses_meet_a_wait_that_even_the_right_password_obeys(url, store, monkeypatch):
    monkeypatch.setenv("BASIS_LAB_PASSWORD", "correct horse")
    clock = Clock()
    monkeypatch.setattr(gate, "THROTTLE", gate.Throttle(clock))
    monkeypatch.setattr(gate, "client", lambda: "ip:203.0.113.9")  # every session below comes from one address
    at = app().run()
    said = [_submit(at, f"guess {i}") for i in range(20)]
    assert said[:2] == ["Wrong password."] * 2
    assert said[2] == "Wrong password. Try again in 1 s."
    assert set(said[3:]) == {"Too many wrong passwords: try again in 1 s."}  # not checked while waiting

    other = app().run()  # a new session of the same client: still waiting
    assert _submit(other, "correct horse") == "Too many wrong passwords: try again in 1 s."
    assert other.title[0].value == "BASIS Lab"
    clock.now += 1.0
    assert _submit(other, "guess 21") == "Wrong password. Try again in 2 s."
    clock.now += 2.0
    assert _submit(other, "correct horse") is None and other.title[0].value == "Runs"
    assert gate.THROTTLE.wait("ip:203.0.113.9") == 0


def test_fresh_sessions_without_an_address_share_one_bucket(url, store, monkeypatch):
    """Streamlit reports no address for a client on 127.0.0.1: every such session is one
    client, so opening new sessions resets nothing."""
    monkeypatch.setenv("BASIS_LAB_PASSWORD", "correct horse")
    monkeypatch.delenv(gate.ENV_TRUSTED_PROXY, raising=False)
    loopback = SimpleNamespace(remote_ip="127.0.0.1", headers=[("X-Forwarded-For", "198.51.100.1")])
    monkeypatch.setattr(context, "_get_client_context", lambda: loopback)  # what Streamlit reads the client from
    clock = Clock()
    monkeypatch.setattr(gate, "THROTTLE", gate.Throttle(clock))
    said = []
    for i in range(8):  # 8 fresh sessions, 3 guesses each
        at = app().run()
        said += [_submit(at, f"guess {i}.{j}") for j in range(3)]
    assert said[:2] == ["Wrong password."] * 2 and said[2] == "Wrong password. Try again in 1 s."
    assert set(said[3:]) == {"Too many wrong passwords: try again in 1 s."}  # not checked: still waiting
    assert gate.THROTTLE.wait(gate.LOOPBACK) == 1  # the header was not trusted: no setting says so


def test_the_client_is_the_trusted_proxys_last_hop_else_the_address_else_loopback():
    assert gate.identify([], None, trusted=False) == gate.identify([], None, trusted=True) == gate.LOOPBACK
    assert gate.identify([], "203.0.113.9", trusted=False) == "ip:203.0.113.9"
    forwarded = ["198.51.100.1, 203.0.113.7", "203.0.113.9 "]  # the client's own claims, then the proxy's hop
    assert gate.identify(forwarded, None, trusted=True) == "ip:203.0.113.9"
    assert gate.identify(forwarded, "10.0.0.2", trusted=True) == "ip:203.0.113.9"
    assert gate.identify(forwarded, None, trusted=False) == gate.LOOPBACK  # anyone can send the header
    assert gate.identify(forwarded, "10.0.0.2", trusted=False) == "ip:10.0.0.2"
    assert gate.identify(["not an address"], "10.0.0.2", trusted=True) == "ip:10.0.0.2"
    assert gate.identify(["2001:DB8::1"], None, trusted=True) == "ip:2001:db8::1"  # one spelling, one bucket


def test_behind_a_trusted_proxy_each_forwarded_address_waits_for_itself(url, store, monkeypatch):
    monkeypatch.setenv("BASIS_LAB_PASSWORD", "correct horse")
    monkeypatch.setenv(gate.ENV_TRUSTED_PROXY, "1")
    monkeypatch.setattr(gate, "THROTTLE", gate.Throttle(Clock()))
    hop = {"now": "203.0.113.9"}
    proxied = lambda: SimpleNamespace(remote_ip="127.0.0.1",  # noqa: E731  (the proxy, on this host)
                                      headers=[("X-Forwarded-For", f"10.9.9.9, {hop['now']}")])
    monkeypatch.setattr(context, "_get_client_context", proxied)
    said = [_submit(app().run(), f"guess {i}") for i in range(4)]  # a fresh session each time
    assert said[2:] == ["Wrong password. Try again in 1 s.", "Too many wrong passwords: try again in 1 s."]
    hop["now"] = "198.51.100.4"  # another client behind the same proxy
    assert _submit(app().run(), "guess") == "Wrong password."
    assert gate.THROTTLE.wait("ip:203.0.113.9") == 1 and gate.THROTTLE.wait(gate.LOOPBACK) == 0
