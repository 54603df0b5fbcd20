"""Open an SSH connection to one machine: host-key checking, proxyCommand, precise errors.

Every failure raises `SshError` whose message says what went wrong on which machine and
how to fix it; passwords and passphrases never appear in it.
"""
from __future__ import annotations

import base64
import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from select import select
from typing import Any

import paramiko

from nni_manager.backends.base import BackendError
from nni_manager.ssh.machine import SshMachine

CONNECT_TIMEOUT = 15.0


class SshError(BackendError):
    """A machine could not be reached or logged into; the message is for the user."""


def machine_label(m: SshMachine) -> str:
    return f"{m.user}@{m.host}:{m.port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style `SHA256:<base64>` fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_path(m: SshMachine) -> Path:
    return Path(m.known_hosts_file or "~/.ssh/known_hosts").expanduser()


def _host_entry(m: SshMachine) -> str:
    return m.host if m.port == 22 else f"[{m.host}]:{m.port}"


def _trust_hint(m: SshMachine, key: paramiko.PKey) -> str:
    path = known_hosts_path(m)
    return (
        f"If you trust this key (compare the fingerprint with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` "
        f"on the machine), add it with `ssh-keyscan -p {m.port} {m.host} >> {path}` or append this line to "
        f"{path}: {_host_entry(m)} {key.get_name()} {key.get_base64()} "
        "(or point the machine's knownHostsFile at a file that has it)"
    )


