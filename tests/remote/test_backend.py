"""RemoteBackend end to end: real sshd hosts in network namespaces, real agents, the
production gRPC hub and agent registry (tests/support/agent/prodhub.py: per-agent tokens, and
`agent_connected` meaning an open stream now). Agents in a namespace can reach the hub only
through the SSH tunnel."""
from __future__ import annotations

import dataclasses
import json
import secrets
import subprocess
import textwrap
from pathlib import Path

import pytest

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.remote.backend import RemoteBackend
from nni_manager.backends.remote.config import MachineConfig, RemoteConfig
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.hub.tls import experiment_tls
from tests.support.agent.prodhub import HubContext, ProdHub
from tests.support.remote.fixtures import processes_with
from tests.support.bounded import run_bounded

pytestmark = pytest.mark.ssh


def new_hub(short_dir: Path) -> ProdHub:
    experiment_id = "rt" + secrets.token_hex(4)  # TLS from the experiment's own CA, as the loopback hub has
    return ProdHub(short_dir / "exp", experiment_id=experiment_id,
                   tls=experiment_tls(short_dir / "exp" / "tls", ["127.0.0.1"], experiment_id))


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
    return run_bounded(coro, 120)


def test_three_hosts_connect_through_tunnels_and_stop_cleanly(netns_hosts, short_dir):
    async def scenario() -> None:
        async with new_hub(short_dir) as hub:
            ctx = HubContext(hub)
            backend = RemoteBackend(config([h.machine for h in netns_hosts],
                                           agent_env={"NNI_AGENT_ARTIFICIAL_GPUS": "2"}))
            ctx.attach(backend)
            try:
                await backend.start(ctx)
                assert len(ctx.added) == 3
                await hub.wait_for(lambda: all(ctx.agent_connected(a) for a in ctx.added), 30, "three agents")
                assert ctx.failures == {}
                names = {name for name, _ in ctx.added.values()}
                assert names == {f"{h.machine.user}_{h.name}_{h.port}" for h in netns_hosts}
                # the hub is not reachable from inside a host: only the tunnel carries the agent
                probe = subprocess.run(["ip", "netns", "exec", netns_hosts[0].name, "nc", "-z", "-w1",
                                        "127.0.0.1", str(hub.port)])
                assert probe.returncode != 0
                assert {agent_id for agent_id, _, _ in hub.handler.hellos} == set(ctx.added)
                for agent_id, hello, _ in hub.handler.hellos:
                    assert hello.host.work_dir.endswith(f"nni-experiments/{ctx.experiment_id}/agents/{agent_id}")
                    assert hello.gpus.provider == "artificial" and len(hello.gpus.gpus) == 2
                # a trial really runs on a host, with pythonPath first on PATH
                first = next(iter(ctx.added))
                hub.start_trial(first, "t1", "python3 -c 'import sys; print(sys.version_info[:2])'")
                await hub.wait_for(lambda: hub.trials["t1"].final is not None, timeout=30)
                assert hub.trials["t1"].final.state == pb.TRIAL_STATE_SUCCEEDED
                assert len(marked_processes(ctx.experiment_id)) == 3
            finally:
                await backend.stop()
            assert marked_processes(ctx.experiment_id) == []
            # connected means an open stream now: the stopped agents are not
            await hub.wait_for(lambda: not any(ctx.agent_connected(a) for a in ctx.added), 30, "the streams to end")
            token_files = list(netns_hosts[0].home.glob(f".nni-agent/run/{ctx.experiment_id}/*.token"))
            assert token_files == []

    run(scenario())


def test_bad_host_fails_precisely_and_others_go_on(netns_hosts, short_dir, worker_dir):
    fake = worker_dir / "oldpy"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 3.7.16 /opt/old/python3\n")
    (fake / "python3").chmod(0o755)

    async def scenario() -> None:
        async with new_hub(short_dir) as hub:
            ctx = HubContext(hub)
            machines = [netns_hosts[0].machine, dataclasses.replace(netns_hosts[1].machine, python_path=str(fake)),
                        dataclasses.replace(netns_hosts[2].machine, port=2299)]
            backend = RemoteBackend(config(machines))
            ctx.attach(backend)
            try:
                await backend.start(ctx)
                good, old_python, unreachable = ctx.added  # in the machines' order
                assert set(ctx.failures) == {old_python, unreachable}
                assert "no Python >= 3.8 found in pythonPath" in ctx.failures[old_python]
                assert "python3: Python 3.7.16 is older than 3.8" in ctx.failures[old_python]
                assert f"{machines[2].user}@{netns_hosts[2].name}:2299: cannot connect" in ctx.failures[unreachable]
                assert "the proxy command exited with code 1" in ctx.failures[unreachable]
                await hub.wait_for(lambda: ctx.agent_connected(good), 30, f"{good} to connect")
                assert not ctx.agent_connected(old_python) and not ctx.agent_connected(unreachable)
                assert {agent_id for agent_id, _, _ in hub.handler.hellos} == {good}
            finally:
                await backend.stop()
            assert marked_processes(ctx.experiment_id) == []

    run(scenario())


