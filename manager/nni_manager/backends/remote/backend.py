"""platform: remote — agents on SSH machines that need no route to the manager.

Per machine: connect (host keys checked), find Python >= 3.8, install the agent from a
wheel the manager builds from itself (reused when already installed), start it detached,
and forward a worker-side loopback port to the hub over the same SSH connection. The agent
speaks TLS through that forward and trusts only the experiment's CA (uploaded beside its
token): whoever binds the worker port while the link is down cannot pass as the hub. If the
link drops, or a restarted manager finds the agent still running, re-open the forward (on
the same worker port if it is free, else on a new one the agent reads from its manager file
before redialling), so the running agent simply redials and its trials carry on.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import nni_agent
from nni_agent.compat import MIN_PYTHON_TEXT, wait_for
import paramiko

from nni_manager.backends.base import ORPHAN_MARGIN_S, AgentSpec, BackendContext, FixedBackend, DryRun, PlacementHints
from nni_manager.backends.remote import config as remote_config
from nni_manager.backends.remote.config import MachineConfig, RemoteConfig
from nni_manager.backends.remote import bootstrap
from nni_manager.backends.remote.bootstrap import AgentLaunch, BootstrapError
from nni_manager.ssh.connection import SshError, connect, machine_label, proxy_command_line
from nni_manager.ssh.tunnel import RemoteForward
from nni_manager.backends.agent_wheel import AgentWheel, build_agent_wheel

if TYPE_CHECKING:
    from nni_manager.config import ConfigSection, ExperimentConfig

log = logging.getLogger(__name__)

POLL_S = 0.5
BACKOFF_MAX_S = 10.0
HEALTH_TIMEOUT_S = 10.0  # an agent check slower than this means a half-dead link: reconnect
KEEPALIVE_S = 5.0  # ping the SSH server this often
KEEPALIVE_TIMEOUT_S = 15.0
WAKE_PING_TIMEOUT_S = 3.0  # after the hub lost the agent, be quick: its tunnel is broken anyway
STARTUP_CHECK_S = 2.0  # not connected this long after start: look whether the agent died


@dataclass
class RemoteOptions:
    """What every machine of this backend shares."""

    reconnect_window: float  # seconds to retry a dropped machine (`reconnectWindow`)
    agent_env: dict[str, str] = field(default_factory=dict)  # `agentEnv`: extra agent environment
    wheelhouse: Path | None = None  # `agentWheelhouse`: the agent's dependencies for workers without them


class _Machine:
    """One worker: its SSH connection, forward and agent, and the watch that repairs them."""

    def __init__(self, machine: MachineConfig, spec: AgentSpec, options: RemoteOptions, experiment_id: str,
                 grace: float) -> None:
        self.machine = machine
        self.spec = spec
        self.options = options
        self.experiment_id = experiment_id
        self.grace = grace
        self.label = machine_label(machine)
        host, _, port = spec.hub_address.rpartition(":")
        self.hub = (host, int(port))
        self.client: paramiko.SSHClient | None = None
        self.forward: RemoteForward | None = None
        self.launch: AgentLaunch | None = None
        self.failed = False
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    # -- blocking parts (worker threads) --

    def bootstrap(self, wheel: AgentWheel) -> None:
        self.client = connect(self.machine)
        files = AgentLaunch(self.experiment_id, self.spec.agent_id, wheel.tag, "", "", None, 0, 0)
        found = bootstrap.probe(self.client, self.machine.python_path, wheel.tag, files)
        if not found.installed:
            bootstrap.install(self.client, found, wheel, self.options.wheelhouse, f"{found.python} on {self.label}")
        port = found.running_port if found.running_pid is not None else None
        self.launch = AgentLaunch(
            self.experiment_id, self.spec.agent_id, wheel.tag, found.python or "", found.python_version,
            self.machine.python_path, 0, self.options.reconnect_window + ORPHAN_MARGIN_S, dict(self.options.agent_env),
        )
        if found.running_pid is not None and not found.running_verifies_hub:
            log.warning("%s: agent pid %s was started without the experiment's CA (by an older manager) and would "
                        "talk to whoever answers on its port: stopping it and its trials, starting one that verifies "
                        "the hub", self.label, found.running_pid)
            bootstrap.stop_agent(self.client, self.launch, self.grace)
            found.running_pid = None
        if found.running_pid is not None:  # a restarted manager: re-attach to the running agent
            self._reopen_forward(port)
            log.info("%s: re-attached to running agent pid %s; hub via worker port %s", self.label,
                     found.running_pid, self.launch.remote_port)
            return
        self._open_forward(0)
        self._start_agent()

    def _reopen_forward(self, port: int | None) -> None:
        """Forward the agent's port again; if it is still held (a stale SSH session keeps it),
        forward a new one and point the agent there: its trials never notice."""
        if port is not None and self._open_forward(port):
            return
        self._open_forward(0)
        assert self.client is not None and self.launch is not None
        bootstrap.point_agent(self.client, self.launch)
        log.info("%s: worker port %s still taken; moved the tunnel to port %s", self.label, port,
                 self.launch.remote_port)

    def _open_forward(self, port: int) -> bool:
        assert self.client is not None and self.launch is not None
        forward = RemoteForward(self.client.get_transport(), self.hub)  # type: ignore[arg-type]
        try:
            bound = forward.open(port)
        except (paramiko.SSHException, EOFError) as e:
            if port == 0:
                raise BootstrapError(f"the server refused a remote port forward ({e}); set "
                                     "`AllowTcpForwarding yes` (or `remote`) in its sshd_config") from None
            return False
        self.forward = forward
        self.launch = replace(self.launch, remote_port=bound)
        return True

    def _start_agent(self) -> None:
        assert self.client is not None and self.launch is not None
        pid = bootstrap.start_agent(self.client, self.launch, self.spec.token, self.spec.ca_certificate)
        log.info("%s: agent %s started (pid %s), hub via worker port %s", self.label, self.spec.agent_id, pid,
                 self.launch.remote_port)

    def reconnect(self) -> None:
        """Reconnect and re-open the forward (on the same worker port when it is free)."""
        self.close()
        self.client = connect(self.machine)
        assert self.launch is not None
        self._reopen_forward(self.launch.remote_port)
        log.info("%s: reconnected; tunnel on worker port %s", self.label, self.launch.remote_port)
        self.check_agent()

    def agent_alive(self) -> tuple[bool, str]:
        """Whether the agent's process runs, and what the check printed."""
        assert self.client is not None and self.launch is not None
        return bootstrap.agent_alive(self.client, self.launch)

    def check_agent(self) -> None:
        """Restart the agent (same port) if its process is gone; a hung link raises."""
        assert self.client is not None and self.launch is not None
        alive, output = bootstrap.agent_alive(self.client, self.launch, timeout=HEALTH_TIMEOUT_S)
        if not alive:
            log.warning("%s: agent process is gone, restarting it: %s", self.label, output[-300:])
            self._start_agent()

    def connected(self) -> bool:
        transport = self.client.get_transport() if self.client else None
        return transport is not None and transport.is_active()

    def stop(self) -> str:
        if not self.connected() and self.launch is not None:
            try:
                self.client = connect(self.machine)
            except SshError as e:
                return f"{self.label}: could not reconnect to stop the agent: {e}"
        result = ""
        if self.client is not None and self.launch is not None:
            try:
                done = bootstrap.stop_agent(self.client, self.launch, self.grace)
                if done["still_running"]:
                    result = f"{self.label}: processes still running after SIGKILL: {done['still_running']}"
            except (BootstrapError, paramiko.SSHException, OSError) as e:
                result = f"{self.label}: stopping the agent failed: {e}"
        self.close()
        return result

    def close(self) -> None:
        if self.forward is not None:
            self.forward.close()
            self.forward = None
        if self.client is not None:
            self.client.close()
            self.client = None

    # -- the watch (event loop) --

    async def watch(self, ctx: BackendContext) -> None:
        """Repair dropped links and dead agents; give up after the reconnect window."""
        ever_connected, started, last_ping = False, time.monotonic(), time.monotonic()
        while True:
            woken = await self._sleep()
            try:
                if self.connected() and (woken or time.monotonic() - last_ping > KEEPALIVE_S):
                    # a link can die without EOF (partition, a proxy that keeps its pipe open)
                    last_ping = time.monotonic()
                    if not await self._link_alive(WAKE_PING_TIMEOUT_S if woken else KEEPALIVE_TIMEOUT_S):
                        log.warning("%s: SSH link does not answer; dropping it", self.label)
                        await asyncio.to_thread(self.close)
                    elif woken:  # the hub lost the agent but the link is fine: is the agent alive?
                        await asyncio.to_thread(self.check_agent)
                if not self.connected():
                    if not await self._reconnect_loop(ctx):
                        return
                    continue
                if not ever_connected:
                    ever_connected = ctx.agent_connected(self.spec.agent_id)
                    if not ever_connected and time.monotonic() - started > STARTUP_CHECK_S:
                        alive, output = await asyncio.to_thread(self.agent_alive)
                        if not alive:
                            self._fail(ctx, f"the agent exited right after start; its output: {output[-800:]}")
                            return
                        started = time.monotonic()
            except (SshError, BootstrapError, paramiko.SSHException, OSError, EOFError) as e:
                log.warning("%s: health check failed (%s: %s); reconnecting", self.label, type(e).__name__, e)
                await asyncio.to_thread(self.close)

    async def _link_alive(self, timeout: float) -> bool:
        transport = self.client.get_transport() if self.client else None
        if transport is None:
            return False
        try:  # OpenSSH answers this global request (with a failure): a round trip through sshd
            await wait_for(asyncio.to_thread(transport.global_request, "keepalive@openssh.com"), timeout)
        except asyncio.TimeoutError:
            return False  # the blocked thread ends when close() deactivates the transport
        return True

    async def _sleep(self) -> bool:
        """Wait one poll period; True if agent_lost woke us."""
        try:
            await wait_for(self.wake.wait(), POLL_S)
        except asyncio.TimeoutError:
            return False
        self.wake.clear()
        return True

    async def _reconnect_loop(self, ctx: BackendContext) -> bool:
        log.warning("%s: SSH connection lost; reconnecting for up to %.0f s", self.label, self.options.reconnect_window)
        lost = time.monotonic()
        delay, last_error = 0.2, "no attempt yet"
        while time.monotonic() - lost < self.options.reconnect_window:
            try:
                await asyncio.to_thread(self.reconnect)
                return True
            except (SshError, BootstrapError, paramiko.SSHException, OSError, EOFError) as e:
                last_error = str(e)
                log.info("%s: reconnect attempt failed: %s", self.label, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)
        self._fail(ctx, f"machine unreachable for {self.options.reconnect_window:.0f} s "
                        f"(reconnect window); last error: {last_error}")
        return False

    def _fail(self, ctx: BackendContext, reason: str) -> None:
        self.failed = True
        log.error("%s: %s", self.label, reason)
        ctx.agent_failed(self.spec.agent_id, f"{self.label}: {reason}")


