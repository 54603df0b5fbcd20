"""Emulator processes forked from a pre-imported server instead of started from scratch.

An emulator is a real process of its own, but about half of its start is Python importing aiohttp
and the emulator's modules (0.35 of 0.75 CPU s for the Kubernetes one), and the suite starts
about 265 of them. One server per pytest worker imports an emulator's modules once (on the first
request for it) and forks a child per start; the child takes the environment, working directory
and log (truncated, as a new one) the caller asked for, then runs the emulator's `main()` as `python -m` would. Nothing is
shared after the fork: each emulator is still its own process with its own sockets and children.

`ServedProcess` is what the fixtures hold instead of a `subprocess.Popen`: pid, returncode,
poll(), wait(), send_signal(), terminate(), kill(). The server reaps its children and answers
their exit status; signals go through a pidfd, so a reused pid is never signalled.

`NNI_TEST_FORK_SERVER=0` starts emulators as plain subprocesses again (and so does a Python or
kernel without pidfds).

Run as `python -m tests.support.fork_server SOCKET`: the server itself."""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ENV = "NNI_TEST_FORK_SERVER"
PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------------------------------- client
class ServedProcess:
    """A child of the fork server, held like a `subprocess.Popen`."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server, self.pid = server, pid
        self._pidfd = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self.returncode = self._server.exit_status(self.pid)
            if self.returncode is not None:
                os.close(self._pidfd)
                self._pidfd = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"emulator {self.pid}", timeout or 0.0)
            if self._pidfd >= 0:  # readable once the process has exited; then its status is a moment away
                ready = select.select([self._pidfd], [], [], 0.25 if left is None else min(left, 0.25))[0]
                if ready:
                    time.sleep(0.002)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if getattr(self, "_pidfd", -1) >= 0:
            os.close(self._pidfd)


class ForkServer:
    """The client side: one server process per pytest worker, started on first use."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="nni-fork-"))
        self._path = str(self._dir / "sock")
        self._lock = threading.Lock()
        env = dict(os.environ)
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.support.fork_server", self._path],
                                      cwd=str(Path(__file__).resolve().parents[2]), env=env,
                                      stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(self._path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the emulators' fork server did not start")
            time.sleep(0.005)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self._path)
            s.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError("the emulators' fork server closed the connection")
                data += chunk
        reply = json.loads(data)
        if "error" in reply:
            raise RuntimeError(f"the emulators' fork server: {reply['error']}")
        return reply

    def start(self, module: str, argv: list[str], *, env: dict[str, str], cwd: str, log: str) -> ServedProcess:
        """`python -m module *argv` with `env` in `cwd`, stdout and stderr appended to `log`."""
        reply = self._ask({"op": "fork", "module": module, "argv": argv, "env": env, "cwd": cwd, "log": log})
        return ServedProcess(self, int(reply["pid"]))

    def exit_status(self, pid: int) -> int | None:
        return self._ask({"op": "status", "pid": pid}).get("returncode")

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        from tests.support.stopping import terminate

        terminate(self._proc)
        try:
            os.unlink(self._path)
            os.rmdir(self._dir)
        except OSError:
            pass


_server: tuple[int, ForkServer] | None = None


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0" and sys.platform.startswith("linux") and hasattr(os, "pidfd_open") \
        and hasattr(signal, "pidfd_send_signal")


def server() -> ForkServer:
    """This process's fork server (a forked pytest worker gets a server of its own)."""
    global _server
    if _server is None or _server[0] != os.getpid() or not _server[1].alive():
        import atexit

        _server = (os.getpid(), ForkServer())
        atexit.register(_server[1].close)
    return _server[1]


# ---------------------------------------------------------------------------------------- server
_exited: dict[int, int] = {}
_children: set[int] = set()


def _reap(*_: object) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in _children:
            _children.discard(pid)
            _exited[pid] = os.waitstatus_to_exitcode(status)


def _child(request: dict[str, Any], listener: socket.socket, conn: socket.socket) -> None:
    """In the forked child: become `python -m module *argv` and never return."""
    code = 1
    try:
        listener.close()
        conn.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        module = request["module"]
        sys.argv = [module, *request["argv"]]
        importlib.import_module(f"{module}.server").main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve(path: str) -> None:
    try:  # ends with the pytest worker that started it
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        return
    signal.signal(signal.SIGCHLD, _reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path + ".tmp"
    listener.bind(tmp)
    os.chmod(tmp, 0o600)  # our own user only
    listener.listen(16)
    os.rename(tmp, path)  # the client waits for the name: it appears once the server listens
    while True:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data.endswith(b"\n"):
                continue
            request = json.loads(data)
            try:
                if request["op"] == "fork":
                    importlib.import_module(f"{request['module']}.server")  # warm for this and every later fork
                    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # no reap before the pid is ours
                    pid = -1
                    try:
                        pid = os.fork()
                        if pid == 0:
                            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
                            _child(request, listener, conn)
                        _children.add(pid)
                    finally:
                        if pid != 0:
                            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
                    reply: dict[str, Any] = {"pid": pid}
                elif request["op"] == "status":
                    _reap()
                    reply = {"returncode": _exited.get(int(request["pid"]))}
                else:
                    reply = {"error": f"unknown request {request['op']!r}"}
            except Exception as e:  # noqa: BLE001 - said to the client, which raises it
                reply = {"error": f"{type(e).__name__}: {e}"}
            conn.sendall(json.dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    _serve(sys.argv[1])
