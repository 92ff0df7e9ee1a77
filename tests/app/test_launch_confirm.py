"""The Launch page's "Reproduce the paper" asks for the same confirmation as the sweep form
and the CLI (``engine.config.needs_confirmation``): above ``LARGE_LAUNCH`` runs its button
stays disabled until the tick is ticked."""

from engine.config import LARGE_LAUNCH, reproduction_sweep
from tests.support.pages import app, page, store, url  # noqa: F401  (fixtures)

KEY = "launch.reproduce.confirm_large"


def test_reproducing_over_a_thousand_seeds_must_be_ticked_first(url, store):
    at = page(app().run(), "launch")
    at.text_input(key="launch.reproduce.seeds").input("0-999").run()
    assert not at.exception
    n = len(reproduction_sweep(seeds=range(1000)).expand())
    go = next(b for b in at.button if b.key == "reproduce.go")
    assert n > LARGE_LAUNCH and go.disabled
    [tick] = [c for c in at.checkbox if c.key == KEY]
    assert f"launch all {n:,} runs" in tick.label
    tick.check().run()
    assert not next(b for b in at.button if b.key == "reproduce.go").disabled

    small = (LARGE_LAUNCH // len(reproduction_sweep(seeds=[0]).expand()))  # seeds that stay within the threshold
    at.text_input(key="launch.reproduce.seeds").input(f"0-{small - 1}").run()
    assert not [c for c in at.checkbox if c.key == KEY]
    assert not next(b for b in at.button if b.key == "reproduce.go").disabled
    assert store.runs.list_runs() == []
