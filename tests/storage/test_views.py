"""Saved Compare views (revision 0005): stored by name, replaced by the same name, deleted."""

from __future__ import annotations

import pytest

from storage import StorageError


def test_saved_views_round_trip_replace_and_delete(store):
    store.views.save_view("R sweep, pooled", {"runs": "1,2,5", "pool": 1})
    store.views.save_view("tags", {"tag": "pilot"})
    assert store.views.saved_views() == {"tags": {"tag": "pilot"}, "R sweep, pooled": {"runs": "1,2,5", "pool": "1"}}
    store.views.save_view("R sweep, pooled", {"runs": "1,2"})  # the same name replaces, and is now the newest
    assert list(store.views.saved_views()) == ["R sweep, pooled", "tags"]
    assert store.views.saved_views()["R sweep, pooled"] == {"runs": "1,2"}
    with pytest.raises(ValueError, match="view name"):
        store.views.save_view("  ", {"runs": "1"})
    store.views.delete_view("tags")
    with pytest.raises(StorageError, match="no saved view"):
        store.views.delete_view("tags")
    assert list(store.views.saved_views()) == ["R sweep, pooled"]
