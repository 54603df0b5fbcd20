"""`loginNode`: the Slurm commands and job files on a login node reached over SSH, and the relay
that lets agents on compute nodes reach the manager's hub through that SSH connection.

    agent (compute node) --TLS--> relay <relayHost>:<relayPort> (login node, nni_slurm_relay.py)
      --> login 127.0.0.1:<forward port> (sshd remote forward) ==SSH==> manager --> hub 127.0.0.1:<hubPort>

The relay only pipes bytes: TLS runs end to end between agent and hub, whose certificate names
`relayHost`. That is what authenticates the hub: the agents (`--ca-file`) trust only the
experiment's own CA, whose key never leaves the manager, so whoever binds the relay's port or the
forward port on the login node while the relay or the link is down (any user of a shared login
node can) fails the handshake and never sees a token nor gets an agent to obey it. Only with
`hubTls: false` (warned about at start) does this path carry plain text. The other way round,
the relay pipes only connections that prove the experiment's relay token (an HTTP CONNECT; the
agents' copy is a 0600 file beside their tokens, the relay's argv holds its sha256), so other
users of the cluster cannot hold its places or reach the hub through it. The relay reads its target from a file for every connection, so after a dropped link or
a manager restart only that file changes; its own port (what the batch scripts name) stays.
Files under ~/nni-experiments/<exp>/ on the login node (home is shared with the compute nodes on
most clusters): slurm/<job>/ (0700: tokens, relay.token and CA as 0600 files by SFTP, batch.sh, logs),
agent-wheel/, relay.{py,pid,port,target,log}.
"""
from __future__ import annotations

import asyncio
import logging
import shlex
import threading
from importlib import resources
from typing import Sequence

import paramiko

from nni_manager.hub.relay_token import relay_digest
from nni_manager.backends.base import BackendError
from nni_manager.backends.slurm.config import LoginNode
from nni_manager.backends.slurm.hosts import COMMAND_TIMEOUT, LOG_TAIL, command_line
from nni_manager.ssh.commands import Sftp, run
from nni_manager.ssh.connection import SshError, connect, machine_label
from nni_manager.ssh.tunnel import RemoteForward

log = logging.getLogger(__name__)

_SSH_ERRORS = (SshError, paramiko.SSHException, OSError, EOFError)
RELAY = "nni_slurm_relay.py"
KEEPALIVE_S = 30


class LoginNodeError(BackendError):
    """The login node cannot be used; the message is for the user."""


def relay_connections(max_agents: int) -> int:
    """Connections the relay pipes at once: every agent's, twice over (a redial overlaps the stream
    it replaces), and some room; beyond that it closes them (a stranger cannot make it start
    threads without end)."""
    return max(256, 2 * max_agents + 64)


