"""Real OpenSSH servers for the remote backend tests.

* `plain_sshd`: one sshd on 127.0.0.1 of this machine (no namespaces needed beyond root).
* `netns_hosts`: three "machines", each a network namespace with only `lo` and its own
  sshd, reached through proxyCommand `ip netns exec %h nc 127.0.0.1 %p`, so an agent there
  can reach the manager only through the SSH tunnel.
* `password_user`: a non-root user with a password (useradd + chpasswd).
Everything skips with a reason when not root, or sshd / ip / nc are missing.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nni_manager.backends.remote.config import MachineConfig

SSHD = "/usr/sbin/sshd"
ROOT_PYTHON_DIR = str(Path(sys.executable).parent)  # the test Python has the agent's dependencies


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
class SshdHost:
    """One running sshd and the MachineConfig that reaches it as root with the client key."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    machine: MachineConfig

    def kill_connections(self) -> int:
        """Kill the sshd children serving connections (the listener stays): links drop."""
        children = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in children:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        return len(children)


class SshKeys:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.chmod(0o755)  # the unprivileged sshd child reads authorized_keys as root anyway; users need nothing here
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
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> SshKeys:
    reason = _skip_reason(need_netns=False)
    if reason:
        pytest.skip(reason)
    os.makedirs("/run/sshd", exist_ok=True)
    return SshKeys(tmp_path_factory.mktemp("ssh"))


@pytest.fixture(scope="session")
def plain_sshd(ssh_keys: SshKeys) -> Iterator[SshdHost]:
    port = _free_port()
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(ssh_keys.sshd_config(port, "plain"))],
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(None, port, proc)
        ssh_keys.trust("127.0.0.1", port)
        machine = MachineConfig(host="127.0.0.1", port=port, user="root", ssh_key_file=ssh_keys.root / "client",
                                known_hosts_file=ssh_keys.known_hosts, python_path=ROOT_PYTHON_DIR)
        yield SshdHost("plain", port, proc, machine)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def netns_hosts(ssh_keys: SshKeys) -> Iterator[list[SshdHost]]:
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
                host=name, port=port, user="root", ssh_key_file=ssh_keys.root / "client",
                known_hosts_file=ssh_keys.known_hosts, python_path=ROOT_PYTHON_DIR,
                proxy_command="ip netns exec %h nc 127.0.0.1 %p")))
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
