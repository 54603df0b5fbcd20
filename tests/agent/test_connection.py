"""The agent's half of the protocol, against a real gRPC hub and a real agent process."""
from __future__ import annotations

import asyncio
import signal
import io
import json
import random
import sys
import tarfile
import textwrap
from pathlib import Path

import psutil

from nni_agent.v1 import agent_pb2 as pb
from tests.agent.hubstub import HubStub, StubServer, start_trial

PY = sys.executable


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _burst_script(tmp_path: Path, n: int) -> Path:
    return _script(tmp_path, "burst.py", f"""
        import nni_agent as nni
        nni.get_next_parameter()
        for i in range({n}):
            nni.report_intermediate_result(i)
        nni.report_final_result({n})
    """)


def _assert_exactly_once_in_order(view, n: int) -> None:
    assert [m.trial_seq for m in view.metrics] == list(range(1, n + 2))
    values = [json.loads(json.loads(m.data)["value"]) for m in view.metrics]
    assert values == list(range(n)) + [n]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 240))


def test_wrong_token_is_refused_and_never_echoed(tmp_path):
    async def scenario() -> None:
        hub = HubStub(token="the-right-token")
        async with StubServer(hub) as srv:
            proc = srv.start_agent(tmp_path / "w", token="a-wrong-token-1234")
            code = await asyncio.to_thread(proc.wait, 30)
        log = (tmp_path / "agent-1.log").read_text()
        assert code == 2, log
        assert "invalid token" in log and "refused" in log
        assert "a-wrong-token-1234" not in log
        assert hub.sessions == 0

    run(scenario())


def test_token_stays_out_of_argv_and_trial_environment(tmp_path):
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            proc = await srv.connect_agent(tmp_path / "w")
            assert hub.token not in " ".join(psutil.Process(proc.pid).cmdline())
            env_dump = tmp_path / "env.json"
            hub.send(**start_trial("envtr", f"{PY} -c 'import json,os; json.dump(dict(os.environ), open(\"{env_dump}\", \"w\"))'"))
            await hub.wait_for(lambda: hub.trials["envtr"].final is not None)
            env = json.loads(env_dump.read_text())
            assert "NNI_AGENT_TOKEN" not in env and hub.token not in json.dumps(env)
            assert env["NNI_TRIAL_JOB_ID"] == "envtr" and env["NNI_EXP_ID"] == "stubexp1"

    run(scenario())


def test_100k_metrics_arrive_in_order_exactly_once(tmp_path):
    n = 100_000
    script = _burst_script(tmp_path, n)

    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("burst", f"{PY} {script}"))
            await hub.wait_for(lambda: hub.trials["burst"].final is not None, timeout=180)
        view = hub.trials["burst"]
        assert view.final.state == pb.TRIAL_STATE_SUCCEEDED, view.final
        _assert_exactly_once_in_order(view, n)
        assert hub.duplicates == 0

    run(scenario())


def test_stream_cut_20_times_during_a_metric_burst_loses_and_duplicates_nothing(tmp_path):
    n = 30_000
    script = _burst_script(tmp_path, n)
    rng = random.Random(20)
    cuts = [rng.randint(1, 3000) for _ in range(20)]

    async def scenario() -> None:
        hub = HubStub()
        hub.cut_after_records = lambda: cuts.pop() if cuts else None
        async with StubServer(hub) as srv:
            await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("cuts", f"{PY} {script}"))
            await hub.wait_for(lambda: hub.trials["cuts"].final is not None, timeout=180)
        assert not cuts, f"{len(cuts)} cuts never happened"
        assert hub.sessions >= 21
        view = hub.trials["cuts"]
        assert view.final.state == pb.TRIAL_STATE_SUCCEEDED
        _assert_exactly_once_in_order(view, n)
        assert [s.state for s in view.statuses] == [pb.TRIAL_STATE_RUNNING, pb.TRIAL_STATE_SUCCEEDED]

    run(scenario())


