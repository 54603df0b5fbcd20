"""A party without the experiment's secret cannot delay or deny a real agent by holding what the hub
keeps for strangers: tunnelled and relayed agents all arrive from 127.0.0.1, so a per-address
budget was everyone's budget (a pod with 400 idle connections or a raw HTTP/2 flood through the
relay got real agents refused 78 times out of 80). Now a loopback peer's budget is its own
connection, and the streams that never say Hello give way, oldest first, to newcomers.

The flood is its own process (tests/support/security/flood.py), as another pod would be; the hub
is the production one over real gRPC; the agent is a real nni-agent process behind a relay.
Timings are measured in scripts/bench_preauth_flood.py, not asserted here.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from nni_manager.backends.kubernetes import relay as relay_module
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from nni_manager.hub.relay_token import relay_digest
from tests.support.security.hubkit import (CHANNEL_OPTIONS, RELAY_TOKEN, Upstream, bounded_hub, first_answer, hello,
                                          open_stream, relay_connect, slurm_relay_argv)
from tests.support.chaos.backend import RelayedBackend
from tests.support.chaos.relay import ChaosRelay
from tests.support.manager.helpers import form, register_backend, until

REPO = Path(__file__).resolve().parents[2]
TRIAL = "from nni_agent import get_next_parameter, report_final_result\nget_next_parameter()\nreport_final_result(1)\n"


@pytest.fixture
def relayed_config(short_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ExperimentConfig:
    """The `relayed` platform (tests/support/chaos/backend.py) registered as a third-party package
    would be, and an experiment on it: real nni-agent processes dialing the hub through a relay."""
    monkeypatch.syspath_prepend(str(register_backend(tmp_path / "plugin", "flood-relayed", "relayed",
                                                     "tests.support.chaos.backend:RelayedBackend")))
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    return ExperimentConfig(trial_code_directory=code, trial_command=f"{sys.executable} trial.py",
                            trial_grace_period=2.0, experiment_working_directory=short_dir / "exps",
                            training_service=TrainingServiceConfig(platform="relayed", reconnect_window=60.0))


@asynccontextmanager
async def flood(target: str, ca_file: str, idle: int, connections: int,
                streams: int) -> AsyncIterator[Callable[[], Counter[str]]]:
    """The flood process, once everything is open; yields how the hub has ended its streams so far
    (the loop runs on meanwhile: the relay and the hub may live in it)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.security.flood", target, ca_file, str(idle),
                             str(connections), str(streams)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    started = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
    assert started.strip() == "flooding", "the flood did not start"
    last: list[Counter[str]] = [Counter()]

    def ended() -> Counter[str]:
        os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
        for line in proc.stdout.readlines():  # type: ignore[union-attr]
            last[0] = Counter(json.loads(line))
        return last[0]

    try:
        yield ended
    finally:
        proc.kill()
        proc.wait(10)


async def _welcomed(address: str, token: str) -> str:
    """A Hello on a connection of its own (as a new agent makes): "welcome" or how it was refused."""
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        call = open_stream(channel)
        try:
            await call.write(hello(token))
        except grpc.aio.AioRpcError as e:
            return e.code().name
        return await first_answer(call)


def test_silent_streams_from_loopback_do_not_stop_a_new_agent(short_dir: Path) -> None:
    async def body() -> None:
        async with bounded_hub(short_dir / "exp") as (hub, token):
            hub.hello_timeout = 600.0  # only giving way ends a silent stream here
            async with flood(hub.address, "-", 400, 25, 16) as ended:  # 400 silent streams: over every budget
                await until(lambda: sum(ended().values()) > 0, 60, "the hub to end some silent streams")
                answers = [await _welcomed(hub.address, token) for _ in range(10)]
                assert answers == ["welcome"] * 10, answers
                assert ended()["RESOURCE_EXHAUSTED"] > 0, ended()  # the flood did hold the budget

    asyncio.run(body())


def test_a_flood_through_the_relay_does_not_stop_a_new_agent_s_trial(relayed_config: ExperimentConfig,
                                                                      short_dir: Path) -> None:
    async def body() -> None:
        relay = ChaosRelay(0)  # a plain pipe to the hub, from 127.0.0.1 as a tunnel's
        RelayedBackend.relay, RelayedBackend.agents, RelayedBackend.work_root = relay, 1, short_dir / "workers"
        async with create_training_service(relayed_config) as ts:
            await until(lambda: ts.agents() and ts.agents()[0]["connected"], 60, "the agent")
            agent_id = ts.agents()[0]["agent_id"]
            ca = short_dir / "hub-ca.crt"
            ca.write_bytes(RelayedBackend.ca_certificate)
            async with flood(f"127.0.0.1:{relay.port}", str(ca), 400, 25, 16) as ended:
                await until(lambda: sum(ended().values()) > 0, 60, "the hub to end some silent streams")
                RelayedBackend.restart_agent(agent_id)  # a new agent process dials in under the flood
                job = await ts.submit_trial_job(form(0))
                await until(lambda: ts.trials.get(job.id).status.is_terminal, 120, "the new agent's trial")
                detail = ts.trials.get(job.id)
                assert detail.status == TrialJobStatus.SUCCEEDED, (detail.status, detail.message)
                assert ended()["RESOURCE_EXHAUSTED"] > 0, ended()
        await relay.stop()

    asyncio.run(body())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# what parties without the experiment's relay token send: an agent's TLS ClientHello, an HTTP/2 preface
