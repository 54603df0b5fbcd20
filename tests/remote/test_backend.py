"""RemoteBackend end to end: real sshd hosts in network namespaces, real agents, a real
gRPC hub (the agent tests' HubStub). Agents in a namespace can reach the hub only through
the SSH tunnel."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import subprocess
import textwrap
from pathlib import Path

import pytest

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import AgentSpec, PlacementHints
from nni_manager.backends.remote.backend import RemoteBackend
from nni_manager.backends.remote.config import MachineConfig, RemoteConfig
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from tests.agent.hubstub import HubStub, StubServer, start_trial
from tests.remote.conftest import processes_with

pytestmark = pytest.mark.ssh


class FakeContext:
    """The manager core's side of the backend contract, over a HubStub (one token for all)."""

    def __init__(self, hub: HubStub, port: int, experiment_dir: Path) -> None:
        self.hub = hub
        self.port = port
        self.experiment_id = "rt" + secrets.token_hex(4)
        self.experiment_dir = experiment_dir
        self.added: dict[str, tuple[str, PlacementHints]] = {}
        self.failures: dict[str, str] = {}

    def add_agent(self, name: str, hints: PlacementHints) -> AgentSpec:
        agent_id = f"agent{len(self.added)}"
        self.added[agent_id] = (name, hints)
        return AgentSpec(agent_id, self.hub.token, f"127.0.0.1:{self.port}", Path("/nonexistent.sock"))

    def agent_failed(self, agent_id: str, reason: str) -> None:
        self.failures[agent_id] = reason

    def agent_connected(self, agent_id: str) -> bool:
        return any(h.agent_id == agent_id for h in self.hub.hellos)


def config(machines: list[MachineConfig], agent_env: dict[str, str] | None = None) -> ExperimentConfig:
    return ExperimentConfig(
        trial_command="true", trial_code_directory=Path("."),
        training_service=TrainingServiceConfig(platform="remote", options=RemoteConfig(machines),
                                               reconnect_window=30, agent_env=agent_env or {}),
        trial_grace_period=1.0,
    )


def marked_processes(experiment_id: str) -> list[int]:
    """Processes started for this experiment (agents, trials, their children)."""
    return processes_with(f"NNI_AGENT_REMOTE_RUN={experiment_id}/".encode())


def steady_trial(path: Path, n: int) -> Path:
    """A trial reporting 0..n-1 every 0.1 s, then n as its final result."""
    path.write_text(textwrap.dedent(f"""
        import time
        import nni_agent as nni
        nni.get_next_parameter()
        for i in range({n}):
            nni.report_intermediate_result(i)
            time.sleep(0.1)
        nni.report_final_result({n})
    """))
    return path


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_three_hosts_connect_through_tunnels_and_stop_cleanly(netns_hosts, tmp_path):
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            ctx = FakeContext(hub, srv.port, tmp_path)
            backend = RemoteBackend(config([h.machine for h in netns_hosts],
                                           agent_env={"NNI_AGENT_ARTIFICIAL_GPUS": "2"}))
            try:
                await backend.start(ctx)
                await hub.wait_for(lambda: len({h.agent_id for h in hub.hellos}) == 3, timeout=30)
                assert ctx.failures == {}
                names = {name for name, _ in ctx.added.values()}
                assert names == {f"root_{h.name}_{h.port}" for h in netns_hosts}
                # the hub is not reachable from inside a host: only the tunnel carries the agent
                probe = subprocess.run(["ip", "netns", "exec", netns_hosts[0].name, "nc", "-z", "-w1",
                                        "127.0.0.1", str(srv.port)])
                assert probe.returncode != 0
                for hello in hub.hellos:
                    assert hello.host.work_dir.endswith(f"nni-experiments/{ctx.experiment_id}/agents/{hello.agent_id}")
                    assert hello.gpus.provider == "artificial" and len(hello.gpus.gpus) == 2
                # a trial really runs on a host, with pythonPath first on PATH
                hub.send(**start_trial("t1", "python3 -c 'import sys; print(sys.version_info[:2])'"))
                await hub.wait_for(lambda: hub.trials["t1"].final is not None, timeout=30)
                assert hub.trials["t1"].final.state == pb.TRIAL_STATE_SUCCEEDED
                assert len(marked_processes(ctx.experiment_id)) == 3
            finally:
                await backend.stop()
            assert marked_processes(ctx.experiment_id) == []
            token_files = list(Path.home().glob(f".nni-agent/run/{ctx.experiment_id}/*.token"))
            assert token_files == []

    run(scenario())


