"""platform: local — one nni-agent subprocess on this machine, connected over hub.sock.

The agent gets the manager's environment (so NNI_AGENT_ARTIFICIAL_GPUS and friends reach
it) plus its token in NNI_AGENT_TOKEN, and `--orphan-timeout`, so it stops its trials and
exits if the manager dies; a manager restarted within that time re-attaches to it.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from nni_manager.backends.agent_command import AgentCommand
from nni_manager.backends.base import BackendContext, FixedBackend, DryRun, PlacementHints
from nni_manager.config import ConfigSection, ExperimentConfig

AGENT_NAME = "local"


class LocalBackend(FixedBackend[None]):
    platform = "local"
    # The agent outlives an unreachable manager this long (then stops every trial), so a
    # manager restarted quickly re-attaches, and a killed one leaves nothing running for long.
    default_reconnect_window = 30.0
    hub = "unix"  # the agent uses hub.sock, in the owner-only experiment directory
    ships_code = False  # the agent reads trialCodeDirectory in place
    options_type = type(None)  # no field of its own

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> None:
        return None

    _proc: subprocess.Popen[bytes] | None = None
    _pid: int | None = None
    _stop_wait: float = 15.0

    async def start(self, ctx: BackendContext) -> None:
        ts = self.config.training_service
        hints = PlacementHints(
            gpu_indices=None if ts.gpu_indices is None else tuple(ts.gpu_indices),
            max_trial_number_per_gpu=ts.max_trial_number_per_gpu,
            use_active_gpu=bool(ts.use_active_gpu),
        )
        spec = ctx.add_agent(AGENT_NAME, hints)
        work_dir = ctx.experiment_dir / "agents" / AGENT_NAME
        work_dir.mkdir(parents=True, exist_ok=True)
        pid_file = work_dir / "agent.pid"
        self._stop_wait = self.config.trial_grace_period + 10
        adopted = _running_agent(pid_file, work_dir)
        if adopted is not None:  # a restarted manager: the old agent re-attaches by itself
            self._pid = adopted
            return
        env = dict(os.environ, **self.agent_env, NNI_AGENT_TOKEN=spec.token)
        argv = self._argv(str(spec.hub_unix_socket), spec.agent_id, str(work_dir))
        with open(work_dir / "agent.log", "ab") as out:
            self._proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C on the manager's terminal is the manager's to handle
            )
        self._pid = self._proc.pid
        pid_file.write_text(str(self._pid))

    async def stop(self) -> None:
        """The hub already sent Shutdown: wait for the agent to exit, then TERM, then KILL."""
        if self._pid is None:
            return
        for sig, wait in ((None, self._stop_wait), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                try:
                    os.kill(self._pid, sig)
                except ProcessLookupError:
                    break
            if await self._exited(wait):
                break
        self._pid = None

    async def _exited(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None:
                if self._proc.poll() is not None:
                    return True
            elif not psutil.pid_exists(self._pid or 0) or _zombie(self._pid or 0):
                return True
            await asyncio.sleep(0.05)
        return False

    def _argv(self, socket: str, agent_id: str, work_dir: str) -> list[str]:
        """The manager's own Python runs the boot step (checks, then `python -m nni_agent`)."""
        return AgentCommand(agent_id=agent_id, manager=f"unix:{socket}", work_dir=work_dir,
                            orphan_timeout=self.reconnect_window, where="the manager's machine").argv(sys.executable)

    def render(self) -> DryRun:
        argv = self._argv("<experiment dir>/hub.sock", AGENT_NAME, f"<experiment dir>/agents/{AGENT_NAME}")
        return DryRun(self.platform, [argv], "local: one nni-agent subprocess, token in NNI_AGENT_TOKEN:\n  "
                      + " ".join(argv))


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _running_agent(pid_file: Path, work_dir: Path) -> int | None:
    """The pid of this experiment's agent from an earlier manager run, if it still runs."""
    try:
        pid = int(pid_file.read_text())
        cmdline = psutil.Process(pid).cmdline()
    except (OSError, ValueError, psutil.Error):
        return None
    if "nni_agent" in cmdline and str(work_dir) in cmdline and not _zombie(pid):
        return pid
    return None
