"""Workloads as real local process trees, shared by the DLTS, AML and DLC emulators.

A task is a bash script file (never argv: commands may hold secrets) run in its own session.
Every process of a task carries two marker variables in its environment, so the emulator can
find and kill descendants that left the process group (setsid, daemonised helpers) and tests
can assert that nothing is left behind.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.emulators import marked_pids

# the Kubernetes emulator's container start: a private mount namespace with files bind-mounted
CONTAINER_INIT = str(Path(__file__).resolve().parent / "kube" / "emulator" / "container_init.py")
TERMINATION_LOG = "/dev/termination-log"




def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


@dataclass
class Task:
    key: str
    proc: asyncio.subprocess.Process
    dir: Path
    exit_code: int | None = None
    killed_by: str | None = None            # why the emulator (or a test) killed it
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ProcessRunner:
    """Starts, watches and kills tasks; `mark` names the environment markers (e.g. DLTS_EMULATOR)."""

    def __init__(self, root: Path, mark: str, instance: str):
        self.root, self.mark, self.instance = root, mark, instance
        self.tasks: dict[str, Task] = {}

    def _task_mark(self) -> str:
        return f"{self.mark}_TASK"

    async def start(self, key: str, script: str, env: dict[str, str], cwd: Path | None = None,
                    termination_log: bool = False) -> Task:
        """Run `script` with bash from a 0700 file under root/key; stdout/stderr go to files there.
        termination_log: as in a Kubernetes container, the task sees a file of its own at
        /dev/termination-log (root/key/termination-log here; `termination_message` reads it), in a
        private mount namespace (needs root; without it the task has none)."""
        d = self.root / key
        d.mkdir(parents=True, exist_ok=True)
        path = d / "command.sh"
        path.write_text(script if script.endswith("\n") else script + "\n")
        os.chmod(path, 0o700)
        work = cwd or d / "work"
        work.mkdir(parents=True, exist_ok=True)
        # a container's /tmp is its own and goes with it: the task's TMPDIR is a directory of its own
        # (the job's env may name another); what a test leaves goes with the emulator's state
        (d / "tmp").mkdir(mode=0o1777, exist_ok=True)
        os.chmod(d / "tmp", 0o1777)
        full_env = {"TMPDIR": str(d / "tmp"), **env, self.mark: self.instance,
                    self._task_mark(): f"{self.instance}/{key}"}
        argv = ["bash", str(path)]
        if termination_log and os.geteuid() == 0:
            (d / "termination-log").write_text("")
            os.chmod(d / "termination-log", 0o666)  # as the kubelet makes it: any container user writes it
            (d / "scratch").mkdir(exist_ok=True)
            spec = {"namespaces": True, "hostname": key[:63], "scratch": str(d / "scratch"), "workingDir": str(work),
                    "mounts": [{"source": str(d / "termination-log"), "target": TERMINATION_LOG}],
                    "argv": argv, "env": full_env}
            (d / "spec.json").write_text(json.dumps(spec))
            os.chmod(d / "spec.json", 0o600)
            argv = [sys.executable, "-I", CONTAINER_INIT, str(d / "spec.json")]
        with open(d / "stdout", "ab") as out, open(d / "stderr", "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=str(work), env=full_env, stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True)
        task = Task(key, proc, d)
        self.tasks[key] = task
        asyncio.ensure_future(self._reap(task))
        return task

    async def _reap(self, task: Task) -> None:
        code = await task.proc.wait()
        task.exit_code = code
        task.done.set()

    def termination_message(self, key: str) -> str:
        """What the task wrote to its /dev/termination-log (the kubelet reads at most 4096 bytes)."""
        try:
            with open(self.root / key / "termination-log", "rb") as f:
                return f.read(4096).decode(errors="replace")
        except OSError:
            return ""

    def pids(self, key: str | None = None) -> list[int]:
        """Live processes of one task (key) or of every task of this emulator instance."""
        if key is None:
            return marked_pids(self.mark, self.instance)
        return marked_pids(self._task_mark(), f"{self.instance}/{key}")

    def signal(self, key: str, sig: int) -> None:
        task = self.tasks.get(key)
        if task is not None and task.exit_code is None:
            try:
                os.killpg(task.proc.pid, sig)
            except OSError:
                pass
        _signal_all(self.pids(key), sig)

    async def kill(self, key: str, grace: float = 2.0, reason: str = "killed") -> None:
        """SIGTERM the whole tree, SIGKILL what is left after `grace`, and wait for the leader."""
        task = self.tasks.get(key)
        if task is not None and task.killed_by is None:
            task.killed_by = reason
        self.signal(key, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while loop.time() < deadline:
            if (task is None or task.done.is_set()) and not self.pids(key):
                return
            await asyncio.sleep(0.02)
        for _ in range(50):
            self.signal(key, signal.SIGKILL)
            if (task is None or task.done.is_set()) and not self.pids(key):
                return
            await asyncio.sleep(0.02)

    async def shutdown(self) -> None:
        """Kill every task tree of this instance (the emulator is going away)."""
        await asyncio.gather(*(self.kill(k, grace=1.0, reason="emulator shutdown") for k in list(self.tasks)))
        for _ in range(50):
            left = self.pids()
            if not left:
                return
            _signal_all(left, signal.SIGKILL)
            await asyncio.sleep(0.02)
