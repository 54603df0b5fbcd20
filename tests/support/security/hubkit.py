"""The production hub on 127.0.0.1 and a stand-in for the manager's forward behind a relay: what
the hub-bounds and pre-authentication flood tests dial (tests/security)."""
from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

import nni_manager.backends.slurm as slurm_package
from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.hub import Hub
from nni_manager.store import Store
from tests.support.manager.hub_tls import Recorder

CONNECT = "/nni_agent.v1.AgentHub/Connect"
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 80 << 20)]


@asynccontextmanager
async def bounded_hub(exp_dir: Path) -> AsyncIterator[tuple[Hub, str]]:
    """The production hub on 127.0.0.1 with one registered agent "a1"; yields (hub, its token)."""
    token = secrets.token_urlsafe(32)
    store = Store.open(exp_dir)
    with store.transaction():
        store.add_agent("a1", "a1", token, {})
    hub = Hub(experiment_id="ExpBounds", experiment_dir=exp_dir, store=store, handler=Recorder(exp_dir),
              tcp="127.0.0.1:0")
    hub.register("a1", token)
    await hub.start()
    try:
        yield hub, token
    finally:
        await hub.stop(0)
        store.close()


def hello(token: str, padding: int = 0) -> bytes:
    return pb.AgentMessage(hello=pb.Hello(
        agent_id="a1", token=token, protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR,
        boot_id="b1", agent_version="x" * padding)).SerializeToString()


async def first_answer(call: grpc.aio.StreamStreamCall) -> str:
    """"welcome", or the status code name the hub ended the stream with."""
    try:
        msg = await call.read()
    except grpc.aio.AioRpcError as e:
        return e.code().name
    return "welcome" if msg is not grpc.aio.EOF and msg.HasField("welcome") else f"other: {msg}"


def open_stream(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    return channel.stream_stream(CONNECT, request_serializer=lambda b: b,
                                 response_deserializer=pb.ManagerMessage.FromString)()


def slurm_relay_script() -> Path:
    return Path(slurm_package.__file__).parent / "nni_slurm_relay.py"


class Upstream:
    """Where the relay pipes to (the manager's forward): counts connections, holds each until EOF."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    @staticmethod
    def _hold(conn: socket.socket) -> None:
        with conn:
            while conn.recv(4096):
                pass
