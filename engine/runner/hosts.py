"""One run on several hosts: ``jax.distributed`` from three environment variables.

When all of

- ``BASIS_LAB_COORDINATOR``: ``host:port`` of process 0 (the coordinator),
- ``BASIS_LAB_NUM_PROCESSES``: how many processes join,
- ``BASIS_LAB_PROCESS_ID``: this process's index, 0 … N − 1,

are set, ``python -m engine run`` and ``python -m engine worker`` call
``jax.distributed.initialize`` before anything else, and the devices of every process
form one mesh (``engine.training.parallel``: a run's ``devices`` is then 0, all of them).
Every process runs the same command. Process 0, the leader, is the only one that
touches the database: it creates or claims each run and writes its metrics and status.
Before it trains a run it broadcasts the run's uid, config and checkpoint directory
(``announce``); the other processes, followers, wait for that (``follow``), train the
same run in lockstep (same seed, same batches, each feeding its own devices' rows) and
write nothing but their own shards of the checkpoints, which orbax needs from every
process. Process 0's wall clock and stop requests decide when to checkpoint and when to
stop (``engine.training.parallel.agree``). When the leader is done it announces the end
and every follower exits.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from engine.errors import UserError

ENV_COORDINATOR = "BASIS_LAB_COORDINATOR"
ENV_NUM_PROCESSES = "BASIS_LAB_NUM_PROCESSES"
ENV_PROCESS_ID = "BASIS_LAB_PROCESS_ID"
ENV_NAMES = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)


class HostsError(UserError, ValueError):
    """The multi-host environment variables are incomplete or wrong; the message names the fix."""


def settings(env: Mapping[str, str] = os.environ) -> tuple[str, int, int] | None:
    """(coordinator address, process count, process id) from ``env``; None when none is set."""
    given = {name: env.get(name, "").strip() for name in ENV_NAMES}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise HostsError(f"{', '.join(missing)} not set: a run on several hosts needs all of {', '.join(ENV_NAMES)} "
                         "(or none of them for one host)")
    address = given[ENV_COORDINATOR]
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise HostsError(f"{ENV_COORDINATOR}={address!r} is not host:port; fix it, e.g. 10.0.0.1:12355")
    try:
        count, index = int(given[ENV_NUM_PROCESSES]), int(given[ENV_PROCESS_ID])
    except ValueError:
        raise HostsError(f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers (got "
                         f"{given[ENV_NUM_PROCESSES]!r}, {given[ENV_PROCESS_ID]!r})") from None
    if count < 1 or not 0 <= index < count:
        raise HostsError(f"{ENV_PROCESS_ID} must be in 0 … {ENV_NUM_PROCESSES} − 1 and {ENV_NUM_PROCESSES} ≥ 1 "
                         f"(got {index} of {count}); fix the two variables")
    return address, count, index


def initialize(env: Mapping[str, str] = os.environ) -> bool:
    """``jax.distributed.initialize`` from ``env`` when it names several hosts; whether it did."""
    found = settings(env)
    if found is None:
        return False
    import jax

    address, count, index = found
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index)
    except (RuntimeError, ValueError, OSError) as e:  # XlaRuntimeError (a RuntimeError), a bad address, the network
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise HostsError(f"process {index} of {count} could not join the coordinator at {address} ({first}): start "
                         f"the same command on every host with {ENV_PROCESS_ID} 0 … {count - 1}, and check that "
                         f"{address} is process 0's reachable address and port") from None
    return count > 1


def multi() -> bool:
    import jax

    return jax.process_count() > 1


def is_leader() -> bool:
    import jax

    return jax.process_index() == 0


def _broadcast_text(text: str | None) -> str:
    """Process 0's ``text`` on every process (others pass None)."""
    from jax.experimental import multihost_utils

    data = np.frombuffer((text or "").encode(), np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.asarray(len(data), np.int64)))
    if not is_leader():
        data = np.zeros(size, np.uint8)
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(data), np.uint8)).decode()


def announce(run: dict | None) -> None:
    """Leader: tell the followers the next run to train (``uid``, ``config``,
    ``checkpoints``: the run's checkpoint directory, ``borrowed``: the directories it only
    reads (``engine.runner.paths.RunFolders``), ``keep``, ``epoch``: the lease
    whose folder the leader saves into, ``recorded``: the newest checkpoint step the
    database records, which bounds a resume), or None: stop."""
    if multi():
        _broadcast_text(json.dumps(run))


def receive() -> dict | None:
    """Follower: the run the leader announced next (None: stop)."""
    return json.loads(_broadcast_text(None))


def follow() -> int:
    """Follower: train every run the leader announces, in lockstep with it, writing no
    database; return 0 when the leader announces the end."""
    from engine.config import ConfigError, RunConfig
    from engine.runner.paths import resume_limit
    from engine.training.checkpoints import CheckpointError, RunCheckpoints
    from engine.training.loop import TrainingDiverged, train

    while (run := receive()) is not None:
        config = RunConfig.from_dict(run["config"])
        try:
            with RunCheckpoints(Path(run["checkpoints"]), keep=run["keep"], epoch=run.get("epoch"),
                                borrowed=run.get("borrowed", ()),
                                resume_limit=resume_limit(run.get("recorded"))) as checkpoints:
                for _ in train(config, checkpoints=checkpoints, resume=True):
                    pass
        except (TrainingDiverged, ConfigError, CheckpointError) as e:  # the leader records it
            print(f"follower: run {run['uid']} ended: {e}", file=sys.stderr)
    return 0