# (a raw gRPC client), a CONNECT with no proof, one with a wrong token, one with the token's sha256 (which
# a pod spec or a login node's process list shows), and one with a proof but past HEAD_MAX
GARBAGE = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"CONNECT 10.96.0.10:4000 HTTP/1.1\r\nHost: 10.96.0.10:4000\r\n\r\n",  # not dialed
    relay_connect("not-the-experiment-s-relay-token"),
    relay_connect(relay_digest(RELAY_TOKEN)),
    relay_connect().replace(b"\r\n\r\n", b"\r\nX-Pad: " + b"x" * 5000 + b"\r\n\r\n"),
]


def _closed_by_relay(s: socket.socket) -> bool:
    """Whether the relay closed the connection (it sends nothing before it pairs one)."""
    s.settimeout(30)
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def _connect(port: int, sockets: list[socket.socket]) -> socket.socket:
    for _ in range(300):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            sockets.append(s)
            return s
        except ConnectionRefusedError:
            time.sleep(0.05)  # the relay is starting
    raise AssertionError(f"the relay does not listen on {port}")


def test_only_a_connection_proving_the_relay_token_takes_the_kubernetes_relay_s_stream(tmp_path: Path) -> None:
    """The relay program as it runs in the relay pod (a real process, real sockets): 400 connections
    that never speak and senders of everything but the proof are dropped, none taking the manager's
    one idle stream; then an agent that proves the token gets it, and its "200"."""
    agent_port, back_port = _free_port(), _free_port()
    relay = subprocess.Popen([sys.executable, relay_module.__file__, str(agent_port), str(back_port),
                              relay_digest(RELAY_TOKEN), "127.0.0.1"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sockets: list[socket.socket] = []
    try:
        back = _connect(back_port, sockets)  # the manager's idle port-forward stream
        for _ in range(400):
            _connect(agent_port, sockets)  # another pod's silent connections
        for garbage in GARBAGE:
            s = _connect(agent_port, sockets)
            s.sendall(garbage)
            assert _closed_by_relay(s), f"the relay kept a connection that sent {garbage[:40]!r}"
        agent = _connect(agent_port, sockets)
        agent.sendall(relay_connect())
        agent.settimeout(30)
        answer = b""
        while not answer.endswith(b"\r\n\r\n"):
            chunk = agent.recv(100)
            assert chunk, f"the relay closed the agent's connection after {answer!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        back.settimeout(30)
        assert back.recv(100) == b"\x01"  # the signal, for the agent: nothing of the garbage came first
        agent.sendall(b"\x16agent's ClientHello")
        got = b""
        while len(got) < 20:
            chunk = back.recv(100)
            assert chunk, f"the stream closed after {got!r}"
            got += chunk
        assert got == b"\x16agent's ClientHello", got
    finally:
        for s in sockets:
            s.close()
        relay.kill()
        relay.wait(10)


def test_only_a_connection_proving_the_relay_token_is_piped_by_the_slurm_relay(tmp_path: Path) -> None:
    """The login-node relay as it runs there (a real process): with every place held by connections
    that never speak, senders of everything but the proof are dropped and never piped, and an agent
    that proves the token takes the oldest silent one's place and is piped."""
    upstream = Upstream()
    target, port_file = tmp_path / "relay.target", tmp_path / "relay.port"
    target.write_text(f"127.0.0.1:{upstream.port}\n")
    relay = subprocess.Popen(slurm_relay_argv(target, port_file, 3), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL)
    held: list[socket.socket] = []
    try:
        asyncio.run(until(lambda: port_file.exists() and port_file.read_text().strip(), 30, "the relay's port"))
        port = int(port_file.read_text())
        silent = [_connect(port, held) for _ in range(3)]  # every place
        for garbage in GARBAGE:  # each takes the oldest silent one's place, then is dropped itself
            s = _connect(port, held)
            s.sendall(garbage)
            assert _closed_by_relay(s), f"the relay kept a connection that sent {garbage[:40]!r}"
        time.sleep(0.5)
        assert upstream.accepted == 0, upstream.accepted  # nothing without the proof was piped
        agent = _connect(port, held)
        agent.sendall(relay_connect())
        agent.settimeout(30)
        assert agent.recv(100).startswith(b"HTTP/1.1 200 ")
        asyncio.run(until(lambda: upstream.accepted >= 1, 30, "the agent piped to the manager"))
        time.sleep(0.5)
        assert upstream.accepted == 1, upstream.accepted
        assert any(_closed_by_relay(s) for s in silent), "no silent connection gave its place"
    finally:
        for s in held:
            s.close()
        relay.terminate()
        relay.wait(10)
        upstream.sock.close()
