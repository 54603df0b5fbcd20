"""Fixture `slurm`: a real 2-node Slurm cluster on loopback (munged + slurmctld + 2 slurmd),
everything in one temp dir, started once per session and stopped by pid at the end.

Installs nothing (scripts/test.sh installs `slurmctld slurmd slurm-client munge` as root): without
root or the binaries, the tests skip and say why. See docs: test-infrastructure §8.

A second partition `high` (PriorityTier 10, PreemptMode CANCEL) lets a test preempt the
experiment's jobs for real. Fixture `login_node`: a real sshd on 127.0.0.1 whose sessions see the
cluster (SetEnv SLURM_CONF), the `loginNode` the manager drives the cluster through.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.remote.fixtures import SSHD, SshKeys

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
NODES = ("n1", "n2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)


class Slurm:
    """A running cluster; `env` is what every Slurm client command needs (SLURM_CONF)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pids: list[int] = []
        self.munge_socket = root / "munge" / "munge.socket.2"

    def run(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check, input=input,
                              timeout=60)

    def jobs(self, prefix: str = "") -> list[dict[str, str]]:
        """Every job slurmctld still knows (finished ones for MinJobAge), name starting with `prefix`."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r|%N").stdout
        rows = [dict(zip(("id", "name", "state", "reason", "nodes"), line.split("|"))) for line in out.splitlines()]
        return [r for r in rows if r["name"].startswith(prefix)]

    def live_jobs(self, prefix: str = "") -> list[dict[str, str]]:
        return [j for j in self.jobs(prefix) if j["state"] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING",
                                                              "SUSPENDED", "REQUEUED", "RESIZING")]

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "condition"):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while True:
            v = predicate()
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.2)

    def idle_nodes(self) -> list[str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
        # one line per node and partition (debug, high): each node once
        return sorted({line.split()[0] for line in out if line.strip() and line.split()[1] == "idle"})

    def job_processes(self, steps: bool = False) -> list[int]:
        """Processes started by slurmd for jobs (their environment carries SLURM_JOB_ID and our SLURM_CONF
        or cluster name), i.e. what a job left behind; with `steps`, the job steps (slurmstepd) too."""
        want = f"SLURM_CONF={self.conf}".encode()
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                if want not in env:
                    continue
                if any(e.startswith(b"SLURM_JOB_ID=") for e in env):
                    out.append(int(d))
                elif steps:
                    with open(f"/proc/{d}/comm", "rb") as f:
                        if f.read().strip() == b"slurmstepd":
                            out.append(int(d))
            except OSError:
                continue
        return out

    def restart_controller(self) -> None:
        """Stop slurmctld (SIGTERM, by pid), then start it again: it recovers the jobs from its state dir."""
        old = int((self.root / "ctld.pid").read_text().split()[0])
        os.kill(old, signal.SIGTERM)
        self.wait_for(lambda: _gone(old), 30, "slurmctld to stop")
        (self.root / "ctld.pid").unlink(missing_ok=True)
        subprocess.run([_which("slurmctld") or "slurmctld", "-f", str(self.conf)], env=self.env, check=True,
                       capture_output=True, timeout=30)
        new = _pid(self.root / "ctld.pid")
        self.pids[self.pids.index(old)] = new
        self.wait_for(lambda: self.run("squeue", "-h", check=False).returncode == 0, 30, "slurmctld to answer")

    def stop(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 15
        for pid in reversed(self.pids):
            while time.monotonic() < deadline:
                if _gone(pid):
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.kill_leftovers()

    def kill_leftovers(self) -> list[int]:
        """SIGKILL what outlived the daemons: job steps and the jobs' processes. A failed test can leave
        them running, and nothing else would ever end them. Returns the pids it killed."""
        killed = []
        for pid in self.job_processes(steps=True):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        if killed:
            print(f"slurm fixture: killed {len(killed)} leftover process(es) of the test cluster: {killed}",
                  file=sys.stderr)
        return killed


def _gone(pid: int) -> bool:
    """The daemon has exited. Daemons are orphans; where this process became a child subreaper
    (the agent's trial runtime, run in-process by other tests), they are our zombies: reap them."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _pid(path: Path, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.05)
    raise RuntimeError(f"{path} never appeared")


def start_cluster(root: Path) -> Slurm:
    s = Slurm(root)
    host = socket.gethostname()
    (root / "state").mkdir()
    munge = root / "munge"
    munge.mkdir()
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    # munged as root with its own key, socket, pid and log under our dir (--force: root is fine here)
    subprocess.run([_which("munged") or "munged", "--force", "--key-file", str(key), "--socket", str(s.munge_socket),
                    "--pid-file", str(munge / "munged.pid"), "--log-file", str(munge / "munged.log"),
                    "--seed-file", str(munge / "munged.seed")], check=True, capture_output=True, timeout=30)
    s.pids.append(_pid(munge / "munged.pid"))
    ctld, p1, p2 = _free_port(), _free_port(), _free_port()
    s.conf.write_text("\n".join([
        "ClusterName=nnitest", f"SlurmctldHost={host}", f"SlurmctldPort={ctld}",
        "AuthType=auth/munge", f"AuthInfo=socket={s.munge_socket}", "CredType=cred/munge",
        "SlurmUser=root", f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool.%n",
        f"SlurmctldPidFile={root}/ctld.pid", f"SlurmdPidFile={root}/d.%n.pid",
        f"SlurmctldLogFile={root}/ctld.log", f"SlurmdLogFile={root}/d.%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory", "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none", "SchedulerParameters=sched_interval=2", "KillWait=5", "InactiveLimit=0",
        "PreemptType=preempt/partition_prio", "PreemptMode=CANCEL",
        f"NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={p1} CPUs=1 RealMemory=1000",
        f"NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={p2} CPUs=1 RealMemory=1000",
        "PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
        "PartitionName=high Nodes=n1,n2 MaxTime=INFINITE State=UP PriorityTier=10",
    ]) + "\n")
    try:
        subprocess.run([_which("slurmctld") or "slurmctld", "-f", str(s.conf), "-i"], env=s.env, check=True,
                       capture_output=True, timeout=30)
        s.pids.append(_pid(root / "ctld.pid"))
        for n in NODES:
            subprocess.run([_which("slurmd") or "slurmd", "-f", str(s.conf), "-N", n], env=s.env, check=True,
                           capture_output=True, timeout=30)
            s.pids.append(_pid(root / f"d.{n}.pid"))
        s.wait_for(lambda: len(s.idle_nodes()) == len(NODES), 60, "both nodes idle")
    except BaseException:
        s.stop()
        raise
    return s


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests start slurmctld/slurmd/munged, which needs root (run scripts/test.sh as root)")
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}): "
                    "apt-get install slurmctld slurmd slurm-client munge (scripts/test.sh does it as root)")
    root = Path(tempfile.mkdtemp(prefix="slurm", dir="/tmp"))
    cluster = start_cluster(root)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # the manager runs in this process: its Slurm commands find it
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        cluster.stop()
        if os.environ.get("NNI_KEEP_SLURM_DIR") is None:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def base(short_dir: Path) -> Path:
    """A short directory for an experiment (the hub's Unix socket lives in it)."""
    return short_dir