class _RejectUnknownHost(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy, but the error shows the offered key and how to trust it."""

    def __init__(self, machine: SshMachine) -> None:
        self.machine = machine

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        m = self.machine
        raise SshError(
            f"{machine_label(m)}: host key is not known: {key.get_name()} {fingerprint(key)} is not in "
            f"{known_hosts_path(m)}. {_trust_hint(m, key)}"
        )


# The relay gets SIGTERM when the manager goes, even by SIGKILL, so no `nc` keeps its SSH
# session (and the forwarded port) alive. setpriv sets the parent-death signal and execs the
# command; a preexec_fn would do the same but forces fork() over vfork(), and gRPC's fork
# handlers then abort the child.
_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


class _ProxyCommand(paramiko.ProxyCommand):
    """paramiko's ProxyCommand spins forever once the command exits (reads keep returning
    b''), so a dropped link never ends the transport. Return short reads like a socket,
    and b'' at EOF, which closes the transport so the backend reconnects. The command dies
    with the manager."""

    def __init__(self, command_line: str) -> None:  # paramiko's, plus the death signal
        self.cmd = shlex.split(command_line)
        argv = [_SETPRIV, "--pdeathsig", "TERM", "--", *self.cmd] if _SETPRIV else self.cmd
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        )
        self.timeout = None
        assert self.process.stdout is not None  # stdout=PIPE
        self._stdout = self.process.stdout

    def recv(self, size: int) -> bytes:
        ready, _, _ = select([self._stdout], [], [], self.timeout)
        if not ready:
            raise socket.timeout()
        try:
            return os.read(self._stdout.fileno(), size)
        except OSError as e:
            raise paramiko.ProxyCommandFailure(" ".join(self.cmd), e.strerror or str(e)) from None


def _proxy_exit(sock: _ProxyCommand | None) -> str:
    """How the proxy command ended, with what it said (e.g. nc's "Connection refused"), if it did."""
    if sock is None:
        return ""
    try:
        code = sock.process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return ""
    said = sock.process.stderr.read(2000).decode(errors="replace").strip() if sock.process.stderr else ""
    return f"the proxy command exited with code {code}" + (f": {said}" if said else "")


def proxy_command_line(m: SshMachine) -> str | None:
    """OpenSSH ProxyCommand tokens: %h host, %p port, %r user, %% a literal %."""
    if not m.proxy_command:
        return None
    out, it = [], iter(m.proxy_command)
    for ch in it:
        if ch != "%":
            out.append(ch)
            continue
        nxt = next(it, "")
        subst = {"h": m.host, "p": str(m.port), "r": m.user, "%": "%"}.get(nxt)
        if subst is None:
            raise SshError(f"{machine_label(m)}: proxyCommand has unknown token %{nxt}; use %h, %p, %r or %%")
        out.append(subst)
    return "".join(out)


def _auth_kwargs(m: SshMachine) -> dict[str, Any]:  # keyword arguments of SSHClient.connect
    if m.ssh_key_file is not None:
        key_file = Path(m.ssh_key_file).expanduser()
        if not key_file.is_file():
            raise SshError(f"{machine_label(m)}: sshKeyFile {key_file} does not exist; fix the sshKeyFile path in the config")
        return {"key_filename": str(key_file), "passphrase": m.ssh_passphrase, "allow_agent": False, "look_for_keys": False}
    if m.password is not None:
        return {"password": m.password, "allow_agent": False, "look_for_keys": False}
    return {}  # neither given: the SSH agent and ~/.ssh/id_* keys, like `ssh` does


def _auth_method(m: SshMachine) -> str:
    if m.ssh_key_file is not None:
        return f"key {m.ssh_key_file}"
    return "password" if m.password is not None else "SSH agent / default keys"


def connect(m: SshMachine) -> paramiko.SSHClient:
    """Connect and authenticate (blocking; call it from a worker thread)."""
    label = machine_label(m)
    client = paramiko.SSHClient()
    if m.strict_host_key_checking:
        path = known_hosts_path(m)
        if path.exists():
            client.load_host_keys(str(path))
        client.set_missing_host_key_policy(_RejectUnknownHost(m))
    else:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # in memory only
    sock = None
    try:
        line = proxy_command_line(m)
        sock = _ProxyCommand(line) if line else None
        client.connect(
            m.host, port=m.port, username=m.user, sock=sock, timeout=CONNECT_TIMEOUT,
            banner_timeout=CONNECT_TIMEOUT, auth_timeout=CONNECT_TIMEOUT, **_auth_kwargs(m),
        )
    except SshError:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        raise SshError(
            f"{label}: HOST KEY CHANGED: the server offered {e.key.get_name()} {fingerprint(e.key)} but "
            f"{known_hosts_path(m)} expects {e.expected_key.get_name()} {fingerprint(e.expected_key)}. This can "
            f"be an attack. If the machine was really reinstalled, remove the old entry with "
            f"`ssh-keygen -R '{_host_entry(m)}' -f {known_hosts_path(m)}`; then {_trust_hint(m, e.key)}"
        ) from None
    except paramiko.BadAuthenticationType as e:
        client.close()
        raise SshError(
            f"{label}: the server does not accept {_auth_method(m)} authentication; it allows: "
            f"{', '.join(e.allowed_types)}. Set sshKeyFile or password accordingly"
        ) from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise SshError(f"{label}: key {m.ssh_key_file} is encrypted; set sshPassphrase") from None
    except paramiko.AuthenticationException:
        client.close()
        what = "the password was rejected" if m.ssh_key_file is None and m.password is not None else "the key was rejected"
        raise SshError(f"{label}: authentication failed with {_auth_method(m)}: {what}; check user, password/sshKeyFile") from None
    except (paramiko.ProxyCommandFailure, OSError, socket.timeout, paramiko.SSHException, EOFError) as e:
        client.close()
        via = f" via proxyCommand `{proxy_command_line(m)}`" if m.proxy_command else ""
        what = e.error if isinstance(e, paramiko.ProxyCommandFailure) else f"{type(e).__name__}: {e}"
        exited = _proxy_exit(sock)
        fix = (f"check the proxyCommand and that sshd runs on {m.host}:{m.port} behind it" if m.proxy_command else
               f"is sshd running on {m.host} and listening on port {m.port}? Check host and port in machineList "
               f"(try `ssh -p {m.port} {m.user}@{m.host}`)")
        raise SshError(f"{label}: cannot connect{via}: {exited or what}; {fix}") from None
    if sock is None:
        # Our own TCP socket: send small SSH packets at once. With Nagle on, a write that
        # follows an unacknowledged one waits for the peer's delayed ACK (~40 ms a round trip).
        transport = client.get_transport()
        if transport is not None and isinstance(transport.sock, socket.socket):
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client
