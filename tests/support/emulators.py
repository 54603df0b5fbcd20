"""What the REST and Kubernetes emulators' fixtures share: starting one in its own process and
waiting for the port file it writes (atomically) once it listens."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from tests.support import fork_server
from tests.support.fork_server import ServedProcess
from tests.support.polling import intervals

ROOT = Path(__file__).resolve().parents[2]


def start_emulator_process(module: str, state: Path, args: list[str], *, what: str,
                           drop_env: tuple[str, ...] = (), state_flag: str = "--state",
                           timeout: float = 90.0) -> subprocess.Popen[bytes] | ServedProcess:
    """`python -m module --state STATE *args`, its output in STATE/emulator.log, without the
    environment variables whose names start with one of `drop_env`; returns once STATE/port exists.
    An emulator takes about 2 s to start on an idle machine; the suite's parallel workers (and whatever
    else shares the cores) can stretch its imports past 20 s, hence the generous bound."""
    env = {k: v for k, v in os.environ.items() if not any(k.startswith(p) for p in drop_env)}
    proc: subprocess.Popen[bytes] | ServedProcess
    if fork_server.enabled():  # forked from a server that imported the emulator once (fork_server.py)
        proc = fork_server.server().start(module, [state_flag, str(state), *args], env=env, cwd=str(ROOT),
                                          log=str(state / "emulator.log"))
    else:
        with open(state / "emulator.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", module, state_flag, str(state), *args], cwd=str(ROOT),
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while not (state / "port").exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: " + (state / "emulator.log").read_text()[-3000:])
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start: " + (state / "emulator.log").read_text()[-3000:])
        time.sleep(0.01)
    return proc


@contextmanager
def emulator_factory(prefix: str, start: Callable[..., Any], what: str) -> Iterator[Callable[..., Any]]:
    """The body of an `<x>_factory` fixture: `make(**options)` starts an emulator (`start(base,
    **options)`) in a fresh directory; at the end every one is stopped, and the test fails if any
    process it started outlived it (they are killed first)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    started: list[Any] = []

    def make(**options: Any) -> Any:
        emulator = start(base, **options)
        started.append(emulator)
        return emulator

    yield make
    leftovers = {}
    for emulator in started:
        emulator.stop()
        left = emulator.leftover_processes()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if left:
            leftovers[emulator.instance] = left
    shutil.rmtree(base, ignore_errors=True)
    assert not leftovers, f"processes left behind by {what}: {leftovers}"


def marked_pids(key: str, value: str) -> list[int]:
    """Pids whose initial environment holds KEY=VALUE (readable for our own user's processes)."""
    needle = f"{key}={value}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(d))
        except OSError:
            pass
    return out


class EmulatorHandle:
    """What a test holds of a running emulator process: waiting on it, the processes it started
    (each carries `marker`=<instance> in its environment), stopping it."""

    marker: ClassVar[str]
    stop_wait: ClassVar[float] = 15.0  # seconds the emulator gets to end its tasks after SIGTERM
    kill_leftovers_on_stop: ClassVar[bool] = True  # belt and braces; the factory still fails on them
    proc: subprocess.Popen[bytes] | ServedProcess
    instance: str

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05,
                 what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        for gap in intervals(interval):  # tests/support/polling.py: soon, then less often
            v = predicate()
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(gap)
        raise AssertionError("unreachable")

    def leftover_processes(self) -> list[int]:
        return marked_pids(self.marker, self.instance)

    def stop(self) -> None:
        """SIGTERM the emulator: it kills every task process tree, then exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.kill_leftovers_on_stop:
            for pid in self.leftover_processes():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


class RestControls(EmulatorHandle):
    """The control endpoints the AML, DLTS and DLC emulators share (`/_emulator/...`): fault
    injection, the jobs with their processes, the requests received."""

    job_key: ClassVar[str]  # the field that names a job in `jobs()`

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        raise NotImplementedError

    def fault(self, status: int | None = 503, count: int = 1, method: str | None = None, path: str | None = None,
              retry_after: int | None = None, hang: float = 0.0, message: str | None = None,
              lose_answer: bool = False) -> None:
        """Answer the next `count` API requests matching method/path (regex) with `status` in the
        platform's own error body, after hanging `hang` seconds; status None = hang only;
        lose_answer: serve them, then drop the connection (the AML emulator)."""
        spec = {"status": status, "count": count, "method": method, "path": path,
                "retry_after": retry_after, "hang": hang, "message": message}
        if lose_answer:
            spec["lose_answer"] = True
        self._call("POST", "faults", spec)

    def clear_faults(self) -> None:
        self._call("DELETE", "faults")

    def jobs(self) -> list[dict]:
        """Every job, as the platform records it plus history, exit codes, pids and task dirs."""
        return self._call("GET", "jobs")

    def job(self, key: str) -> dict:
        for j in self.jobs():
            if j[self.job_key] == key:
                return j
        raise KeyError(key)

    def live_pids(self) -> list[int]:
        return self._call("GET", "pids")["pids"]

    def requests(self) -> list[dict]:
        return self._call("GET", "requests")
