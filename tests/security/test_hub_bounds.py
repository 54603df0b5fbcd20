"""What a stranger can make the hub (and the Slurm relay in front of it) hold before it proves
a token: a Hello of bounded size, a bounded time to say it, a bounded number of such streams
per address, and a bounded number of piped connections (two threads each) in the relay.

All against the production hub over real gRPC on 127.0.0.1, and the relay script as it runs
on a login node (a real process with real sockets)."""
from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
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
from nni_manager.store import Store
from tests.support.manager.helpers import until
from tests.support.manager.hub_tls import Recorder

CONNECT = "/nni_agent.v1.AgentHub/Connect"
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 80 << 20)]


@asynccontextmanager
async def _bounded_hub(exp_dir: Path) -> AsyncIterator[tuple[Hub, str]]:
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


def _hello(token: str, padding: int = 0) -> bytes:
    return pb.AgentMessage(hello=pb.Hello(
        agent_id="a1", token=token, protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR,
        boot_id="b1", agent_version="x" * padding)).SerializeToString()


async def _first_answer(call: grpc.aio.StreamStreamCall) -> str:
    """"welcome", or the status code name the hub ended the stream with."""
    try:
        msg = await call.read()
    except grpc.aio.AioRpcError as e:
        return e.code().name
    return "welcome" if msg is not grpc.aio.EOF and msg.HasField("welcome") else f"other: {msg}"


