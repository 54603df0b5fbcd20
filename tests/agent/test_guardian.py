"""Trials die with their agent, however it dies: its guardian kills them when the agent is
SIGKILLed, and leaves with the agent when it exits normally."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psutil

from nni_agent.guardian import ARGV_TAG, Guardian
from nni_agent.process import MARKER_ENV
from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.hubstub import HubStub, StubServer, start_trial
from tests.support.bounded import run_bounded

PY = sys.executable
GUARDIAN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    return run_bounded(coro, 120)


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie; False for a recycled pid (psutil checks the start time)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


async def _until(cond: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def _all_gone(procs: list[psutil.Process], what: str) -> None:
    try:
        await _until(lambda: not [p for p in procs if _running(p)], what, timeout=10)
    finally:
        for p in procs:  # never outlive the test, whatever it found
            with contextlib.suppress(psutil.NoSuchProcess):
                if _running(p):
                    p.kill()


def _ignored_signals(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
    return {sig for sig in GUARDIAN_SIGNALS if mask >> (sig - 1) & 1}


def _guardian_of(agent: psutil.Process) -> psutil.Process | None:
    return next((p for p in agent.children() if ARGV_TAG in p.cmdline()), None)


def _trial_command(tmp_path: Path) -> str:
    """A trial that leaves its session (a double-forked daemon), keeps an unmarked process in
    its own group (`env -i`), and then waits."""
    daemon = (f"import os, sys, time; os.fork() and sys.exit(); os.setsid(); "
              f"open({str(tmp_path / 'daemon.pid')!r}, 'w').write(str(os.getpid())); time.sleep(300)")
    ready = f"import time; open({str(tmp_path / 'ready')!r}, 'w').close(); time.sleep(300)"
    return f"{PY} -c \"{daemon}\"; env -i /bin/sleep 300 & exec {PY} -c \"{ready}\""


def test_a_sigkilled_agent_leaves_no_trial_process_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            proc = await srv.connect_agent(tmp_path / "w")
            agent = psutil.Process(proc.pid)
            hub.send(**start_trial("grd01", _trial_command(tmp_path)))
            await hub.wait_for(lambda: bool(hub.trials["grd01"].statuses), 30)
            await _until(lambda: (tmp_path / "ready").exists() and (tmp_path / "daemon.pid").exists(),
                         "the trial and its daemon")
            daemon = int((tmp_path / "daemon.pid").read_text())
            left = agent.children(recursive=True)
            guardian = _guardian_of(agent)
            assert guardian is not None and guardian in left
            root = hub.trials["grd01"].statuses[0].pid
            assert {root, daemon} <= {p.pid for p in left} and len(left) == 4  # + guardian, `env -i` sleep
            assert os.getsid(daemon) != os.getsid(root)  # left the trial's session
            proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
            await _all_gone(left, "the killed agent's trial processes and its guardian to be gone")

    _run(scenario())


def test_an_agent_that_exits_normally_takes_its_guardian_along(tmp_path: Path) -> None:
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            proc = await srv.connect_agent(tmp_path / "w", args=("--single-trial",))
            agent = psutil.Process(proc.pid)
            guardian = await _until(lambda: _guardian_of(agent), "the guardian")
            await _until(lambda: _ignored_signals(guardian.pid) == set(GUARDIAN_SIGNALS), "the guardian to be ready")
            guardian.send_signal(signal.SIGTERM)  # what a scheduler sends the whole job: the agent alone reacts
            hub.send(**start_trial("grd02", f"{PY} -c 'print(42)'"))
            code = await asyncio.to_thread(proc.wait, 60)
            assert code == 0
            assert hub.trials["grd02"].final is not None
            assert hub.trials["grd02"].final.state == pb.TRIAL_STATE_SUCCEEDED
            await _all_gone([guardian], "the guardian to exit with the agent")
        log = (tmp_path / "agent-1.log").read_text()
        assert "guardian" not in log  # it was neither missing nor gone early

    _run(scenario())


def test_the_guardian_kills_its_agents_trials_only(tmp_path: Path) -> None:
    """EOF on the pipe, as when the agent dies: processes with this agent's marker die, with the
    unmarked members of their process groups; another agent's trials live on."""

    def sleeper(marker: str, command: str = "exec sleep 300") -> psutil.Process:
        env = {**os.environ, MARKER_ENV: marker}
        child = subprocess.Popen(["/bin/sh", "-c", command], env=env, start_new_session=True)
        return psutil.Process(child.pid)

    async def scenario() -> None:
        guardian = await Guardian.start("bootA")
        assert guardian is not None
        ours = [sleeper("bootA/t1"), sleeper("bootA/t2", "env -i sleep 300 & exec sleep 301")]
        theirs = sleeper("bootB/t1")
        try:
            await _until(lambda: len(ours[1].children()) == 1 and ours[1].name() == "sleep", "the trials")
            ours += ours[1].children()  # without the marker, in a marked process' group
            await guardian.close()
            await _all_gone(ours, "this agent's trial processes to be gone")
            assert _running(theirs)
        finally:
            theirs.kill()

    _run(scenario())
