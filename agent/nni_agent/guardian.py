"""The guardian: an agent's trials die with it, however it dies (Linux).

Trials run in their own sessions, and while the agent lives it is their subreaper and kills
whole trees. A SIGKILLed agent (the OOM killer, `kill -9`, a supervisor giving up) runs no
cleanup, and its trials would run on, reparented to init, holding GPUs nobody reads.

So the agent starts one tiny helper once, at start-up: `python -I -S -c` with the code
below (a few MB, its own session, deaf to SIGINT/SIGTERM/SIGHUP, so a signal to the agent's
group or job reaches only the agent, which stops its trials itself). It blocks reading a
pipe whose only write end the agent holds (non-inheritable: trials never get it). EOF
means the agent is gone, by any means. The guardian then SIGKILLs every process whose
environment carries this agent's marker (MARKER_ENV=<boot_id>/<trial_id>, see process.py;
boot ids are random, so other agents' trials are never touched), and the process groups
those processes are in (which catches members that dropped the marker, such as `env -i`),
until none is left, and exits. It holds a pidfd while it checks a process, so a recycled
pid is never signalled.

The guardian needs no word from the agent while trials start and end: the marker says
which processes are ours, and groups are taken from live marked processes (never from a
stale list of group ids, which could have been recycled).

A normal exit (the manager's shutdown, SIGTERM, the orphan timeout, the end of a
--single-trial run) has stopped every trial already (Keeper.shutdown), so the guardian
finds nothing and exits with the agent. No path expects trials to outlive their agent: a
restarted agent has a new boot id and the manager ends the old boot's trials ("agent
restarted and lost the trial").

Not used: PR_SET_PDEATHSIG on each trial. It needs preexec_fn (unsafe in the threaded
agent), reaches only the trial's first process, not the daemons it starts, and fires when
the forking *thread* ends rather than the agent.
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

from nni_agent.compat import to_thread, wait_for
from nni_agent.process import MARKER_ENV, child_reaper

log = logging.getLogger(__name__)

ARGV_TAG = "nni-agent-guardian"  # in the guardian's command line, for `ps` and tests
EXIT_TIMEOUT_S = 5.0

# Runs with -I -S: no site, no user environment, only builtin modules.
_CODE = r"""# nni-agent guardian: SIGKILLs the agent's trials once the agent is gone (see nni_agent/guardian.py)
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
want = b"\0" + sys.argv[2].encode()
spare = {0, 1, os.getpgid(0), os.getpgid(os.getppid())}
while os.read(0, 4096):
    pass

def kill(pid):
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        fd = None
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            if want not in b"\0" + f.read():
                return False
        pgid = os.getpgid(pid)
        if fd is not None:
            signal.pidfd_send_signal(fd, 0)
        if pgid not in spare:
            os.killpg(pgid, signal.SIGKILL)
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)

me = os.getpid()
for _ in range(100):
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    if not sum(kill(pid) for pid in pids):
        break
    time.sleep(0.05)
"""


class Guardian:
    """The agent's end of the guardian: hold the pipe; close it on a normal exit."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int) -> None:
        self.pid = proc.pid
        self._write_fd: int | None = write_fd
        self._exited = child_reaper().wait_for(proc.pid)  # the agent's reaper collects it
        self._exited.add_done_callback(self._on_exit)

    @classmethod
    async def start(cls, agent_key: str) -> Guardian | None:
        """Start the guardian of the agent whose trials carry `agent_key`; None where it cannot run
        (not Linux, no interpreter to run it): trials then only die with an agent that can stop them."""
        if not sys.platform.startswith("linux") or not sys.executable:
            return None
        try:
            proc, write_fd = await to_thread(_spawn, f"{MARKER_ENV}={agent_key}/")
        except OSError as exc:
            log.warning("cannot start the guardian (%s): trials would outlive a killed agent", exc)
            return None
        return cls(proc, write_fd)

    async def close(self) -> None:
        """The agent ends normally (its trials are stopped): let the guardian exit, and reap it."""
        if self._write_fd is None:
            return
        os.close(self._write_fd)
        self._write_fd = None
        try:
            await wait_for(asyncio.shield(self._exited), EXIT_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("the guardian (pid %d) is still looking for trial processes", self.pid)

    def _on_exit(self, exited: asyncio.Future[int]) -> None:
        if self._write_fd is not None and not exited.cancelled():
            log.warning("the guardian (pid %d) ended (wait status %d): trials would outlive a killed agent",
                        self.pid, exited.result())


def _spawn(marker_prefix: str) -> tuple[subprocess.Popen[bytes], int]:
    read_fd, write_fd = os.pipe()  # both non-inheritable; Popen hands the read end over as stdin
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CODE, ARGV_TAG, marker_prefix],
            stdin=read_fd, stdout=subprocess.DEVNULL, env={}, start_new_session=True, close_fds=True,
        )
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    proc.returncode = 0  # reaped by ChildReaper, never by subprocess
    return proc, write_fd
