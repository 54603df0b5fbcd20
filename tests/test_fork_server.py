"""The emulators' fork server (tests/support/fork_server.py): an emulator forked from it is started
as `python -m` would start it (its argv, the environment and working directory asked for, its
output in its log), and is held like a subprocess (poll, wait, signals, exit codes)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.support import fork_server

pytestmark = pytest.mark.skipif(not fork_server.enabled(), reason="the fork server needs Linux pidfds "
                                f"(or {fork_server.ENV}=0 turned it off)")

ROOT = Path(__file__).resolve().parents[1]


def _started(tmp_path: Path, *extra: str) -> tuple[fork_server.ServedProcess, dict]:
    out = tmp_path / "probe.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "ONLY_FOR_THE_PROBE": "yes"}
    proc = fork_server.server().start("tests.support.fork_probe", ["--out", str(out), *extra], env=env,
                                      cwd=str(tmp_path), log=str(tmp_path / "probe.log"))
    deadline = time.monotonic() + 60
    while not out.exists():
        assert time.monotonic() < deadline, (tmp_path / "probe.log").read_text()
        time.sleep(0.01)
    return proc, json.loads(out.read_text())


def test_a_forked_emulator_runs_with_what_it_was_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOT_FOR_THE_PROBE", "1")  # the caller's environment is not inherited
    proc, seen = _started(tmp_path, "--exit", "3")
    assert proc.wait(30) == 3 and proc.poll() == 3 and proc.returncode == 3
    assert seen["argv"] == ["--out", str(tmp_path / "probe.json"), "--exit", "3"]
    assert seen["cwd"] == str(tmp_path) and seen["pid"] == proc.pid
    assert seen["env"]["ONLY_FOR_THE_PROBE"] == "yes" and "NOT_FOR_THE_PROBE" not in seen["env"]
    assert seen["ppid"] != os.getpid()  # the server's child, not the test's
    assert (tmp_path / "probe.log").read_text().splitlines() == ["probe: stdout", "probe: stderr"]


def test_signals_wait_and_poll_as_for_a_subprocess(tmp_path: Path) -> None:
    proc, _ = _started(tmp_path)
    assert proc.poll() is None and psutil.pid_exists(proc.pid)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    proc.terminate()
    assert proc.wait(30) == -signal.SIGTERM
    proc.kill()  # after its end: nothing to signal, and no error
    second, _ = _started(tmp_path)
    os.kill(second.pid, signal.SIGKILL)
    assert second.wait(30) == -signal.SIGKILL


def test_an_emulator_that_fails_at_import_says_why_in_its_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="ModuleNotFoundError"):
        fork_server.server().start("tests.support.no_such_emulator", [], env=dict(os.environ), cwd=str(ROOT),
                                   log=str(tmp_path / "x.log"))
