"""The store's structure: one ``Database`` and repositories that each receive it, and the
store's by-name methods, each exactly its repository's method of that name."""

from __future__ import annotations

import storage.store as store_module
from storage import Database, RunStore
from storage.metrics import MetricsRepository
from storage.queue import QueueRepository
from storage.runs import RunsRepository


def test_every_by_name_method_of_the_store_is_its_repositorys_method_of_that_name():
    store = RunStore("sqlite://")
    delegated = {name: via for name, via in vars(RunStore).items() if isinstance(via, store_module._Via)}
    assert len(delegated) > 50 and {"create_run", "claim_next", "add_metrics", "set_tags"} <= set(delegated)
    for name, via in delegated.items():
        bound = getattr(store, name)
        assert bound.__self__ is getattr(store, via.repository) and bound.__name__ == name, name
    assert store.metrics.read.__self__ is store.metrics  # store.metrics(ids) is the repository's read
    rid = RunStore.create_run(store, name="via the class", config={}, estimator="basis", rank=4, lam=0.0, seed=0,
                              preset="tiny", steps=10)  # as a test that wraps a method calls the original
    assert RunStore.get_run(store, rid).name == "via the class"
    store.close()


def test_repositories_work_on_a_database_they_are_handed():
    db = Database("sqlite://")
    runs, queue, metrics = RunsRepository(db), QueueRepository(db), MetricsRepository(db)
    rid = runs.create_run(name="alone", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                          steps=10, tags=[" a ", "b", "a"])
    assert runs.get_run(rid).tags == ["a", "b"]
    runs.set_tags(rid, ["c"])
    lease = queue.claim_next("h:1")
    assert lease == (rid, 1) and runs.get_run(rid).tags == ["c"]
    metrics.add_metrics(rid, [(0, 0.0, "val_loss", 2.5)], epoch=lease.epoch)
    assert metrics(rid)["value"].tolist() == [2.5] and db.dialect == "sqlite" and not db.is_postgresql
    db.close()
