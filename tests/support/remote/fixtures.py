"""Real OpenSSH servers for the remote backend tests.

* `ssh_user`: the Unix user the sshd fixtures log in as, made per pytest session (so per xdist
  worker: tests/support/parallel.py), with its own home and a Python it can run that has the
  agent's dependencies; its agents, shipped dependencies and experiment dirs land in that home,
  never in root's, and the session removes user and home at its end. Not root, as on most real
  workers: what the worker side reads (a fake Python, a release file, a trial script) must be
  readable by that user (`worker_dir`).
* `plain_sshd`: one sshd on 127.0.0.1 of this machine (no namespaces needed beyond root).
* `netns_hosts`: three "machines", each a network namespace with only `lo` and its own
  sshd, reached through proxyCommand `ip netns exec %h nc 127.0.0.1 %p`, so an agent there
  can reach the manager only through the SSH tunnel.
* `password_user`: a non-root user with a password (useradd + chpasswd).
* `root_login`: the same hosts logged in as root, for what needs root on the worker (a mount):
  those tests share root's home, so they run on one worker (tests/support/parallel.py).
Everything skips with a reason when not root, or sshd / ip / nc are missing.
"""
from __future__ import annotations

import dataclasses
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nni_manager.backends.remote.config import MachineConfig
from tests.support.stopping import terminate

SSHD = "/usr/sbin/sshd"
ROOT_PYTHON_DIR = str(Path(sys.executable).parent)  # the test Python has the agent's dependencies (for root)
STOCK = Path("/usr/bin/python3")


def _skip_reason(need_netns: bool) -> str | None:
    if os.geteuid() != 0:
        return "needs root (sshd with its own host key, netns, test users)"
    if not os.path.exists(SSHD):
        return "needs /usr/sbin/sshd: apt-get install -y openssh-server"
    if need_netns and not (shutil.which("ip") and shutil.which("nc")):
        return "needs `ip` and `nc`: apt-get install -y iproute2 netcat-openbsd"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SshUser:
    """The user the SSH fixtures log in as: its name, home, and the bin directory of a Python it
    can run with the agent's dependencies (a machine's pythonPath)."""

    name: str
    home: Path
    python_dir: str


@dataclass
class SshdHost:
    """One running sshd and the MachineConfig that reaches it as the session's `ssh_user` with the
    client key; `home` is that user's home (where its agents put ~/.nni-agent, ~/nni-experiments)."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    machine: MachineConfig
    home: Path

    def kill_connections(self) -> int:
        """Kill the sshd processes serving connections (the listener stays): links drop. A user other
        than root has two per connection, the privileged monitor and its child running as the user,
        which holds the socket; both go. Returns the number of connections."""
        import psutil

        connections = psutil.Process(self.proc.pid).children()
        for conn in connections:
            try:
                serving = [conn, *(p for p in conn.children(recursive=True) if p.name().startswith("sshd"))]
            except psutil.NoSuchProcess:
                continue
            for proc in serving:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
        return len(connections)


class SshKeys:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.chmod(0o755)  # sshd reads this authorized_keys as root for root; other users get their own
        for name in ("hostkey", "client"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
        (root / "authorized_keys").write_text((root / "client.pub").read_text())
        (root / "authorized_keys").chmod(0o644)
        self.host_pub = (root / "hostkey.pub").read_text().split()[:2]
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text("")

    def trust(self, host: str, port: int) -> None:
        with self.known_hosts.open("a") as f:
            f.write(f"[{host}]:{port} {' '.join(self.host_pub)}\n")

    def sshd_config(self, port: int, tag: str) -> Path:
        cfg = self.root / f"sshd_{tag}.conf"
        cfg.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {self.root / 'hostkey'}",
            f"PidFile {self.root / f'sshd_{tag}.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'} .ssh/authorized_keys",
            "PasswordAuthentication yes", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            "UsePAM no", "StrictModes no", "AllowTcpForwarding yes", "Subsystem sftp internal-sftp",
            "MaxStartups 50", "LogLevel ERROR",
        ]) + "\n")
        subprocess.run([SSHD, "-t", "-f", str(cfg)], check=True)
        return cfg


def _wait_listening(netns: str | None, port: int, proc: subprocess.Popen[bytes]) -> None:
    probe = (["ip", "netns", "exec", netns] if netns else []) + ["nc", "-z", "127.0.0.1", str(port)]
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return
        time.sleep(0.02)
    raise RuntimeError("sshd did not start listening")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    terminate(proc, 5)


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> SshKeys:
    reason = _skip_reason(need_netns=False)
    if reason:
        pytest.skip(reason)
    os.makedirs("/run/sshd", exist_ok=True)
    return SshKeys(tmp_path_factory.mktemp("ssh"))


def readable_dir(prefix: str) -> Path:
    """A new directory under /tmp (short: hub sockets) that every user may read and enter: where the
    tests put what the SSH user's worker side runs or reads. The caller removes it."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    return d


def _as_user(user: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, cwd="/")