def _tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_code_bundle_crosses_once_per_worker_and_is_cached(tmp_path):
    payload = bytes(random.Random(1).getrandbits(8) for _ in range(300_000))  # several chunks
    bundle = _tarball({"train.py": b"import nni_agent as nni\nnni.get_next_parameter()\nnni.report_final_result(open('blob','rb').read().__len__())\n",
                       "blob": payload})

    async def scenario() -> None:
        hub = HubStub()
        digest = hub.add_bundle(bundle)
        ref = pb.Bundle(digest=digest, size=len(bundle))
        async with StubServer(hub) as srv:
            agent = await srv.connect_agent(tmp_path / "w")
            for tid in ("bun01", "bun02"):
                hub.send(**start_trial(tid, f"{PY} train.py", bundle=ref))
            await hub.wait_for(lambda: all(hub.trials[t].final for t in ("bun01", "bun02")))
            assert hub.bundle_requests == [digest]
            # A new agent process on the same worker reuses the cached copy.
            hub.send(shutdown=pb.Shutdown(reason="restart"))
            assert await asyncio.to_thread(agent.wait, 30) == 0
            srv.start_agent(tmp_path / "w", agent_id="agent-2")
            await hub.wait_for(lambda: hub.sessions == 2)
            hub.send(**start_trial("bun03", f"{PY} train.py", bundle=ref))
            await hub.wait_for(lambda: hub.trials["bun03"].final is not None)
        assert hub.bundle_requests == [digest]
        for tid in ("bun01", "bun02", "bun03"):
            final = hub.trials[tid].final
            assert final.state == pb.TRIAL_STATE_SUCCEEDED, final.reason
            assert json.loads(json.loads(hub.trials[tid].metrics[-1].data)["value"]) == len(payload)

    run(scenario())


def test_corrupted_bundle_fails_the_trial_with_a_reason_and_the_agent_keeps_going(tmp_path):
    async def scenario() -> None:
        hub = HubStub()
        good = _tarball({"a.txt": b"x"})
        digest = hub.add_bundle(good)
        hub.bundles[digest] = good[:-10] + b"corrupted!"
        async with StubServer(hub) as srv:
            await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("bad01", "true", bundle=pb.Bundle(digest=digest)))
            hub.send(**start_trial("ok001", "true"))
            await hub.wait_for(lambda: hub.trials["bad01"].final and hub.trials["ok001"].final)
        assert hub.trials["bad01"].final.state == pb.TRIAL_STATE_FAILED
        assert "corrupted" in hub.trials["bad01"].final.reason
        assert hub.trials["ok001"].final.state == pb.TRIAL_STATE_SUCCEEDED

    run(scenario())


def test_malformed_commands_fail_the_trial_not_the_agent(tmp_path):
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            agent = await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("empty", "   "))
            hub.send(**start_trial("nocmd", "definitely-not-a-command-xyz"))
            hub.send(**start_trial("baddr", "true", working_directory="/proc/no/such/place"))
            hub.send(cancel_trial=pb.CancelTrial(trial_id="never", reason="stop it"))
            hub.send(**start_trial("fine1", "true"))
            await hub.wait_for(lambda: all(hub.trials[t].final for t in ("empty", "nocmd", "baddr", "never", "fine1")))
            assert agent.poll() is None
        t = hub.trials
        assert t["empty"].final.state == pb.TRIAL_STATE_FAILED and "empty" in t["empty"].final.reason
        assert t["nocmd"].final.state == pb.TRIAL_STATE_FAILED and "not found" in t["nocmd"].final.reason
        assert t["baddr"].final.state == pb.TRIAL_STATE_FAILED and "/proc/no/such/place" in t["baddr"].final.reason
        assert t["never"].final.state == pb.TRIAL_STATE_USER_CANCELED
        assert t["fine1"].final.state == pb.TRIAL_STATE_SUCCEEDED

    run(scenario())


def test_trials_survive_manager_outage_and_records_are_replayed(tmp_path):
    script = _script(tmp_path, "slow.py", """
        import time, nni_agent as nni
        nni.get_next_parameter()
        for i in range(30):
            nni.report_intermediate_result(i)
            time.sleep(0.05)
        nni.report_final_result(30)
    """)

    async def scenario() -> None:
        hub = HubStub()
        srv = StubServer(hub)
        await srv.server.start()
        agent = await srv.connect_agent(tmp_path / "w")
        hub.send(**start_trial("outag", f"{PY} {script}"))
        await hub.wait_for(lambda: len(hub.trials["outag"].metrics) >= 3)
        await srv.server.stop(grace=None)  # the manager vanishes while the trial runs
        await asyncio.sleep(2.5)
        srv2 = StubServer(hub)
        srv2.server = __import__("grpc").aio.server()
        from nni_agent.v1 import agent_pb2_grpc as pb_grpc
        pb_grpc.add_AgentHubServicer_to_server(hub, srv2.server)
        srv2.server.add_insecure_port(f"127.0.0.1:{srv.port}")
        await srv2.server.start()
        try:
            await hub.wait_for(lambda: hub.trials["outag"].final is not None, timeout=60)
        finally:
            srv2.agents = [agent]
            await srv2.__aexit__(None, None, None)
        _assert_exactly_once_in_order(hub.trials["outag"], 30)
        assert hub.trials["outag"].final.state == pb.TRIAL_STATE_SUCCEEDED

    run(scenario())