def _open(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    return channel.stream_stream(CONNECT, request_serializer=lambda b: b,
                                 response_deserializer=pb.ManagerMessage.FromString)()


async def _say_hello(address: str, token: str, padding: int = 0) -> tuple[str, str]:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        call = _open(channel)
        try:
            await call.write(_hello(token, padding))
        except grpc.aio.AioRpcError as e:  # refused before the Hello was taken
            return e.code().name, e.details() or ""
        answer = await _first_answer(call)
        return answer, (await call.details() or "") if answer != "welcome" else ""


def test_an_oversized_hello_is_refused_before_its_token_is_checked(short_dir: Path) -> None:
    async def body() -> None:
        async with _bounded_hub(short_dir / "exp") as (hub, token):
            code, details = await _say_hello(hub.address, "not-the-token", padding=60 << 20)
            assert code == "RESOURCE_EXHAUSTED", (code, details)
            assert "at most" in details and "not-the-token" not in details
            assert (await _say_hello(hub.address, token))[0] == "welcome"  # a Hello of the usual size is fine

    asyncio.run(body())


def test_streams_that_never_say_hello_are_closed_at_the_deadline(short_dir: Path) -> None:
    async def body() -> None:
        async with _bounded_hub(short_dir / "exp") as (hub, token):
            hub.hello_timeout = 1.0
            channels = [grpc.aio.insecure_channel(hub.address, options=CHANNEL_OPTIONS) for _ in range(30)]
            try:
                calls = [_open(ch) for ch in channels]  # opened, never a message
                answers = await asyncio.wait_for(asyncio.gather(*(_first_answer(c) for c in calls)), 60)
            finally:
                for ch in channels:
                    await ch.close()
            assert answers == ["DEADLINE_EXCEEDED"] * 30, answers
            assert (await _say_hello(hub.address, token))[0] == "welcome"

    asyncio.run(body())


def test_one_address_holds_a_bounded_number_of_streams_without_hello(short_dir: Path) -> None:
    async def body() -> None:
        async with _bounded_hub(short_dir / "exp") as (hub, token):
            hub.hello_timeout, hub.max_unauthenticated_per_peer = 600.0, 5
            channels = [grpc.aio.insecure_channel(hub.address, options=CHANNEL_OPTIONS) for _ in range(25)]
            try:
                pending = {asyncio.ensure_future(_first_answer(_open(ch))) for ch in channels}
                refused: list[str] = []
                while len(refused) < 20:
                    done, pending = await asyncio.wait(pending, timeout=30, return_when=asyncio.FIRST_COMPLETED)
                    assert done, f"only {len(refused)} of 25 silent streams were refused: {refused}"
                    refused += [t.result() for t in done]
                assert refused == ["RESOURCE_EXHAUSTED"] * 20 and len(pending) == 5
                # while the five hold the address, even a good Hello from it waits its turn
                assert (await _say_hello(hub.address, token))[0] == "RESOURCE_EXHAUSTED"
            finally:
                for ch in channels:
                    await ch.close()

            async def welcomed() -> bool:
                return (await _say_hello(hub.address, token))[0] == "welcome"

            await until(welcomed, 30, "a welcome once the silent streams closed")  # the address is served again

    asyncio.run(body())


def _relay_script() -> Path:
    return Path(slurm_package.__file__).parent / "nni_slurm_relay.py"


class _Upstream:
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


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def test_the_slurm_relay_pipes_a_bounded_number_of_connections(tmp_path: Path) -> None:
    upstream = _Upstream()
    target, port_file = tmp_path / "relay.target", tmp_path / "relay.port"
    target.write_text(f"127.0.0.1:{upstream.port}\n")
    relay = subprocess.Popen([sys.executable, str(_relay_script()), "127.0.0.1", "0", str(target), str(port_file),
                              "600", "3"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    clients: list[socket.socket] = []

    async def wait(cond, what: str) -> None:  # type: ignore[no-untyped-def]
        await until(cond, 30, what)

    try:
        asyncio.run(wait(lambda: port_file.exists() and port_file.read_text().strip(), "the relay's port"))
        port = int(port_file.read_text())
        for _ in range(3):
            clients.append(socket.create_connection(("127.0.0.1", port)))
        asyncio.run(wait(lambda: upstream.accepted == 3, "three piped connections"))
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(30)
        try:
            closed = extra.recv(1) == b""
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            closed = False
        extra.close()
        assert closed, "a fourth connection was kept although the relay pipes at most three"
        assert upstream.accepted == 3
        clients.pop().close()  # one ends: its place is free again (once the relay has seen it end)

        def piped_again() -> bool:
            if upstream.accepted > 3:
                return True
            if not clients or _closed_by_peer(clients[-1]):  # refused while the ended one was still counted
                clients.append(socket.create_connection(("127.0.0.1", port)))
            return False

        clients.append(socket.create_connection(("127.0.0.1", port)))
        asyncio.run(wait(piped_again, "a new connection piped once one ended"))
        assert upstream.accepted == 4
    finally:
        for c in clients:
            c.close()
        relay.terminate()
        relay.wait(10)
        upstream.sock.close()


def test_the_slurm_relays_bound_follows_its_limit_file(tmp_path: Path) -> None:
    """trialConcurrency raised from the WebUI: the manager rewrites relay.limit and the running
    relay pipes that many connections from its next one on."""
    upstream = _Upstream()
    target, port_file, limit = tmp_path / "relay.target", tmp_path / "relay.port", tmp_path / "relay.limit"
    target.write_text(f"127.0.0.1:{upstream.port}\n")
    relay = subprocess.Popen([sys.executable, str(_relay_script()), "127.0.0.1", "0", str(target), str(port_file),
                              "600", "2", str(limit)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    clients: list[socket.socket] = []

    def refused(port: int) -> bool:
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(30)
        try:
            return extra.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        finally:
            extra.close()

    try:
        asyncio.run(until(lambda: port_file.exists() and port_file.read_text().strip(), 30, "the relay's port"))
        port = int(port_file.read_text())
        for _ in range(2):  # no limit file yet: the bound given at start
            clients.append(socket.create_connection(("127.0.0.1", port)))
        asyncio.run(until(lambda: upstream.accepted == 2, 30, "two piped connections"))
        assert refused(port), "a third connection was kept although the relay pipes at most two"
        limit.write_text("4\n")
        for _ in range(2):
            clients.append(socket.create_connection(("127.0.0.1", port)))
        asyncio.run(until(lambda: upstream.accepted == 4, 30, "four piped connections once the limit is four"))
        assert refused(port), "a fifth connection was kept although the limit file says four"
        assert upstream.accepted == 4
    finally:
        for c in clients:
            c.close()
        relay.terminate()
        relay.wait(10)
        upstream.sock.close()