def _user_python(user: str, root: Path) -> str:
    """A venv the user can run, of /usr/bin/python3 (or else the test's own base interpreter) when
    its minor version is the test's, with the test's agent dependencies linked onto its path (their
    compiled parts are for this minor); its bin directory. Skips with the reason when none works."""
    from importlib import metadata

    from tests.support.worker_python import link_distributions, requirements_closure

    minor = "%d.%d" % sys.version_info[:2]
    tried = []
    for base in dict.fromkeys([STOCK, Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))]):
        probe = _as_user(user, [str(base), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        if probe.returncode != 0 or probe.stdout.strip() != minor:
            tried.append(f"{base}: {(probe.stderr.strip().splitlines() or [probe.stdout.strip()])[-1]}")
            continue
        venv = root / base.name.replace(".", "")
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
        deps = root / f"deps-{venv.name}"
        deps.mkdir()
        link_distributions(requirements_closure(metadata.requires("nni-agent") or []), deps)
        (site,) = venv.glob("lib/python3*/site-packages")
        (site / "agent-deps.pth").write_text(f"{deps}\n")
        check = _as_user(user, [str(venv / "bin" / "python3"), "-c", "import grpc, google.protobuf, psutil"])
        if check.returncode == 0:
            return str(venv / "bin")
        tried.append(f"{venv}: {(check.stderr.strip().splitlines() or ['?'])[-1]}")
    pytest.skip(f"no Python {minor} the SSH tests' user {user} can run with the agent's dependencies "
                f"({'; '.join(tried)}): the test venv's site-packages must be readable by other users")


@pytest.fixture(scope="session")
def ssh_user(ssh_keys: SshKeys) -> Iterator[SshUser]:
    """A user of this session's own (its home under /home, short), logged in with the client key
    (in its ~/.ssh/authorized_keys: sshd reads that file as the user, who cannot enter ssh_keys'
    root-only folder); removed with its home and anything it left running at the session's end."""
    name = f"nnis{secrets.token_hex(3)}"
    # password "*": none can log in with, yet not locked ("!", useradd's), which sshd without PAM refuses
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--password", "*", name], check=True,
                   capture_output=True)
    entry = pwd.getpwnam(name)
    root = readable_dir("nsu")
    try:
        ssh_dir = Path(entry.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text((ssh_keys.root / "client.pub").read_text())
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        (ssh_dir / "authorized_keys").chmod(0o600)
        yield SshUser(name, Path(entry.pw_dir), _user_python(name, root))
    finally:
        _end_processes_of(entry.pw_uid)
        subprocess.run(["userdel", "--force", "--remove", name], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _end_processes_of(uid: int) -> None:
    """What the user still runs (a test that failed midway): killed, so nothing outlives the session."""
    import psutil

    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == uid:
                proc.kill()
        except psutil.Error:
            pass


@pytest.fixture
def worker_dir() -> Iterator[Path]:
    """A short temporary directory the SSH user can read: trial scripts, release files and Pythons
    the worker side uses (tmp_path and short_dir are root's own, 0700)."""
    d = readable_dir("nw")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def root_login() -> Callable[[SshdHost], MachineConfig]:
    """`host`'s machine logged in as root with the test's Python: for a test that needs root on the
    worker side. Its agents live in root's home, so tests/support/parallel.py puts it in the one
    worker's group."""
    return lambda host: dataclasses.replace(host.machine, user="root", python_path=ROOT_PYTHON_DIR)


@pytest.fixture(scope="session")
def plain_sshd(ssh_keys: SshKeys, ssh_user: SshUser) -> Iterator[SshdHost]:
    port = _free_port()
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(ssh_keys.sshd_config(port, "plain"))],
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(None, port, proc)
        ssh_keys.trust("127.0.0.1", port)
        machine = MachineConfig(host="127.0.0.1", port=port, user=ssh_user.name, ssh_key_file=ssh_keys.root / "client",
                                known_hosts_file=ssh_keys.known_hosts, python_path=ssh_user.python_dir)
        yield SshdHost("plain", port, proc, machine, ssh_user.home)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def netns_hosts(ssh_keys: SshKeys, ssh_user: SshUser) -> Iterator[list[SshdHost]]:
    reason = _skip_reason(need_netns=True)
    if reason:
        pytest.skip(reason)
    run_id = secrets.token_hex(3)
    hosts: list[SshdHost] = []
    names: list[str] = []
    try:
        for i in range(3):
            name = f"nnih{i}-{run_id}"
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
            names.append(name)
            subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
            port = 2200 + i
            cfg = ssh_keys.sshd_config(port, name)
            proc = subprocess.Popen(["ip", "netns", "exec", name, SSHD, "-D", "-e", "-f", str(cfg)],
                                    stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
            hosts.append(SshdHost(name, port, proc, MachineConfig(
                host=name, port=port, user=ssh_user.name, ssh_key_file=ssh_keys.root / "client",
                known_hosts_file=ssh_keys.known_hosts, python_path=ssh_user.python_dir,
                proxy_command="ip netns exec %h nc 127.0.0.1 %p"), ssh_user.home))
            _wait_listening(name, port, proc)
            ssh_keys.trust(name, port)
        yield hosts
    finally:
        for host in hosts:
            _stop(host.proc)
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture(scope="session")
def password_user(ssh_keys: SshKeys) -> Iterator[tuple[str, str]]:
    user, password = f"nnit{secrets.token_hex(3)}", secrets.token_urlsafe(12)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True)
    try:
        # chpasswd sets a real hash, which also unlocks the account (`usermod -p` would need a hash)
        subprocess.run(["chpasswd"], input=f"{user}:{password}\n".encode(), check=True)
        yield user, password
    finally:
        subprocess.run(["userdel", "--remove", user], capture_output=True)


def processes_with(env_prefix: bytes) -> list[int]:
    """Pids of processes (on any host: the namespaces share one PID space) whose
    environment has a variable starting with `env_prefix`."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(v.startswith(env_prefix) for v in env):
                pids.append(int(name))
    return pids