def test_orphan_timeout_stops_trials_and_exits(tmp_path):
    marker = tmp_path / "still-running"

    async def scenario() -> None:
        hub = HubStub()
        srv = StubServer(hub)
        await srv.server.start()
        agent = await srv.connect_agent(tmp_path / "w", args=("--orphan-timeout", "2"))
        hub.send(**start_trial("orph1", f"sh -c 'while true; do touch {marker}; sleep 0.1; done'"))
        await hub.wait_for(lambda: bool(hub.trials["orph1"].statuses))
        await srv.server.stop(grace=None)
        code = await asyncio.to_thread(agent.wait, 60)
        assert code == 3
        marker.unlink(missing_ok=True)
        await asyncio.sleep(0.5)
        assert not marker.exists(), "a trial kept running after its agent gave up"

    run(scenario())


def test_agent_stopped_by_a_signal_reports_its_trials_as_system_canceled(tmp_path):
    """SIGTERM comes from the system (a pod evicted or deleted, a machine going down), never
    from the user: the trials end SYS_CANCELED, saying so, and are reported before it exits."""
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            agent = await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("long2", "sleep 600"))
            await hub.wait_for(lambda: bool(hub.trials["long2"].statuses))
            agent.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(agent.wait, 30) == 0
        final = hub.trials["long2"].final
        assert final.state == pb.TRIAL_STATE_SYS_CANCELED and "SIGTERM" in final.reason

    run(scenario())


def test_shutdown_command_cancels_trials_and_reports_them(tmp_path):
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            agent = await srv.connect_agent(tmp_path / "w")
            hub.send(**start_trial("long1", "sleep 600"))
            await hub.wait_for(lambda: bool(hub.trials["long1"].statuses))
            pid = hub.trials["long1"].statuses[0].pid
            hub.send(shutdown=pb.Shutdown(reason="experiment over"))
            assert await asyncio.to_thread(agent.wait, 30) == 0
        final = hub.trials["long1"].final
        assert final.state == pb.TRIAL_STATE_USER_CANCELED and "experiment over" in final.reason
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

    run(scenario())


def test_gpu_reports_reach_the_manager_in_hello_and_telemetry(tmp_path):
    async def scenario() -> None:
        hub = HubStub()
        async with StubServer(hub) as srv:
            await srv.connect_agent(tmp_path / "w", extra_env={"NNI_AGENT_ARTIFICIAL_GPUS": "3"})
        gpus = hub.hellos[0].gpus
        assert gpus.provider == "artificial" and [g.index for g in gpus.gpus] == [0, 1, 2]
        assert hub.hellos[0].host.cpu_count >= 1 and hub.hellos[0].agent_version

    run(scenario())


def test_manager_file_moves_the_endpoint_without_restarting_trials(tmp_path):
    """A backend that must move the tunnel (the old port is stuck) only rewrites the file."""
    script = _script(tmp_path, "slow.py", """
        import time, nni_agent as nni
        nni.get_next_parameter()
        for i in range(40):
            nni.report_intermediate_result(i)
            time.sleep(0.05)
        nni.report_final_result(40)
    """)
    where = tmp_path / "manager-address"

    async def scenario() -> None:
        hub = HubStub()
        first = StubServer(hub)
        await first.server.start()
        where.write_text(f"127.0.0.1:{first.port}\n")
        agent = await first.connect_agent(tmp_path / "w", manager_file=where)
        hub.send(**start_trial("moved", f"{PY} {script}"))
        await hub.wait_for(lambda: len(hub.trials["moved"].metrics) >= 3)
        pid = hub.trials["moved"].statuses[0].pid
        await first.server.stop(grace=None)
        second = StubServer(hub)  # a new port
        async with second:
            where.write_text(f"127.0.0.1:{second.port}\n")
            second.agents = [agent]
            await hub.wait_for(lambda: hub.trials["moved"].final is not None, timeout=60)
        assert second.port != first.port and hub.sessions >= 2
        assert hub.trials["moved"].statuses[0].pid == pid  # the same trial process carried on
        _assert_exactly_once_in_order(hub.trials["moved"], 40)

    run(scenario())
