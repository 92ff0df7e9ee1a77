"""A throwaway one-node Slurm for the tests: a munge daemon with its own key and socket,
``slurmctld`` and ``slurmd`` from a ``slurm.conf`` generated in a temporary directory (free
ports, state and spool there, ``proctrack/linuxproc``, ``task/none``, ``select/cons_tres``
by CPU, jobs and daemons as the caller: root in the suite). The node's CPUs and memory are
the machine's. Nothing of the system's Slurm or munge is used or started.

``skip_reason`` says why there is none (the binaries are missing: ``scripts/install_slurm.sh``;
or the daemons did not bring the node up). ``env`` is what a client (``sbatch``, ``squeue``,
``engine workers --slurm``) needs: ``SLURM_CONF``. ``stop()`` ends every daemon and job.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PARTITION = "basis"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol", "srun")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)),
                                      None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


def slurm_conf(folder: Path, node: str, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    """The whole ``slurm.conf`` of the one-node cluster in ``folder``."""
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    return "\n".join([
        "ClusterName=basislab",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)", "MailProg=/bin/true",
        f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
        f"SlurmUser={user}", f"SlurmdUser={user}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=2",
        "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "ReturnToService=2", "SlurmdTimeout=30", "KillWait=20", "MinJobAge=600",
        "JobRequeue=1", "SlurmdParameters=config_overrides",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory={_memory_mb()} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        "",
    ])


class ThrowawaySlurm:
    """Starts munge, slurmctld and slurmd; ``skip_reason`` is None when the node is idle."""

    def __init__(self, timeout: float = 60.0):
        self.skip_reason: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.dir: Path | None = None
        missing = [name for name in DAEMONS + CLIENTS if _which(name) is None]
        if missing:
            self.skip_reason = (f"Slurm is not installed ({', '.join(missing)} not found); "
                                "run scripts/install_slurm.sh as root")
            return
        self.dir = Path(tempfile.mkdtemp(prefix="basislab-slurm-"))
        self.node = "basisnode"
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}
        try:
            self._start(timeout)
        except (OSError, subprocess.SubprocessError, TimeoutError) as e:
            self.skip_reason = f"the throwaway Slurm did not come up ({e}); logs in {self.dir}"

    def _start(self, timeout: float) -> None:
        assert self.dir is not None
        for sub in ("state", "spool", "munge"):
            (self.dir / sub).mkdir(mode=0o755)  # munge's socket must be reachable by every user
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        sock = self.dir / "munge" / "munge.socket"
        munged = [_which("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
                  f"--pid-file={self.dir / 'munge' / 'munged.pid'}", f"--log-file={self.dir / 'munge' / 'munged.log'}",
                  f"--seed-file={self.dir / 'munge' / 'munged.seed'}"]
        self._spawn(munged, "munged.out")
        _wait(lambda: sock.exists(), timeout, "munged's socket")
        conf = slurm_conf(self.dir, self.node, _free_port(), _free_port(), sock)
        (self.dir / "slurm.conf").write_text(conf)
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", str(self.dir / "slurm.conf")], "slurmctld.out")
        self._spawn([_which("slurmd"), "-D", "-N", self.node, "-f", str(self.dir / "slurm.conf")], "slurmd.out")
        _wait(self._node_idle, timeout, "the node to be idle (sinfo)")

    def _spawn(self, cmd: list, out: str) -> None:
        assert self.dir is not None
        with open(self.dir / out, "wb") as log:
            self.procs.append(subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                                               env=self.env, start_new_session=True))
        if self.procs[-1].poll() is not None:
            raise OSError(f"{cmd[0]} exited at once")

    def _node_idle(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise OSError(f"{proc.args[0]} exited with {proc.returncode}")
        out = self.run("sinfo", "-h", "-o", "%t", check=False)
        return out.strip() == "idle"

    def run(self, *cmd: str, check: bool = True) -> str:
        """A Slurm client command against this cluster; its stdout."""
        done = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
        return done.stdout

    def stop(self) -> None:
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL) and delete the folder."""
        if self.procs:
            self.run("scancel", "--full", "--partition", PARTITION, check=False)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs = []
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def _wait(ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.25)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")