def test_bad_host_fails_precisely_and_others_go_on(netns_hosts, tmp_path):
    fake = tmp_path / "oldpy"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 3.8.10 /opt/old/python3\n")
    (fake / "python3").chmod(0o755)

    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            ctx = FakeContext(hub, srv.port, tmp_path)
            machines = [netns_hosts[0].machine, dataclasses.replace(netns_hosts[1].machine, python_path=str(fake)),
                        dataclasses.replace(netns_hosts[2].machine, port=2299)]
            backend = RemoteBackend(config(machines))
            try:
                await backend.start(ctx)
                assert set(ctx.failures) == {"agent1", "agent2"}
                assert "no Python >= 3.10 found in pythonPath" in ctx.failures["agent1"]
                assert "python3: Python 3.8.10 is older than 3.10" in ctx.failures["agent1"]
                assert f"root@{netns_hosts[2].name}:2299: cannot connect" in ctx.failures["agent2"]
                assert "the proxy command exited with code 1" in ctx.failures["agent2"]
                await hub.wait_for(lambda: {h.agent_id for h in hub.hellos} == {"agent0"}, timeout=30)
            finally:
                await backend.stop()
            assert marked_processes(ctx.experiment_id) == []

    run(scenario())


def test_ssh_link_killed_mid_trial_reconnects_same_port_metrics_exactly_once(netns_hosts, tmp_path):
    host = netns_hosts[2]
    n = 30
    script = steady_trial(tmp_path / "slow.py", n)

    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            ctx = FakeContext(hub, srv.port, tmp_path)
            backend = RemoteBackend(config([host.machine]))
            try:
                await backend.start(ctx)
                await hub.wait_for(lambda: bool(hub.hellos), timeout=30)
                port = backend.machines[0].launch.remote_port
                hub.send(**start_trial("slow", f"python3 {script}"))
                await hub.wait_for(lambda: len(hub.trials["slow"].metrics) >= 5, timeout=30)
                assert host.kill_connections() >= 1  # the sshd child serving our link dies
                await hub.wait_for(lambda: hub.trials["slow"].final is not None, timeout=60)
                assert backend.machines[0].launch.remote_port == port  # same worker port after reconnect
                assert hub.sessions >= 2  # the agent redialled through the new tunnel
                assert ctx.failures == {}
            finally:
                await backend.stop()
            view = hub.trials["slow"]
            assert view.final.state == pb.TRIAL_STATE_SUCCEEDED
            values = [json.loads(json.loads(m.data)["value"]) for m in view.metrics]
            assert values == list(range(n)) + [n]
            assert marked_processes(ctx.experiment_id) == []

    run(scenario())


def test_render_names_commands_without_secrets(netns_hosts):
    m = dataclasses.replace(netns_hosts[0].machine, password="hunter2-secret", ssh_key_file=None)
    dry = RemoteBackend(config([m])).render()
    text = dry.text
    assert "hunter2-secret" not in text and "hunter2-secret" not in repr(dry.requests)
    (request,) = dry.requests
    assert (request["host"], request["port"]) == (m.host, m.port) and "--token-file" in request["start_command"]
    assert f"ip netns exec {m.host} nc 127.0.0.1 {m.port}" in text
    assert "-m nni_agent --manager-file" in text and ".manager" in text and "--token-file" in text
    assert "never on a command line" in text


def test_restarted_manager_reattaches_although_the_old_session_still_holds_the_port(netns_hosts, tmp_path):
    """The old manager died but its SSH session lingers (an orphaned proxy process keeps it),
    so the agent's worker port stays taken: the new backend forwards another port and points
    the running agent at it; the trial is never restarted and no metric is lost."""
    host = netns_hosts[1]
    n = 40
    script = steady_trial(tmp_path / "kept.py", n)

    async def scenario() -> None:
        hub = HubStub()
        first = StubServer(hub)
        await first.server.start()
        ctx = FakeContext(hub, first.port, tmp_path)
        old = RemoteBackend(config([host.machine]))
        await old.start(ctx)
        await hub.wait_for(lambda: bool(hub.hellos), timeout=30)
        old_port = old.machines[0].launch.remote_port
        hub.send(**start_trial("kept", f"python3 {script}"))
        await hub.wait_for(lambda: len(hub.trials["kept"].metrics) >= 5, timeout=30)
        pid = hub.trials["kept"].statuses[0].pid
        for m in old.machines:  # the old manager stops working, but its SSH link stays open
            m.task.cancel()
        await first.server.stop(grace=None)
        second = StubServer(hub)
        await second.server.start()
        ctx2 = FakeContext(hub, second.port, tmp_path)
        ctx2.experiment_id = ctx.experiment_id
        new = RemoteBackend(config([host.machine]))
        try:
            await new.start(ctx2)
            assert new.machines[0].launch.remote_port != old_port
            await hub.wait_for(lambda: hub.trials["kept"].final is not None, timeout=60)
        finally:
            await new.stop()
            for m in old.machines:
                m.close()
            await second.server.stop(grace=None)
        view = hub.trials["kept"]
        assert view.final.state == pb.TRIAL_STATE_SUCCEEDED
        assert [s.pid for s in view.statuses] == [pid, pid]  # one process, never restarted
        assert [json.loads(json.loads(m.data)["value"]) for m in view.metrics] == list(range(n)) + [n]
        assert ctx2.failures == {} and marked_processes(ctx.experiment_id) == []

    run(scenario())
