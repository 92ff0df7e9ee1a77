"""The password gate slows guessing per client: after ``FREE_TRIES`` wrong passwords a
client waits 1 s, 2 s, 4 s … (at most ``MAX_WAIT_S``) before its next try is checked,
also from a new session of the same address; the right password clears the count."""

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
