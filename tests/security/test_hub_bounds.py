"""What a stranger can make the hub (and the Slurm relay in front of it) hold before it proves
a token: a Hello of bounded size, a bounded time to say it, a bounded number of such streams
per address, and a bounded number of piped connections (two threads each) in the relay.

All against the production hub over real gRPC on 127.0.0.1, and the relay script as it runs
on a login node (a real process with real sockets)."""
from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import grpc

from tests.support.manager.helpers import until
from tests.support.security.hubkit import CHANNEL_OPTIONS, Upstream as _Upstream
from tests.support.security.hubkit import bounded_hub as _bounded_hub
from tests.support.security.hubkit import first_answer as _first_answer
from tests.support.security.hubkit import hello as _hello
from tests.support.security.hubkit import open_stream as _open
from tests.support.security.hubkit import relay_connect, slurm_relay_argv


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


def _speaking(port: int) -> socket.socket:
    """A connection that proves at once, as an agent does (its CONNECT with the relay token): the relay pipes it."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(relay_connect())
    return conn


def test_the_slurm_relay_pipes_a_bounded_number_of_connections(tmp_path: Path) -> None:
    upstream = _Upstream()
    target, port_file = tmp_path / "relay.target", tmp_path / "relay.port"
    target.write_text(f"127.0.0.1:{upstream.port}\n")
    relay = subprocess.Popen(slurm_relay_argv(target, port_file, 3), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL)
    clients: list[socket.socket] = []

    async def wait(cond, what: str) -> None:  # type: ignore[no-untyped-def]
        await until(cond, 30, what)

    try:
        asyncio.run(wait(lambda: port_file.exists() and port_file.read_text().strip(), "the relay's port"))
        port = int(port_file.read_text())
        for _ in range(3):
            clients.append(_speaking(port))
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
                clients.append(_speaking(port))
            return False

        clients.append(_speaking(port))
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
    relay = subprocess.Popen(slurm_relay_argv(target, port_file, 2, limit), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL)
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
            clients.append(_speaking(port))  # a connection is piped once it has proved the relay token
        asyncio.run(until(lambda: upstream.accepted == 2, 30, "two piped connections"))
        assert refused(port), "a third connection was kept although the relay pipes at most two"
        limit.write_text("4\n")
        for _ in range(2):
            clients.append(_speaking(port))
        asyncio.run(until(lambda: upstream.accepted == 4, 30, "four piped connections once the limit is four"))
        assert refused(port), "a fifth connection was kept although the limit file says four"
        assert upstream.accepted == 4
    finally:
        for c in clients:
            c.close()
        relay.terminate()
        relay.wait(10)
        upstream.sock.close()
