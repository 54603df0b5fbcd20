"""Agents authenticate the hub before they send a secret or obey it, and enrolment credentials
are not spent on a Hello the hub refuses anyway.

The remote scenario is issue 20's: on a shared worker the agent's end of the SSH tunnel is a
127.0.0.1 port that sshd frees when the link (or the manager) drops, and the agent keeps
redialling it. A local user binds it: first as a plain gRPC hub, then as a TLS hub with a
certificate of its own. The real agent, started by the real remote backend over a real sshd,
must give that squatter neither its token nor its obedience (a StartTrial writing `pwned`),
and must still be taken back by a restarted manager of the same experiment.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import psutil
import pytest

from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb
from nni_agent.v1 import agent_pb2_grpc as pb_grpc
from nni_manager.backends.remote import bootstrap
from nni_manager.backends.remote.backend import RemoteBackend, agent_names
from nni_manager.backends.remote.bootstrap import AgentLaunch
from nni_manager.backends.remote.config import MachineConfig, RemoteConfig
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.hub import Hub
from nni_manager.hub.tls import TlsMaterial, experiment_tls
from nni_manager.service import hub_setup
from nni_manager.ssh.commands import home_path, run
from nni_manager.ssh.connection import connect
from nni_manager.store import Store
from tests.support.agent.prodhub import HubContext, ProdHub
from tests.support.manager.helpers import until
from tests.support.manager.hub_tls import Recorder
from tests.support.remote.fixtures import plain_sshd, processes_with, ssh_keys, ssh_user  # noqa: F401
from tests.support.bounded import run_bounded

CONNECT = "/nni_agent.v1.AgentHub/Connect"


def _remote_config(machine: MachineConfig) -> ExperimentConfig:
    return ExperimentConfig(
        trial_command="true", trial_code_directory=Path("."),
        training_service=TrainingServiceConfig(platform="remote", options=RemoteConfig([machine]),
                                               reconnect_window=60),
        trial_grace_period=1.0,
    )


class _FakeHub(pb_grpc.AgentHubServicer):
    """What a squatter answers: Welcome to any Hello, then a StartTrial that leaves evidence."""

    def __init__(self, experiment_id: str, evidence: Path) -> None:
        self.experiment_id = experiment_id
        self.evidence = evidence
        self.hellos: list[pb.Hello] = []

    async def Connect(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        self.hellos.append(first.hello)
        await context.write(pb.ManagerMessage(welcome=pb.Welcome(
            protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR, experiment_id=self.experiment_id,
            heartbeat_interval_ms=1000)))
        await context.write(pb.ManagerMessage(command=pb.Command(cmd_seq=1, start_trial=pb.StartTrial(
            trial_id="pwn", experiment_id=self.experiment_id, platform="remote",
            command=f"id > {self.evidence}", parameter='{"parameter_id": 0, "parameters": {}}'))))
        while await context.read() is not grpc.aio.EOF:
            pass


async def _fake_hub_server(fake: _FakeHub, tls: TlsMaterial | None) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_AgentHubServicer_to_server(fake, server)
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(tls.private_key, tls.certificate)]))
    await server.start()
    return server, port


class _Squatter:
    """A local user's listener on the agent's freed worker port: it keeps every byte the agent
    sends and pipes the connection to whichever fake hub it runs now."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.fake_hub_port = 0
        self.received = bytearray()
        self.openings: list[bytes] = []  # each connection's first bytes
        self._server: asyncio.AbstractServer | None = None

    async def bind(self) -> bool:
        try:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        except OSError:  # sshd has not let go of it yet
            return False
        return True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opening = len(self.openings)
        self.openings.append(b"")
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.fake_hub_port)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bool) -> None:
            try:
                while data := await src.read(65536):
                    if keep:
                        if not self.openings[opening]:
                            self.openings[opening] = data[:8]
                        self.received += data
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))


def _agent_pid(home: Path, experiment_id: str, agent_id: str) -> int:
    return int((home / ".nni-agent" / "run" / experiment_id / f"{agent_id}.pid").read_text())