def test_ssh_link_killed_mid_trial_reconnects_same_port_metrics_exactly_once(netns_hosts, short_dir, worker_dir):
    host = netns_hosts[2]
    n = 30
    script = steady_trial(worker_dir / "slow.py", n)

    async def scenario() -> None:
        async with new_hub(short_dir) as hub:
            ctx = HubContext(hub)
            backend = RemoteBackend(config([host.machine]))
            ctx.attach(backend)
            try:
                await backend.start(ctx)
                (agent_id,) = ctx.added
                await hub.wait_for(lambda: ctx.agent_connected(agent_id), 30, "the agent to connect")
                port = backend.machines[0].launch.remote_port
                hub.start_trial(agent_id, "slow", f"python3 {script}")
                await hub.wait_for(lambda: len(hub.trials["slow"].metrics) >= 5, timeout=30)
                assert host.kill_connections() >= 1  # the sshd child serving our link dies
                await hub.wait_for(lambda: hub.trials["slow"].final is not None, timeout=60)
                assert backend.machines[0].launch.remote_port == port  # same worker port after reconnect
                assert hub.handler.sessions(agent_id) >= 2  # the agent redialled through the new tunnel
                assert ctx.agent_connected(agent_id)
                assert ctx.failures == {}
            finally:
                await backend.stop()
            view = hub.trials["slow"]
            assert view.final.state == pb.TRIAL_STATE_SUCCEEDED
            values = [json.loads(json.loads(m.data)["value"]) for m in view.metrics]
            assert values == list(range(n)) + [n]
            assert hub.handler.duplicates == 0 and hub.handler.gaps == []
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
    assert "nni_agent/boot.py" in text and "-- --manager-file" in text and ".manager" in text and "--token-file" in text
    assert "never on a command line" in text


def test_restarted_manager_reattaches_although_the_old_session_still_holds_the_port(netns_hosts, short_dir, worker_dir):
    """The old manager died but its SSH session lingers (an orphaned proxy process keeps it),
    so the agent's worker port stays taken: the new manager (a new hub built from the store,
    on another port) forwards another worker port and points the running agent at it; the
    trial is never restarted and no metric is lost."""
    host = netns_hosts[1]
    n = 40
    script = steady_trial(worker_dir / "kept.py", n)

    async def scenario() -> None:
        hub = await new_hub(short_dir).start()
        ctx = HubContext(hub)
        old = RemoteBackend(config([host.machine]))
        ctx.attach(old)
        new: RemoteBackend | None = None
        try:
            await old.start(ctx)
            (agent_id,) = ctx.added
            await hub.wait_for(lambda: ctx.agent_connected(agent_id), 30, "the agent to connect")
            old_port, old_hub_port = old.machines[0].launch.remote_port, hub.port
            hub.start_trial(agent_id, "kept", f"python3 {script}")
            await hub.wait_for(lambda: len(hub.trials["kept"].metrics) >= 5, timeout=30)
            pid = hub.trials["kept"].statuses[0].pid
            for m in old.machines:  # the old manager stops working, but its SSH link stays open
                m.task.cancel()
            await hub.restart(same_port=False)
            assert hub.port != old_hub_port and not ctx.agent_connected(agent_id)
            ctx2 = HubContext(hub)
            new = RemoteBackend(config([host.machine]))
            ctx2.attach(new)
            await new.start(ctx2)
            assert list(ctx2.added) == [agent_id]  # the same agent (and token), from the store
            if old.machines[0].connected():  # the old session held the port all along: the tunnel moved
                assert new.machines[0].launch.remote_port != old_port
            # else the old link died by itself (its forward met the stopped hub) and freed the
            # port, which the new manager may take again; either way the agent re-attaches:
            await hub.wait_for(lambda: hub.trials["kept"].final is not None, timeout=60)
            assert ctx2.agent_connected(agent_id)
        finally:
            if new is not None:
                await new.stop()
            for m in old.machines:
                m.close()
            await hub.close()
        view = hub.trials["kept"]
        assert view.final.state == pb.TRIAL_STATE_SUCCEEDED
        assert [s.pid for s in view.statuses] == [pid, pid]  # one process, never restarted
        assert [json.loads(json.loads(m.data)["value"]) for m in view.metrics] == list(range(n)) + [n]
        assert not hub.handler.hellos[-1][2]  # the hub saw the same agent process come back
        assert hub.handler.duplicates == 0 and hub.handler.gaps == []
        assert ctx2.failures == {} and marked_processes(ctx.experiment_id) == []

    run(scenario())
