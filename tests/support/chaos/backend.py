"""`relayed`: a fixed backend for the chaos tests, registered through the entry-point group.

It starts real `nni-agent` processes on this machine, as the remote backend does over SSH,
but each dials the hub through a `ChaosRelay` (127.0.0.1) instead of a tunnel, and keeps its
work directory outside the experiment directory (the worker's own disk). Settings come from
class attributes the test sets before starting the service (the service runs in the test's
own event loop, next to the relay).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from nni_manager.backends.base import Backend, BackendContext
from tests.support.chaos.relay import ChaosRelay


class RelayedBackend(Backend):
    platform = "relayed"
    hub = "loopback"  # 127.0.0.1 TCP with the experiment's TLS, which only the relay dials
    ships_code = False  # agents read trialCodeDirectory in place
    default_reconnect_window = 60.0

    relay: ClassVar[ChaosRelay | None] = None
    agents: ClassVar[int] = 1
    work_root: ClassVar[Path] = Path("/nonexistent")
    heartbeat: ClassVar[float | None] = None
    procs: ClassVar[dict[str, subprocess.Popen[bytes]]] = {}
    launches: ClassVar[dict[str, tuple[list[str], dict[str, str]]]] = {}  # agent id -> (argv, env)
    ca_certificate: ClassVar[bytes] = b""  # the hub's CA, as the agents got it (for tests that dial too)
    front: ClassVar[str] = ""  # "127.0.0.1:<port>" agents dial instead of the relay (a relay in front of it)
    relay_token_file: ClassVar[Path | None] = None  # ... which wants this relay token (--relay-token-file)

    async def start(self, ctx: BackendContext) -> None:
        relay = RelayedBackend.relay
        assert relay is not None, "set RelayedBackend.relay first"
        RelayedBackend.procs, RelayedBackend.launches = {}, {}
        for i in range(RelayedBackend.agents):
            spec = ctx.add_agent(f"worker{i}")
            relay.target = spec.hub_address
            if not relay.port:
                await relay.start()
            work = RelayedBackend.work_root / spec.agent_id
            work.mkdir(parents=True, exist_ok=True)
            ca = work / "ca.crt"  # TLS end to end through the relay, as through a tunnel
            ca.write_bytes(spec.ca_certificate)
            RelayedBackend.ca_certificate = spec.ca_certificate
            env = dict(os.environ, NNI_AGENT_TOKEN=spec.token)
            dial = RelayedBackend.front or f"127.0.0.1:{relay.port}"
            argv = [sys.executable, "-m", "nni_agent", "--manager", dial, "--ca-file", str(ca),
                    "--agent-id", spec.agent_id, "--work-dir", str(work),
                    "--orphan-timeout", str(self.reconnect_window), "--log-file", str(work / "agent.log")]
            if RelayedBackend.relay_token_file is not None:
                argv += ["--relay-token-file", str(RelayedBackend.relay_token_file)]
            RelayedBackend.launches[spec.agent_id] = (argv, env)
            RelayedBackend.procs[spec.agent_id] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                                                   start_new_session=True)

    @classmethod
    def restart_agent(cls, agent_id: str) -> None:
        """Kill the agent (its whole session) and start a fresh process: a new agent that dials in."""
        proc = cls.procs[agent_id]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        argv, env = cls.launches[agent_id]
        cls.procs[agent_id] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)

    async def stop(self) -> None:
        """The hub already sent Shutdown; whatever has not exited in time is killed."""
        for proc in RelayedBackend.procs.values():
            for sig, wait in ((None, self.config.trial_grace_period + 10), (signal.SIGTERM, 5.0),
                              (signal.SIGKILL, 5.0)):
                if sig is not None and proc.poll() is None:
                    proc.send_signal(sig)
                try:
                    await asyncio.wait_for(asyncio.to_thread(proc.wait), wait)
                    break
                except asyncio.TimeoutError:
                    continue
