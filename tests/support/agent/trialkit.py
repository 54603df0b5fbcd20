"""Shared helpers for the trial runtime tests: a recording TrialEvents and trial runners.

Trials run in-process under asyncio.run (the agent's SIGCHLD reaper needs the main thread),
with real /bin/sh subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from nni_agent.http_channel import HttpChannelServer
from nni_agent.process import MARKER_ENV
from nni_agent.trial import Trial
from nni_agent.v1 import agent_pb2 as pb
from tests.support.polling import intervals

PY = sys.executable
# the trials' process marker is `<agent key>/<trial id>` and tests look for it machine-wide: one key per
# test process, so two xdist workers running the same trial ids never see each other's processes
AGENT_KEY = f"testagent{os.getpid()}"
TERMINAL = {pb.TRIAL_STATE_SUCCEEDED, pb.TRIAL_STATE_FAILED, pb.TRIAL_STATE_USER_CANCELED,
            pb.TRIAL_STATE_EARLY_STOPPED, pb.TRIAL_STATE_SYS_CANCELED}
REPO_AGENT_DIR = str(Path(__file__).resolve().parents[3] / "agent")


class Recorder:
    """A TrialEvents sink that records everything and checks log offsets are contiguous."""

    def __init__(self) -> None:
        self.statuses: list[pb.TrialStatus] = []
        self.metrics: list[str] = []
        self.parameter_requests: list[int] = []
        self.logs: dict[int, bytearray] = {pb.LOG_STREAM_STDOUT: bytearray(), pb.LOG_STREAM_STDERR: bytearray()}
        self.events_after_terminal = 0
        self.max_chunk = 0
        self.on_parameter_request: Callable[[int], None] | None = None

    def _check_open(self) -> None:
        if self.terminal is not None:
            self.events_after_terminal += 1

    def status(self, status: pb.TrialStatus) -> None:
        self._check_open()
        self.statuses.append(status)

    def metric(self, trial_id: str, data: str) -> None:
        self._check_open()
        self.metrics.append(data)

    def log(self, trial_id: str, stream: int, offset: int, data: bytes) -> None:
        self._check_open()
        buf = self.logs[stream]
        assert offset == len(buf), f"log chunk at offset {offset}, expected {len(buf)}"
        buf += data
        self.max_chunk = max(self.max_chunk, len(data))

    def parameter_request(self, trial_id: str, index: int) -> None:
        self._check_open()
        self.parameter_requests.append(index)
        if self.on_parameter_request is not None:
            self.on_parameter_request(index)

    @property
    def terminal(self) -> pb.TrialStatus | None:
        return next((s for s in self.statuses if s.state in TERMINAL), None)

    @property
    def stdout(self) -> bytes:
        return bytes(self.logs[pb.LOG_STREAM_STDOUT])

    @property
    def stderr(self) -> bytes:
        return bytes(self.logs[pb.LOG_STREAM_STDERR])

    def metric_values(self) -> list[Any]:
        return [json.loads(json.loads(m)["value"]) for m in self.metrics]


def make_spec(tmp_path: Path, command: str, *, trial_id: str = "trA01", **fields: Any) -> pb.StartTrial:
    env = dict(fields.pop("env", {}))
    env.setdefault("PYTHONPATH", REPO_AGENT_DIR)
    spec = pb.StartTrial(
        trial_id=trial_id, sequence_id=fields.pop("sequence_id", 7), experiment_id="expABCDE",
        command=command, code_directory=str(fields.pop("code_directory", tmp_path)),
        parameter=fields.pop("parameter", json.dumps(
            {"parameter_id": 3, "parameter_source": "algorithm", "parameters": {"lr": 0.1}, "parameter_index": 0})),
        env=env, **fields,
    )
    return spec


def new_trial(spec: pb.StartTrial, tmp_path: Path, events: Recorder, *,
              http: HttpChannelServer | None = None, code_dir: Path | None = None) -> Trial:
    return Trial(spec, events=events, work_root=tmp_path / "work", code_dir=code_dir,
                 http_channel=http, agent_key=AGENT_KEY)


def run(coro_fn: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
    """Run an async test body with an overall time limit."""
    async def body() -> Any:
        return await asyncio.wait_for(coro_fn(), timeout)
    return asyncio.run(body())


def run_trial(tmp_path: Path, command: str, *, http: HttpChannelServer | None = None,
              timeout: float = 60, **fields: Any) -> tuple[Recorder, Trial]:
    """Run one trial to its terminal status."""
    rec = Recorder()
    spec = make_spec(tmp_path, command, **fields)

    async def body() -> Trial:
        trial = new_trial(spec, tmp_path, rec, http=http)
        await trial.start()
        await trial.wait()
        return trial

    trial = run(body, timeout)
    return rec, trial


async def wait_until(predicate: Callable[[], bool], timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    gaps = intervals()  # tests/support/polling.py: soon, then less often
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(next(gaps))


def marked_processes(marker: str) -> list[psutil.Process]:
    """Every live (non-zombie) process on the machine carrying the trial marker."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER_ENV) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def python_command(code: str) -> str:
    """A shell command line that runs `code` with this test's Python."""
    return f"{PY} -c {shlex.quote(code)}"
