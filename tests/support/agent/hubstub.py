"""A hub written for the tests, for the one kind of test the production hub cannot serve:
a manager that misbehaves on purpose.

Everything else runs against the production hub (`nni_manager.hub.Hub`, see
tests/support/agent/prodhub.py). Still here, and why:

* tests/agent/test_trial_log_stream.py::test_older_manager_gets_no_trial_log_chunks: the
  hub must be an *older* manager, whose Welcome carries no protocol_minor (from before
  LOG_STREAM_TRIAL_LOG); the production hub always announces its own, newer protocol.
* tests/agent/test_ack_riding.py: every message the agent wrote, as it came off the wire, to a
  manager of protocol 1.4 (acks ride) and to an older one (bare acks).

It authenticates by token, deduplicates records by (boot_id, seq) and acknowledges them,
re-sends unacknowledged commands after a reconnect, and serves bundles. Add a test here only
if it needs the manager to do what no manager of this project does.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import grpc

from nni_agent.v1 import PROTOCOL_MAJOR
from nni_agent.v1 import agent_pb2 as pb
from nni_agent.v1 import agent_pb2_grpc as pb_grpc
from tests.support.agent.prodhub import TrialView, apply_record, stop_agents

class HubStub(pb_grpc.AgentHubServicer):
    def __init__(self, token: str = "secret-token", protocol_minor: int = 0) -> None:
        self.token = token
        self.protocol_minor = protocol_minor  # its Welcome's; 0: a manager from before protocol_minor
        self.received: list[pb.AgentMessage] = []  # after the Hello, in order
        self.trials: dict[str, TrialView] = defaultdict(TrialView)
        self.applied: dict[str, int] = defaultdict(int)  # boot_id -> last applied seq
        self.duplicates = 0
        self.sessions = 0
        self.connected = asyncio.Event()
        self.hellos: list[pb.Hello] = []
        self.bundle_requests: list[str] = []
        self.bundles: dict[str, bytes] = {}
        self.gpu_reports: list[pb.GpuReport] = []
        self.resource_reports: list[pb.ResourceReport] = []
        self._queue: asyncio.Queue[pb.Command] = asyncio.Queue()
        self._unacked: list[pb.Command] = []
        self._cmd_seq = 0
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ test API

    def send(self, **body: object) -> None:
        self._cmd_seq += 1
        cmd = pb.Command(cmd_seq=self._cmd_seq, **body)  # type: ignore[arg-type]
        self._unacked.append(cmd)
        self._queue.put_nowait(cmd)

    def add_bundle(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.bundles[digest] = data
        return digest

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 120) -> None:
        async def loop() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)

    # ------------------------------------------------------------------ servicer

    async def Connect(self, request_iterator, context):  # noqa: N802 (gRPC naming)
        first = await request_iterator.__anext__()
        hello = first.hello
        if hello.token != self.token:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"agent {hello.agent_id}: invalid token")
        if hello.protocol_major != PROTOCOL_MAJOR:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "protocol mismatch")
        self.hellos.append(hello)
        self.sessions += 1
        boot = hello.boot_id
        yield pb.ManagerMessage(welcome=pb.Welcome(acked_seq=self.applied[boot], experiment_id="stubexp1",
                                                    heartbeat_interval_ms=1000,
                                                    protocol_minor=self.protocol_minor))
        for cmd in self._unacked:  # re-send what the agent has not acknowledged
            yield pb.ManagerMessage(command=cmd)
        while not self._queue.empty():
            self._queue.get_nowait()
        self.connected.set()
        self._changed.set()
        out: asyncio.Queue[pb.ManagerMessage | None] = asyncio.Queue()

        async def reader() -> None:
            try:
                async for msg in request_iterator:
                    self.received.append(msg)
                    if msg.command_acked and self.protocol_minor >= 4:
                        self._unacked = [c for c in self._unacked if c.cmd_seq > msg.command_acked]
                    kind = msg.WhichOneof("body")
                    if kind == "records":
                        self._apply(boot, list(msg.records.records))
                        await out.put(pb.ManagerMessage(ack=pb.Ack(seq=self.applied[boot])))
                    elif kind == "command_ack":
                        self._unacked = [c for c in self._unacked if c.cmd_seq > msg.command_ack.cmd_seq]
                    elif kind == "heartbeat":
                        await out.put(pb.ManagerMessage(ack=pb.Ack(seq=self.applied[boot])))
                    elif kind == "bundle_request":
                        self.bundle_requests.append(msg.bundle_request.digest)
                        data = self.bundles[msg.bundle_request.digest]
                        step = 1 << 16
                        for off in range(0, len(data), step):
                            await out.put(pb.ManagerMessage(bundle_chunk=pb.BundleChunk(
                                digest=msg.bundle_request.digest, offset=off, data=data[off:off + step],
                                last=off + step >= len(data))))
                    elif kind == "gpus":
                        self.gpu_reports.append(msg.gpus)
                    elif kind == "resources":
                        self.resource_reports.append(msg.resources)
                    self._changed.set()
            finally:
                await out.put(None)

        async def commands() -> None:
            while True:
                await out.put(pb.ManagerMessage(command=await self._queue.get()))

        tasks = [asyncio.create_task(reader()), asyncio.create_task(commands())]
        try:
            while (msg := await out.get()) is not None:
                yield msg
        finally:
            for t in tasks:
                t.cancel()
            self.connected.clear()
            self._changed.set()

    def _apply(self, boot: str, records: list[pb.Record]) -> None:
        for rec in records:
            if rec.seq <= self.applied[boot]:
                self.duplicates += 1
                continue
            assert rec.seq == self.applied[boot] + 1, f"gap: got seq {rec.seq} after {self.applied[boot]}"
            self.applied[boot] = rec.seq
            apply_record(self.trials, rec)


class StubServer:
    """Runs a HubStub on 127.0.0.1 and agent subprocesses against it."""

    def __init__(self, hub: HubStub) -> None:
        self.hub = hub
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        pb_grpc.add_AgentHubServicer_to_server(hub, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.agents: list[subprocess.Popen[bytes]] = []

    async def __aenter__(self) -> StubServer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await stop_agents(self.agents)
        await self.server.stop(grace=None)

    async def connect_agent(self, work_dir: Path, **kwargs: object) -> subprocess.Popen[bytes]:
        """start_agent, then wait until its stream is open."""
        proc = self.start_agent(work_dir, **kwargs)  # type: ignore[arg-type]
        await asyncio.wait_for(self.hub.connected.wait(), 30)
        return proc

    def start_agent(self, work_dir: Path, *, token: str | None = None, agent_id: str = "agent-1",
                    extra_env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                    manager_file: Path | None = None) -> subprocess.Popen[bytes]:
        env = dict(os.environ, NNI_AGENT_TOKEN=token if token is not None else self.hub.token, **(extra_env or {}))
        where = ["--manager-file", str(manager_file)] if manager_file else ["--manager", f"127.0.0.1:{self.port}"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "nni_agent", *where, "--agent-id", agent_id,
             "--work-dir", str(work_dir), "--log-file", str(work_dir.parent / f"{agent_id}.log"), *args],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.agents.append(proc)
        return proc


def start_trial(trial_id: str, command: str, *, parameter: str = '{"parameter_id": 0, "parameters": {}}',
                **fields: object) -> dict[str, object]:
    """Keyword arguments for HubStub.send(start_trial=...)."""
    return {"start_trial": pb.StartTrial(trial_id=trial_id, experiment_id="stubexp1", platform="local",
                                          command=command, parameter=parameter, **fields)}  # type: ignore[arg-type]