@dataclass
class LoginNodeSshd:
    """A running sshd on 127.0.0.1 playing the cluster's login node; `spec` is its `loginNode` entry."""

    port: int
    spec: dict[str, Any]
    home: Path  # the SSH user's home there (root's): where the backend puts ~/nni-experiments/<exp>
    proc: subprocess.Popen[bytes]

    def kill_connections(self) -> int:
        """Kill the sshd children serving connections (the listener stays): the manager's link drops."""
        children = psutil.Process(self.proc.pid).children()
        for child in children:
            child.kill()
        return len(children)


@pytest.fixture(scope="session")
def login_node(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoginNodeSshd]:
    if not os.path.exists(SSHD):
        pytest.skip("the loginNode tests need /usr/sbin/sshd: apt-get install -y openssh-server")
    os.makedirs("/run/sshd", exist_ok=True)
    keys = SshKeys(tmp_path_factory.mktemp("login"))
    port = _free_port()
    cfg = keys.sshd_config(port, "login")
    with cfg.open("a") as f:  # the login node's sessions find the cluster, as /etc/slurm does on a real one
        f.write(f"SetEnv SLURM_CONF={slurm.conf}\n")
    subprocess.run([SSHD, "-t", "-f", str(cfg)], check=True)
    home = Path.home()  # what the tests leave there goes at the suite's end (tests/support/parallel.py)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        slurm.wait_for(lambda: _listening(port), 20, "the login node's sshd")
        keys.trust("127.0.0.1", port)
        yield LoginNodeSshd(port, {"host": "127.0.0.1", "port": port, "user": "root",
                                   "sshKeyFile": str(keys.root / "client"), "knownHostsFile": str(keys.known_hosts)},
                            home, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def relay_processes() -> list[int]:
    """Relays of the loginNode mode still running (on the "login node", i.e. this machine)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if b"nni_slurm_relay.py" in Path(f"/proc/{d}/cmdline").read_bytes():
                    out.append(int(d))
            except OSError:
                pass
    return out
