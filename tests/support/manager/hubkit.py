"""A production hub on a real store with a recording handler, and a raw gRPC agent to drive it."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from nni_agent.v1 import agent_pb2 as pb
from nni_agent.v1 import agent_pb2_grpc as pb_grpc
from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_manager.hub import Hub
from nni_manager.store import Store


TOKEN = "s3cret-token-value"


class Recorder:
    """The hub's handler: records what the hub reports and stores progress like the service."""

    def __init__(self, store: Store, store_dir: Path) -> None:
        self.store = store
        self.store_dir = store_dir
        self.events: list[tuple[str, Any]] = []
        self.records: list[pb.Record] = []

    def agent_hello(self, agent_id: str, hello: pb.Hello, restarted: bool) -> None:
        self.events.append(("hello", restarted))

    def apply_records(self, agent_id: str, boot_id: str, last_seq: int, records: list[pb.Record]) -> None:
        with self.store.transaction():
            self.records.extend(records)
            self.store.set_agent_progress(agent_id, boot_id, last_seq)

    def telemetry(self, agent_id: str, report: Any) -> None:
        self.events.append(("telemetry", type(report).__name__))

    def agent_lost(self, agent_id: str, since: float) -> None:
        self.events.append(("lost", agent_id))

    def agent_back(self, agent_id: str) -> None:
        self.events.append(("back", agent_id))

    def agent_expired(self, agent_id: str) -> None:
        self.events.append(("expired", agent_id))

    def log_file(self, agent_id: str, trial_id: str, stream: int) -> Path:
        name = "trial.stderr" if stream == pb.LOG_STREAM_STDERR else "trial.stdout"
        return self.store_dir / "trials" / trial_id / name


class Agent:
    """A scripted agent: one stream, explicit messages."""

    def __init__(self, hub: Hub, token: str = TOKEN, boot_id: str = "boot1", major: int = PROTOCOL_MAJOR,
                 minor: int = PROTOCOL_MINOR) -> None:
        self.channel = grpc.aio.insecure_channel(f"unix:{hub.socket_path}", options=[("grpc.enable_http_proxy", 0)])
        self.call = pb_grpc.AgentHubStub(self.channel).Connect()
        self.hello = pb.Hello(agent_id="a1", token=token, agent_version="0.1.0", protocol_major=major,
                              protocol_minor=minor, boot_id=boot_id)

    async def connect(self) -> pb.Welcome:
        await self.call.write(pb.AgentMessage(hello=self.hello))
        msg = await self.call.read()
        assert msg.HasField("welcome"), msg
        return msg.welcome

    async def send(self, **body: Any) -> None:
        await self.call.write(pb.AgentMessage(**body))

    async def read(self, kind: str) -> Any:
        while True:
            msg = await self.next()
            if msg.WhichOneof("body") == kind:
                return getattr(msg, kind)

    async def next(self, timeout: float = 5) -> pb.ManagerMessage:
        """The next message, whole (an Ack may ride on it: `acked`)."""
        msg = await asyncio.wait_for(self.call.read(), timeout)
        assert msg is not grpc.aio.EOF
        return msg

    async def close(self) -> None:
        await self.channel.close()


def records(*items: tuple[int, dict[str, Any]]) -> pb.RecordBatch:
    return pb.RecordBatch(records=[pb.Record(seq=seq, **body) for seq, body in items])


class StoreOwningHub(Hub):
    """The production hub whose stop() also closes its store, as the training service does after
    it (a store left open keeps its checkpoint thread in the test worker for the rest of the run)."""

    def __init__(self, *, store: Store, **kw: Any) -> None:
        super().__init__(store=store, **kw)
        self.owned_store = store

    async def stop(self, grace: float = 1.0) -> None:
        await super().stop(grace)
        self.owned_store.close()


def stored_agent(store_dir: Path, name: str) -> Any:
    """The agent's row as experiment.db holds it now (read-only, closed again)."""
    store = Store.open_readonly(store_dir)
    try:
        return store.agent_by_name(name)
    finally:
        store.close()


async def started_hub(tmp: Path, **kw: Any) -> tuple[Hub, Recorder]:
    store = Store.open(tmp)
    store.add_agent("a1", "a1", TOKEN, {})
    rec = Recorder(store, tmp)
    hub = StoreOwningHub(experiment_id="Exp12345", experiment_dir=tmp, store=store, handler=rec, **kw)
    hub.register("a1", TOKEN)
    await hub.start()
    return hub, rec


def run(coro: Any) -> Any:
    return asyncio.run(coro)