def test_remote_agent_gives_a_squatter_on_its_worker_port_neither_token_nor_obedience(
        plain_sshd, short_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    experiment_id = "sec" + secrets.token_hex(4)
    exp_dir = short_dir / "exp"
    evidence = plain_sshd.home / f"pwned-{experiment_id}.txt"  # where the SSH user's agent could write it
    forged = experiment_tls(tmp_path / "forged", ["127.0.0.1"], experiment_id)  # the squatter's own CA

    async def scenario() -> None:
        backend = RemoteBackend(_remote_config(plain_sshd.machine))
        hub = ProdHub(exp_dir, experiment_id=experiment_id)
        # what the manager's loopback hub listens with (production code decides)
        _, hub.hub_kwargs["tls"] = await hub_setup.listen_address(backend, hub.store, exp_dir, experiment_id)
        await hub.start()
        ctx = HubContext(hub)
        ctx.attach(backend)
        squatter = _Squatter(0)
        fake = _FakeHub(experiment_id, evidence)
        servers: list[grpc.aio.Server] = []
        again: RemoteBackend | None = None
        try:
            await backend.start(ctx)
            (agent_id,) = ctx.added
            await hub.wait_for(lambda: ctx.agent_connected(agent_id), 30, "the agent to connect through the tunnel")
            hub.start_trial(agent_id, "honest", "echo obeyed")  # the real hub is obeyed
            await hub.wait_for(lambda: hub.trials["honest"].final is not None, 30, "the real hub's trial")
            assert hub.trials["honest"].final.state == pb.TRIAL_STATE_SUCCEEDED
            token = hub.token(agent_id)
            pid = _agent_pid(plain_sshd.home, experiment_id, agent_id)

            # the manager goes away and its SSH link with it: sshd frees the worker port
            (mach,) = backend.machines
            port = mach.launch.remote_port
            mach.task.cancel()
            await asyncio.to_thread(mach.close)
            await hub.stop()
            squatter.port = port
            await until(squatter.bind, 30, f"the freed worker port {port} to be bound by the squatter")

            for tls, dials in ((None, 3), (forged, 2)):  # a plain gRPC hub, then a TLS hub with a forged certificate
                server, squatter.fake_hub_port = await _fake_hub_server(fake, tls)
                servers.append(server)
                seen = len(squatter.openings)
                await until(lambda seen=seen, dials=dials: fake.hellos or len(squatter.openings) >= seen + dials, 60,
                            f"{dials} more dials of the agent at the squatter ({'TLS' if tls else 'plain'})")
                assert not fake.hellos, "the agent said Hello (with its token) to a squatter"
                assert token.encode() not in squatter.received, "the agent's token crossed to the squatter"
                await server.stop(None)
            spoke = [o for o in squatter.openings if o]  # (a dial may close before its first byte)
            assert spoke and all(o.startswith(b"\x16\x03") for o in spoke), squatter.openings  # TLS, never h2
            assert not evidence.exists(), "the agent ran the squatter's StartTrial"
            os.kill(pid, 0)  # still alive and redialling: trials would live on

            # the squatter leaves; a restarted manager (same experiment directory, same CA) takes the agent back
            await squatter.close()
            _, hub.hub_kwargs["tls"] = await hub_setup.listen_address(backend, hub.store, exp_dir, experiment_id)
            await hub.start()
            ctx2 = HubContext(hub)
            again = RemoteBackend(_remote_config(plain_sshd.machine))
            ctx2.attach(again)
            await again.start(ctx2)
            await hub.wait_for(lambda: ctx2.agent_connected(agent_id), 60, "the restarted manager to get the agent back")
            assert _agent_pid(plain_sshd.home, experiment_id, agent_id) == pid  # the same agent process, never restarted
        finally:
            await squatter.close()
            for server in servers:
                await server.stop(None)
            if again is not None:
                await again.stop()
            await backend.stop()
            await hub.close()
        assert not evidence.exists()
        assert processes_with(f"NNI_AGENT_REMOTE_RUN={experiment_id}/".encode()) == []

    run_bounded(scenario(), 240)


def test_a_running_agent_that_does_not_verify_the_hub_is_replaced_not_reattached(
        plain_sshd, short_dir: Path) -> None:  # noqa: F811
    """An agent an older manager started (no CA: it talks to whoever answers on its port) is not
    taken back by a manager restarted after the upgrade: it is stopped and one that verifies the
    hub takes its place."""
    experiment_id = "sec" + secrets.token_hex(4)
    exp_dir = short_dir / "exp"
    machine = plain_sshd.machine

    async def scenario() -> None:
        backend = RemoteBackend(_remote_config(machine))
        hub = ProdHub(exp_dir, experiment_id=experiment_id)
        _, hub.hub_kwargs["tls"] = await hub_setup.listen_address(backend, hub.store, exp_dir, experiment_id)
        await hub.start()
        ctx = HubContext(hub)
        ctx.attach(backend)
        try:
            spec = ctx.add_agent(agent_names([machine])[0])
            with socket.socket() as s:  # where the old agent's tunnel was: nothing listens there now
                s.bind(("127.0.0.1", 0))
                gone_port = s.getsockname()[1]
            launch = AgentLaunch(experiment_id, spec.agent_id, "old", f"{machine.python_path}/python3", "", None,
                                 gone_port, 600.0)
            old_command = bootstrap.start_command(launch).replace(
                f" --tls --ca-file {home_path(launch.run_file('ca.crt'))}", "")
            assert "--ca-file" not in old_command
            client = connect(machine)
            try:
                _, out, err = await asyncio.to_thread(run, client, old_command, stdin=spec.token.encode())
            finally:
                client.close()
            old_pid = int(out.strip())
            await until(lambda: _agent_pid(plain_sshd.home, experiment_id, spec.agent_id) == old_pid, 10,
                        "the old agent's pid file")

            await backend.start(ctx)
            await hub.wait_for(lambda: ctx.agent_connected(spec.agent_id), 60, "an agent that verifies the hub")
            assert _agent_pid(plain_sshd.home, experiment_id, spec.agent_id) != old_pid
            await until(lambda: _gone(old_pid), 30, "the old agent to be stopped")
        finally:
            await backend.stop()
            await hub.close()
        assert processes_with(f"NNI_AGENT_REMOTE_RUN={experiment_id}/".encode()) == []

    run_bounded(scenario(), 180)


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie (a daemonised agent's parent is init, which in a
    container may never reap it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _old_agent_hello(credential: str) -> bytes:
    return pb.AgentMessage(hello=pb.Hello(agent_id="a1", token=credential, protocol_major=PROTOCOL_MAJOR + 1,
                                          protocol_minor=0, boot_id="old-agent")).SerializeToString()


def test_an_agent_too_old_to_talk_does_not_spend_the_enrolment_credential(tmp_path: Path) -> None:
    """A single-use credential (DLTS, AML) presented by an agent of another protocol major is
    refused for its version and stays valid: the upgraded agent then enrols with it."""
    credential = "enrol-" + secrets.token_urlsafe(16)
    exp_dir = tmp_path / "exp"

    async def body() -> None:
        store = Store.open(exp_dir)
        with store.transaction():
            store.add_agent("a1", "a1", credential, {}, enrol=True)
        tls = experiment_tls(exp_dir / "tls", ["127.0.0.1"], "ExpSecEnrol")
        hub = Hub(experiment_id="ExpSecEnrol", experiment_dir=exp_dir, store=store, handler=Recorder(exp_dir),
                  tcp="127.0.0.1:0", tls=tls)
        hub.register("a1", credential, enrol=True)
        await hub.start()
        agent: subprocess.Popen[bytes] | None = None
        try:
            credentials = grpc.ssl_channel_credentials(root_certificates=tls.ca_certificate)
            async with grpc.aio.secure_channel(hub.address, credentials) as channel:
                call = channel.stream_stream(CONNECT, request_serializer=lambda b: b,
                                             response_deserializer=pb.ManagerMessage.FromString)()
                await call.write(_old_agent_hello(credential))
                await call.done_writing()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
            assert store.agents()[0]["enrol"] == 1 and store.agents()[0]["spent"] == ""

            # the upgraded agent (a real one, this version) enrols with the same credential
            ca = tmp_path / "ca.crt"
            ca.write_bytes(tls.ca_certificate)
            work = tmp_path / "work"
            work.mkdir()
            agent = subprocess.Popen(
                [sys.executable, "-m", "nni_agent", "--manager", hub.address, "--ca-file", str(ca),
                 "--agent-id", "a1", "--work-dir", str(work), "--log-file", str(tmp_path / "agent.log")],
                env=dict(os.environ, NNI_AGENT_TOKEN=credential), stdin=subprocess.DEVNULL)
            await until(lambda: hub.connected("a1") or agent.poll() is not None, 30, "the upgraded agent to enrol")
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
            assert store.agents()[0]["enrol"] == 0 and store.agents()[0]["token"] != credential
        finally:
            if agent is not None and agent.poll() is None:
                agent.terminate()
                await asyncio.to_thread(agent.wait, 20)
            await hub.stop()
            store.close()

    asyncio.run(body())