class LoginNodeHost:
    """One SSH connection to the login node, re-opened (with its forward) when it drops."""

    def __init__(self, node: LoginNode, experiment_id: str, orphan_timeout: float, max_agents: int = 128,
                 relay_token: str = "") -> None:
        self.node = node
        self.relay_token = relay_token  # the agents prove it to the relay, which knows only its sha256
        self.experiment_id = experiment_id
        self.orphan_timeout = orphan_timeout
        self.relay_connections = relay_connections(max_agents)
        self.label = machine_label(node)
        self.where = f"on login node {self.label} over SSH"
        self.home = ""
        self.client: paramiko.SSHClient | None = None
        self.sftp: Sftp | None = None
        self.forward: RemoteForward | None = None
        self.hub: tuple[str, int] | None = None  # where the forward pumps to (the hub's TCP address)
        self.relay_port = 0
        self._lock = threading.Lock()  # one reconnect at a time

    # ------------------------------------------------------------------ connection
    def _connect(self) -> None:
        """(Re)connect; re-open the forward and point the relay at it (blocking)."""
        with self._lock:
            if self._alive():
                return
            self._close()
            self.client = connect(self.node)
            transport = self.client.get_transport()
            if transport is not None:  # idle links through NAT and firewalls stay open
                transport.set_keepalive(KEEPALIVE_S)
            self.sftp = Sftp(self.client)
            if not self.home:
                rc, out, err = run(self.client, 'printf "%s" "$HOME"', timeout=COMMAND_TIMEOUT)
                if rc != 0 or not out.startswith("/"):
                    raise LoginNodeError(f"{self.label}: cannot read $HOME on the login node: {err.strip()[-300:]}")
                self.home = out
            if self.hub is not None:
                self._open_forward()

    def _alive(self) -> bool:
        transport = self.client.get_transport() if self.client else None
        return transport is not None and transport.is_active()

    def _client(self) -> paramiko.SSHClient:
        if not self._alive():
            log.info("%s: connecting", self.label)
            self._connect()
        assert self.client is not None
        return self.client

    def _close(self) -> None:
        if self.forward is not None:
            self.forward.close()
            self.forward = None
        if self.sftp is not None:
            try:
                self.sftp.close()
            except _SSH_ERRORS:
                pass
            self.sftp = None
        if self.client is not None:
            self.client.close()
            self.client = None

    async def open(self) -> None:
        try:
            await asyncio.to_thread(self._connect)
        except SshError as e:
            raise LoginNodeError(f"loginNode: {e}") from None
        await self.make_private_dir(self.base_dir())

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def base_dir(self) -> str:
        return f"{self.home or '~'}/nni-experiments/{self.experiment_id}"

    async def _sh(self, command: str, stdin: bytes | None = None, timeout: float = COMMAND_TIMEOUT) -> tuple[int, str, str]:
        def go() -> tuple[int, str, str]:
            try:
                rc, out, err = run(self._client(), command, stdin, timeout=timeout)
            except _SSH_ERRORS as e:  # a dropped link: the next call reconnects
                self._drop()
                return 255, "", f"{self.label}: SSH failed ({type(e).__name__}: {e})"
            if rc == -1:  # the channel closed without an exit status: the link dropped mid-command
                self._drop()
                return 255, out, f"{self.label}: the SSH link dropped while running a command"
            return rc, out, err
        return await asyncio.to_thread(go)

    def _drop(self) -> None:
        with self._lock:
            self._close()

    # ------------------------------------------------------------------ SlurmHost
    async def missing_commands(self, names: Sequence[str]) -> list[str]:
        script = "; ".join(f"command -v {shlex.quote(n)} >/dev/null 2>&1 || echo {shlex.quote(n)}" for n in names)
        rc, out, err = await self._sh(script + "; true")
        if rc != 0:
            raise LoginNodeError(f"{self.label}: cannot run commands on the login node: {err.strip()[-300:]}")
        return out.split()

    async def run(self, argv: Sequence[str], stdin: str | None = None, cwd: str | None = None) -> tuple[int, str, str]:
        return await self._sh(command_line(argv, cwd), stdin.encode() if stdin is not None else None)

    async def make_private_dir(self, path: str) -> None:
        q = shlex.quote(path)
        rc, _, err = await self._sh(f"umask 077 && mkdir -p {q} && chmod 700 {q}")
        if rc != 0:
            raise LoginNodeError(f"{self.label}: cannot create {path}: {err.strip()[-300:]}")

    def _sftp(self) -> Sftp:
        self._client()
        assert self.sftp is not None
        return self.sftp

    async def write_private(self, path: str, data: bytes) -> None:
        try:
            await asyncio.to_thread(lambda: self._sftp().put_private(path, data))
        except _SSH_ERRORS as e:
            raise LoginNodeError(f"{self.label}: writing {path} by SFTP failed: {e}") from None

    async def write_text(self, path: str, text: str) -> None:
        await self.write_private(path, text.encode())

    async def put_file(self, local: str, path: str) -> None:
        try:
            await asyncio.to_thread(lambda: self._sftp().put_file(local, path))
        except _SSH_ERRORS as e:
            raise LoginNodeError(f"{self.label}: uploading {path} by SFTP failed: {e}") from None

    async def remove(self, paths: Sequence[str]) -> None:
        if paths:
            await self._sh("rm -f -- " + " ".join(shlex.quote(p) for p in paths))

    async def log_tail(self, job_dir: str) -> str:
        _, out, _ = await self._sh(
            f"cd {shlex.quote(job_dir)} 2>/dev/null || exit 0; for f in $(ls agent-*.log 2>/dev/null | sort) job.out; "
            f'do if [ -s "$f" ]; then tail -c {LOG_TAIL} "$f"; exit 0; fi; done')
        return out

    # ------------------------------------------------------------------ the relay
    def _path(self, name: str) -> str:
        return f"{self.base_dir()}/{name}"

    def _open_forward(self) -> None:
        """Forward login-node 127.0.0.1:<any> to the hub, and point the relay there (lock held)."""
        assert self.client is not None and self.hub is not None
        forward = RemoteForward(self.client.get_transport(), self.hub)  # type: ignore[arg-type]
        try:
            port = forward.open(0)
        except (paramiko.SSHException, EOFError) as e:
            raise LoginNodeError(f"{self.label}: the login node's sshd refused a remote port forward ({e}); it needs "
                                 "`AllowTcpForwarding yes` (or `remote`) in its sshd_config") from None
        self.forward = forward
        tmp, target = shlex.quote(self._path("relay.target.tmp")), shlex.quote(self._path("relay.target"))
        rc, _, err = run(self.client, f"umask 077 && echo 127.0.0.1:{port} > {tmp} && mv -f {tmp} {target}",
                         timeout=COMMAND_TIMEOUT)
        if rc != 0:
            raise LoginNodeError(f"{self.label}: cannot write the relay's target: {err.strip()[-300:]}")
        log.info("%s: hub forwarded to login-node port %s", self.label, port)

    async def ensure_relay(self, hub: str) -> tuple[str, int]:
        """Start (or find) the relay pointed at a forward to `hub`; (host, port) the agents dial."""
        host, _, port = hub.rpartition(":")
        if self.hub is None or self.forward is None:
            self.hub = (host, int(port))
            try:
                await asyncio.to_thread(self._forward_now)
            except _SSH_ERRORS as e:
                raise LoginNodeError(f"{self.label}: opening the forward to the hub failed: {e}") from None
        if self.relay_port:
            return self.node.relay_address, self.relay_port
        script = resources.files("nni_manager.backends.slurm").joinpath(RELAY).read_bytes()
        await self.write_private(self._path(RELAY), script)
        await self._write_limit()  # a relay an earlier manager started takes this experiment's limit too
        rc, out, err = await self._sh(self._relay_command())
        words = out.strip().splitlines()
        if rc != 0 or not words or not words[-1].isdigit():
            raise LoginNodeError(
                f"{self.label}: the relay on the login node did not start ({self.node.python}, listening on "
                f"{self.node.relay_address}:{self.node.relay_port or 'any port'}): "
                f"{(err.strip() or out.strip())[-400:] or f'exit status {rc}'}. The login node needs python3 "
                "(loginNode.pythonPath) and relayHost must be one of its addresses")
        self.relay_port = int(words[-1])
        return self.node.relay_address, self.relay_port

    def _forward_now(self) -> None:
        with self._lock:
            if self._alive():
                self._open_forward()
                return
        self._connect()  # opens the forward too

    def _relay_command(self) -> str:
        """Shell that reuses a running relay of this experiment, or starts one (the script came by
        SFTP; on the port it had before, if it ever ran) and prints its port."""
        q = lambda name: shlex.quote(self._path(name))  # noqa: E731
        node = self.node
        start = " ".join([
            shlex.quote(node.python), q(RELAY), shlex.quote(node.relay_address), '"$port"', q("relay.target"),
            q("relay.port"), f"{self.orphan_timeout:g}", str(self.relay_connections), q("relay.limit"),
            relay_digest(self.relay_token)])
        return "\n".join([
            "umask 077",
            f"cd {q('')} || exit 1",
            f"p=$(cat {q('relay.pid')} 2>/dev/null)",
            f'if [ -n "$p" ] && grep -q {RELAY} /proc/"$p"/cmdline 2>/dev/null && [ -s {q("relay.port")} ]; then '
            f"cat {q('relay.port')}; exit 0; fi",
            f"port=$(cat {q('relay.port')} 2>/dev/null || echo {node.relay_port}); rm -f {q('relay.port')}",
            f"setsid {start} </dev/null >>{q('relay.log')} 2>&1 &",
            "p=$!; echo $p > " + q("relay.pid"),
            f"i=0; while [ ! -s {q('relay.port')} ] && [ $i -lt 100 ] && kill -0 $p 2>/dev/null; do sleep 0.1; i=$((i+1)); done",
            f"if [ -s {q('relay.port')} ]; then cat {q('relay.port')}; else tail -c 400 {q('relay.log')} >&2; exit 1; fi",
        ])

    async def set_max_agents(self, max_agents: int) -> None:
        """trialConcurrency changed: the relay's limit follows (it reads relay.limit at every
        connection it accepts)."""
        self.relay_connections = relay_connections(max_agents)
        if self.relay_port:
            await self._write_limit()

    async def _write_limit(self) -> None:
        await self.write_text(self._path("relay.limit"), f"{self.relay_connections}\n")

    async def stop_relay(self) -> None:
        """Stop the relay (by its pid file, checked against its command line) and the forward."""
        q = lambda name: shlex.quote(self._path(name))  # noqa: E731
        await self._sh(f"rm -f {q('relay.target')}; p=$(cat {q('relay.pid')} 2>/dev/null); "
                       f'[ -n "$p" ] && grep -q {RELAY} /proc/"$p"/cmdline 2>/dev/null && kill "$p"; '
                       f"rm -f {q('relay.pid')} {q('relay.port')}; true")
        self.relay_port = 0
