"""Helpers for the trust-boundary tests: a real experiment with its real local agent, plus a
second agent ("evil") that holds its own valid token and speaks the real protocol by hand.

`RawAgent` is a real gRPC client of the production hub (over the experiment's Unix socket):
Hello with its own token, then whatever records the test crafts, each batch waited for until
the hub acknowledged it (so the core has applied or refused it). `Fleet` runs the training
service on the local platform: its agent process runs the victim trial, and the evil agent is
registered as a backend registers an agent (`Core.add_agent`: its own token in the store).
`stored_webui` serves the stored experiment as `nni-manager view` does (real aiohttp server on
127.0.0.1), for a real HTTP client.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb
from nni_agent.v1 import agent_pb2_grpc as pb_grpc
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.service.nni_api import TrainingService
from nni_manager.types import TrialJobDetail, TrialJobStatus
from tests.support.manager.helpers import form, until

# A trial that reports one intermediate result, optionally plants a symlink to the manager's
# /etc/passwd in its own directory, prints a marker and waits for its `release` file.
TRIAL = r'''
import os, sys, time
from pathlib import Path
from nni_agent import get_next_parameter, report_intermediate_result, report_final_result
p = get_next_parameter()
out = Path(os.environ["NNI_OUTPUT_DIR"])
if p.get("symlink"):
    os.symlink("/etc/passwd", out / "leak")
report_intermediate_result(1)
print("honest output", flush=True)
(out / "ready").write_text("1")
release = Path(p["release"])
while not release.exists():
    if not release.parent.exists():
        sys.exit(9)
    time.sleep(0.05)
report_final_result(p.get("x", 1))
'''

PASSWD_MARK = b"root:"  # every /etc/passwd starts with root's line


def passwd_readable() -> bool:
    try:
        return Path("/etc/passwd").read_bytes().startswith(PASSWD_MARK)
    except OSError:
        return False


def metric_json(trial_id: str, kind: str, sequence: Any, value: Any) -> str:
    """An NNI metric message as the SDK writes it (value JSON-encoded once more)."""
    return json.dumps({"parameter_id": 0, "trial_job_id": trial_id, "type": kind, "sequence": sequence,
                       "value": json.dumps(value)})


class RawAgent:
    """A hand-driven agent on a real gRPC stream: its own valid token, crafted records."""

    def __init__(self, target: str, agent_id: str, token: str) -> None:
        self.target, self.agent_id, self.token = target, agent_id, token
        self.seq = 0
        self.acked = 0
        self.commands: list[pb.Command] = []
        self._changed = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._writing = asyncio.Lock()  # one write at a time: a big batch must not overlap a heartbeat

    async def _write(self, message: pb.AgentMessage) -> None:
        async with self._writing:
            await self._call.write(message)

    async def __aenter__(self) -> RawAgent:
        self._channel = grpc.aio.insecure_channel(self.target, options=[("grpc.enable_http_proxy", 0)])
        self._call = pb_grpc.AgentHubStub(self._channel).Connect()
        await self._call.write(pb.AgentMessage(hello=pb.Hello(
            agent_id=self.agent_id, token=self.token, agent_version="0", protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR, boot_id="evil-boot", host=pb.HostInfo(hostname="evil-host"))))
        first = await asyncio.wait_for(self._call.read(), 30)
        assert first is not grpc.aio.EOF and first.HasField("welcome"), first
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._beat())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _read(self) -> None:
        while (msg := await self._call.read()) is not grpc.aio.EOF:
            if msg.HasField("ack"):
                self.acked = max(self.acked, msg.ack.seq)
            elif msg.HasField("command"):
                self.commands.append(msg.command)
                await self._write(pb.AgentMessage(command_ack=pb.CommandAck(cmd_seq=msg.command.cmd_seq)))
            self._changed.set()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            await self._write(pb.AgentMessage(heartbeat=pb.Heartbeat(time_ms=1)))

    async def send(self, *bodies: dict[str, Any]) -> None:
        """One batch of records (each a `pb.Record` body: status=..., metric=..., log=...),
        returning once the hub acknowledged all of them."""
        records = []
        for body in bodies:
            self.seq += 1
            records.append(pb.Record(seq=self.seq, **body))
        await self._write(pb.AgentMessage(records=pb.RecordBatch(records=records)))
        await self.until(lambda: self.acked >= self.seq, f"the hub to acknowledge record {self.seq}")

    async def resources(self, *trials: pb.TrialResources) -> None:
        await self._write(pb.AgentMessage(resources=pb.ResourceReport(time_ms=1, trials=list(trials))))

    async def until(self, cond: Any, what: str, timeout: float = 30) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not cond():
            if loop.time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.1)

    async def started(self, timeout: float = 30) -> pb.StartTrial:
        """The StartTrial the manager sent this agent (the trial placed on it)."""
        await self.until(lambda: any(c.HasField("start_trial") for c in self.commands), "a StartTrial", timeout)
        return next(c.start_trial for c in self.commands if c.HasField("start_trial"))


def config(short_dir: Path) -> ExperimentConfig:
    code = short_dir / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return ExperimentConfig(trial_code_directory=code, trial_command=f"{sys.executable} trial.py",
                            trial_grace_period=2.0, experiment_working_directory=short_dir / "exps",
                            training_service=TrainingServiceConfig(platform="local"))


class Fleet:
    """A running local-platform experiment: the victim trial RUNNING on the real local agent,
    and `evil`, a second registered agent with its own token, connected by hand."""

    def __init__(self, ts: TrainingService, victim: TrialJobDetail, evil: RawAgent, release: Path) -> None:
        self.ts, self.victim, self.evil, self.release = ts, victim, evil, release

    @property
    def experiment_dir(self) -> Path:
        return self.ts.experiment_dir

    def detail(self, trial_id: str) -> TrialJobDetail:
        return self.ts.trials.get(trial_id)

    async def submit(self, **params: Any) -> TrialJobDetail:
        params.setdefault("release", str(self.release))
        return await self.ts.submit_trial_job(form(len(self.ts.trials.by_id), **params))

    async def wait_running(self, trial_id: str) -> TrialJobDetail:
        await until(lambda: self.detail(trial_id).status == TrialJobStatus.RUNNING, 60, f"trial {trial_id} to run")
        return self.detail(trial_id)


@contextlib.asynccontextmanager
async def fleet(short_dir: Path, **victim_params: Any) -> AsyncIterator[Fleet]:
    """The experiment with its victim trial running on the local agent, and evil connected."""
    release = short_dir / "gate" / "release"
    release.parent.mkdir(parents=True)
    async with create_training_service(config(short_dir)) as ts:
        victim = await ts.submit_trial_job(form(0, release=str(release), **victim_params))
        await until(lambda: ts.trials.get(victim.id).status == TrialJobStatus.RUNNING, 60, "the victim to run")
        ready = Path(ts.trials.get(victim.id).working_directory) / "ready"
        await until(ready.exists, 60, "the victim's first output")
        spec = ts._core.add_agent("evil")  # as a backend registers a worker: its own token
        async with RawAgent(f"unix:{spec.hub_unix_socket}", spec.agent_id, spec.token) as evil:
            await until(lambda: ts._core.agent_connected("evil"), 30, "evil to connect")
            try:
                yield Fleet(ts, ts.trials.get(victim.id), evil, release)
            finally:
                release.write_text("1")  # clean_up ends the rest (evil's trials with evil gone)


@contextlib.asynccontextmanager
async def stored_webui(experiment_dir: Path) -> AsyncIterator[str]:
    """`nni-manager view` of the stored experiment on 127.0.0.1: yields its REST API's base URL."""
    from nni_manager.store import Store
    from nni_manager.webui.server import WebServer, experiment_end_time
    from nni_manager.webui.sides import StoredExperiment

    store = Store.open_readonly(experiment_dir)
    stored = store.experiment()
    store.close()
    side = StoredExperiment(experiment_dir, stored, experiment_end_time(experiment_dir), lambda: None)
    server = WebServer(side, port=0, register=False)
    await server.start()
    try:
        yield server.url + "api/v1/nni"
    finally:
        await server.stop()


async def get(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET by a real HTTP client."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.read()