def _hints(m: MachineConfig) -> PlacementHints:
    return PlacementHints(
        gpu_indices=tuple(m.gpu_indices) if m.gpu_indices is not None else None,
        max_trial_number_per_gpu=m.max_trial_number_per_gpu,
        use_active_gpu=m.use_active_gpu,
        host=m.host,
    )


def agent_names(machines: list[MachineConfig]) -> list[str]:
    """Stable agent names (same after a manager restart): user_host_port, -n for repeats."""
    names: list[str] = []
    for m in machines:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", machine_label(m))
        n = sum(1 for name in names if name == base or name.startswith(base + "-"))
        names.append(base if n == 0 else f"{base}-{n + 1}")
    return names


class RemoteBackend(FixedBackend[RemoteConfig]):
    platform = "remote"
    default_reconnect_window = 600.0  # machines behind flaky links get ten minutes to come back

    options_type = RemoteConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> RemoteConfig:
        return remote_config.parse(section, config)

    @property
    def machine_list(self) -> list[MachineConfig]:
        return self.opts.machine_list

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.options = RemoteOptions(reconnect_window=self.reconnect_window, agent_env=self.agent_env,
                                     wheelhouse=config.agent_wheelhouse)
        self.machines: list[_Machine] = []

    async def start(self, ctx: BackendContext) -> None:
        machine_list = self.machine_list
        if not machine_list:
            raise ValueError("config field `trainingService.machineList`: empty; list at least one machine")
        wheel = await asyncio.to_thread(build_agent_wheel, ctx.experiment_dir / "agent-wheel")
        grace = self.config.trial_grace_period + 5.0
        for m, name in zip(machine_list, agent_names(machine_list)):
            spec = ctx.add_agent(name, _hints(m))
            self.machines.append(_Machine(m, spec, self.options, ctx.experiment_id, grace))
        await asyncio.gather(*(self._bootstrap(ctx, mach, wheel) for mach in self.machines))

    async def _bootstrap(self, ctx: BackendContext, mach: _Machine, wheel: AgentWheel) -> None:
        try:
            await asyncio.to_thread(mach.bootstrap, wheel)
        except (SshError, BootstrapError, paramiko.SSHException, OSError, EOFError) as e:
            await asyncio.to_thread(mach.close)
            mach._fail(ctx, f"bootstrap failed: {e}")
            return
        mach.task = asyncio.create_task(mach.watch(ctx), name=f"remote-watch {mach.label}")

    async def agent_lost(self, agent_id: str) -> None:
        for mach in self.machines:
            if mach.spec.agent_id == agent_id:
                mach.wake.set()

    async def stop(self) -> None:
        for mach in self.machines:
            if mach.task is not None:
                mach.task.cancel()
        await asyncio.gather(*(m.task for m in self.machines if m.task), return_exceptions=True)
        problems = await asyncio.gather(*(asyncio.to_thread(m.stop) for m in self.machines if not m.failed))
        for problem in filter(None, problems):
            log.error("%s", problem)
        self.machines.clear()

    def render(self) -> DryRun:
        lines = [f"remote: {len(self.machine_list)} machine(s); agent nni-agent "
                 f"{nni_agent.__version__} from a wheel built from this manager"]
        requests = []
        for m, name in zip(self.machine_list, agent_names(self.machine_list)):
            launch = AgentLaunch("<experiment-id>", "<agent-id>", f"{nni_agent.__version__}-<hash>",
                                 "<python found by the probe>", "<py>", m.python_path, 0,
                                 self.options.reconnect_window + ORPHAN_MARGIN_S, dict(self.options.agent_env))
            proxy = proxy_command_line(m)
            lines += [
                f"- {name}: ssh {'via proxyCommand `' + proxy + '`' if proxy else 'direct'}, "
                f"host key {'checked against ' + str(m.known_hosts_file or '~/.ssh/known_hosts') if m.strict_host_key_checking else 'NOT checked'}",
                f"  python candidates: {', '.join(bootstrap.candidates(m.python_path))} (first >= {MIN_PYTHON_TEXT} wins)",
                f"  install (unless present): upload wheel by SFTP, unpack into ~/.nni-agent/{launch.tag}/lib",
                "  forward: worker 127.0.0.1:<forwarded-port> -> hub over this SSH connection",
                "  CA: the experiment's CA certificate uploaded by SFTP beside the token; the agent trusts "
                "only it (TLS through the tunnel)",
                "  start (token written from stdin to a 0600 file, never on a command line):",
                *("    " + line for line in bootstrap.start_command(launch).splitlines()),
            ]
            requests.append({"agent": name, "host": m.host, "port": m.port, "user": m.user, "proxy_command": proxy,
                             "start_command": bootstrap.start_command(launch)})
        return DryRun(self.platform, requests, "\n".join(lines))
