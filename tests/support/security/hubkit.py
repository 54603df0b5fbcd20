"""The production hub on 127.0.0.1 and a stand-in for the manager's forward behind a relay: what
the hub-bounds and pre-authentication flood tests dial (tests/security)."""
from __future__ import annotations

import base64
import secrets
import socket
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

import nni_manager.backends.slurm as slurm_package
from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.hub import Hub
from nni_manager.hub.relay_token import relay_digest
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


RELAY_TOKEN = secrets.token_urlsafe(32)  # the test experiment's relay token


def relay_connect(token: str = RELAY_TOKEN) -> bytes:
    """An agent's first bytes to a relay, as gRPC writes them (the relay being its HTTP proxy)."""
    basic = base64.b64encode(f"nni:{token}".encode()).decode()
    return (f"CONNECT 10.96.0.10:4000 HTTP/1.1\r\nHost: 10.96.0.10:4000\r\nUser-Agent: grpc-httpcli/0.0\r\n"  # not dialed
            f"Proxy-Authorization: Basic {basic}\r\n\r\n").encode()


def slurm_relay_argv(target: Path, port_file: Path, places: int, limit_file: Path | None = None) -> list[str]:
    """The login-node relay as the manager starts it (login.py), checking RELAY_TOKEN."""
    limit = limit_file or port_file.with_name("relay.limit-unused")
    return [sys.executable, str(slurm_relay_script()), "127.0.0.1", "0", str(target), str(port_file), "600",
            str(places), str(limit), relay_digest(RELAY_TOKEN)]


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
