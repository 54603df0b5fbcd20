"""The agent's half of the protocol, against the production hub (nni_manager.hub.Hub, with a
recording handler: tests/support/agent/prodhub.py) and real agent processes. Stream cuts come from a
TCP relay between them (tests/support/chaos/relay.py); a manager restart is a new Hub built from the
store, as a restarted manager builds it."""
from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import textwrap
from pathlib import Path

import psutil

from nni_agent.v1 import agent_pb2 as pb
from nni_manager import bundle
from tests.support.agent.prodhub import ProdHub, TrialView
from tests.support.agent.trialkit import marked_processes
from tests.support.chaos.relay import ChaosRelay
from tests.support.bounded import run_bounded

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


def _paced_script(tmp_path: Path, n: int) -> Path:
    return _script(tmp_path, "slow.py", f"""
        import time, nni_agent as nni
        nni.get_next_parameter()
        for i in range({n}):
            nni.report_intermediate_result(i)
            time.sleep(0.05)
        nni.report_final_result({n})
    """)


def _assert_exactly_once_in_order(view: TrialView, n: int) -> None:
    assert [m.trial_seq for m in view.metrics] == list(range(1, n + 2))
    values = [json.loads(json.loads(m.data)["value"]) for m in view.metrics]
    assert values == list(range(n)) + [n]


def _assert_hub_kept_its_promise(hub: ProdHub) -> None:
    """What reached the manager core: each record once, in seq order, none missing."""
    assert hub.handler.duplicates == 0 and hub.handler.gaps == [] and hub.handler.errors == []


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _cut_all(relay: ChaosRelay) -> int:
    """Reset every live connection through the relay (both sides see RST, as after a crash)."""
    live = relay.live
    for pipe in live:
        relay._close(pipe, reset=True)
    relay.counts["cut"] += len(live)
    return len(live)


def run(coro):
    return run_bounded(coro, 240)


def test_wrong_token_is_refused_and_never_echoed(tmp_path, short_dir):
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            hub.add_agent("agent-1")
            proc = hub.start_agent(tmp_path / "w", token="a-wrong-token-1234")
            code = await asyncio.to_thread(proc.wait, 30)
            assert not hub.connected("agent-1")
        log = (tmp_path / "agent-1.log").read_text()
        assert code == 2, log
        assert "invalid token" in log and "refused" in log
        assert "a-wrong-token-1234" not in log
        assert hub.handler.hellos == []

    run(scenario())


def test_token_stays_out_of_argv_and_trial_environment(tmp_path, short_dir):
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            proc = await hub.connect_agent(tmp_path / "w")
            token = hub.token("agent-1")
            assert token not in " ".join(psutil.Process(proc.pid).cmdline())
            env_dump = tmp_path / "env.json"
            hub.start_trial("agent-1", "envtr",
                            f"{PY} -c 'import json,os; json.dump(dict(os.environ), open(\"{env_dump}\", \"w\"))'")
            await hub.wait_for(lambda: hub.trials["envtr"].final is not None)
            env = json.loads(env_dump.read_text())
            assert "NNI_AGENT_TOKEN" not in env and token not in json.dumps(env)
            assert env["NNI_TRIAL_JOB_ID"] == "envtr" and env["NNI_EXP_ID"] == hub.experiment_id

    run(scenario())


def test_100k_metrics_arrive_in_order_exactly_once(tmp_path, short_dir):
    n = 100_000
    script = _burst_script(tmp_path, n)

    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            await hub.connect_agent(tmp_path / "w")
            hub.start_trial("agent-1", "burst", f"{PY} {script}")
            await hub.wait_for(lambda: hub.trials["burst"].final is not None, timeout=180, what="the burst to end")
        view = hub.trials["burst"]
        assert view.final.state == pb.TRIAL_STATE_SUCCEEDED, view.final
        _assert_exactly_once_in_order(view, n)
        _assert_hub_kept_its_promise(hub)

    run(scenario())


def test_stream_cut_20_times_during_a_metric_burst_loses_and_duplicates_nothing(tmp_path, short_dir):
    """Each cut lands after the hub has stored a batch and before its Ack leaves: the agent
    learns what was stored only from the next Welcome, and must neither lose nor resend it.
    The agent sends up to 2,048 records a batch: a session ends after its first batch or two."""
    n = 80_000
    script = _burst_script(tmp_path, n)
    rng = random.Random(20)
    budgets = [rng.randint(1, 2048) for _ in range(20)]  # records stored per session before its cut

    async def scenario() -> None:
        relay = ChaosRelay(20)
        async with ProdHub(short_dir / "exp") as hub:
            relay.target = hub.address
            await relay.start()
            stored_this_session = 0

            def on_hello(agent_id: str) -> None:
                nonlocal stored_this_session
                stored_this_session = 0

            def after_apply(agent_id: str, records: list[pb.Record]) -> None:
                nonlocal stored_this_session
                stored_this_session += len(records)
                if budgets and stored_this_session >= budgets[-1] and _cut_all(relay):
                    budgets.pop()

            hub.handler.on_hello, hub.handler.after_apply = on_hello, after_apply
            await hub.connect_agent(tmp_path / "w", address=f"127.0.0.1:{relay.port}")
            hub.start_trial("agent-1", "cuts", f"{PY} {script}")
            await hub.wait_for(lambda: hub.trials["cuts"].final is not None, timeout=180, what="the burst to end")
        await relay.stop()  # after the agent exited: cut now, its last Ack could be lost and it would wait for it
        assert not budgets, f"{len(budgets)} cuts never happened"
        assert hub.handler.sessions("agent-1") >= 21 and relay.counts["cut"] >= 20, relay.counts
        view = hub.trials["cuts"]
        assert view.final.state == pb.TRIAL_STATE_SUCCEEDED
        _assert_exactly_once_in_order(view, n)
        assert [s.state for s in view.statuses] == [pb.TRIAL_STATE_RUNNING, pb.TRIAL_STATE_SUCCEEDED]
        _assert_hub_kept_its_promise(hub)

    run(scenario())


def _code_dir(tmp_path: Path, files: dict[str, bytes]) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    for name, data in files.items():
        (code / name).write_bytes(data)
    return code


def test_code_bundle_crosses_once_per_worker_and_is_cached(tmp_path, short_dir):
    payload = bytes(random.Random(1).getrandbits(8) for _ in range(300_000))  # several chunks
    code = _code_dir(tmp_path, {
        "train.py": b"import nni_agent as nni\nnni.get_next_parameter()\n"
                    b"nni.report_final_result(open('blob','rb').read().__len__())\n",
        "blob": payload})

    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            packed = bundle.pack(code, hub.experiment_dir / "bundles")  # as the manager packs trialCodeDirectory
            ref = pb.Bundle(digest=packed.digest, size=packed.size)
            agent = await hub.connect_agent(tmp_path / "w")
            for tid in ("bun01", "bun02"):
                hub.start_trial("agent-1", tid, f"{PY} train.py", bundle=ref)
            await hub.wait_for(lambda: all(hub.trials[t].final for t in ("bun01", "bun02")))
            assert hub.bundles_served == [packed.digest]
            # A new agent process on the same worker reuses the cached copy.
            hub.send("agent-1", shutdown=pb.Shutdown(reason="restart"))
            assert await asyncio.to_thread(agent.wait, 30) == 0
            await hub.connect_agent(tmp_path / "w", "agent-2")
            hub.start_trial("agent-2", "bun03", f"{PY} train.py", bundle=ref)
            await hub.wait_for(lambda: hub.trials["bun03"].final is not None)
        assert hub.bundles_served == [packed.digest]
        for tid in ("bun01", "bun02", "bun03"):
            final = hub.trials[tid].final
            assert final.state == pb.TRIAL_STATE_SUCCEEDED, final.reason
            assert json.loads(json.loads(hub.trials[tid].metrics[-1].data)["value"]) == len(payload)

    run(scenario())


def test_corrupted_bundle_fails_the_trial_with_a_reason_and_the_agent_keeps_going(tmp_path, short_dir):
    """The manager's cached bundle was damaged on its disk: the hub serves what it has, the
    agent checks the digest."""
    code = _code_dir(tmp_path, {"a.txt": b"x"})

    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            packed = bundle.pack(code, hub.experiment_dir / "bundles")
            good = packed.path.read_bytes()
            packed.path.write_bytes(good[:-10] + b"corrupted!")
            await hub.connect_agent(tmp_path / "w")
            hub.start_trial("agent-1", "bad01", "true", bundle=pb.Bundle(digest=packed.digest))
            hub.start_trial("agent-1", "ok001", "true")
            await hub.wait_for(lambda: hub.trials["bad01"].final and hub.trials["ok001"].final)
            assert hub.connected("agent-1")
        assert hub.bundles_served == [packed.digest]
        assert hub.trials["bad01"].final.state == pb.TRIAL_STATE_FAILED
        assert "corrupted" in hub.trials["bad01"].final.reason
        assert hub.trials["ok001"].final.state == pb.TRIAL_STATE_SUCCEEDED

    run(scenario())


def test_malformed_commands_fail_the_trial_not_the_agent(tmp_path, short_dir):
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            agent = await hub.connect_agent(tmp_path / "w")
            hub.start_trial("agent-1", "empty", "   ")
            hub.start_trial("agent-1", "nocmd", "definitely-not-a-command-xyz")
            hub.start_trial("agent-1", "baddr", "true", working_directory="/proc/no/such/place")
            hub.send("agent-1", cancel_trial=pb.CancelTrial(trial_id="never", reason="stop it"))
            hub.start_trial("agent-1", "fine1", "true")
            await hub.wait_for(lambda: all(hub.trials[t].final for t in ("empty", "nocmd", "baddr", "never", "fine1")))
            assert agent.poll() is None and hub.connected("agent-1")
            await hub.wait_for(lambda: not hub.hub.pending_commands("agent-1"), 10, "every command acknowledged")
        t = hub.trials
        assert t["empty"].final.state == pb.TRIAL_STATE_FAILED and "empty" in t["empty"].final.reason
        assert t["nocmd"].final.state == pb.TRIAL_STATE_FAILED and "not found" in t["nocmd"].final.reason
        assert t["baddr"].final.state == pb.TRIAL_STATE_FAILED and "/proc/no/such/place" in t["baddr"].final.reason
        assert t["never"].final.state == pb.TRIAL_STATE_USER_CANCELED
        assert t["fine1"].final.state == pb.TRIAL_STATE_SUCCEEDED

    run(scenario())


def test_trials_survive_manager_restart_and_records_are_replayed(tmp_path, short_dir):
    """The manager goes away while a trial runs; the trial ends while it is away; a new
    manager (a new Hub, its agents and their progress read from the store) comes back on the
    same port: everything the trial reported arrives once, in order."""
    script = _paced_script(tmp_path, 30)
    work = tmp_path / "w"

    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            await hub.connect_agent(work)
            hub.start_trial("agent-1", "outag", f"{PY} {script}")
            await hub.wait_for(lambda: len(hub.trials["outag"].metrics) >= 3, what="3 metrics")
            pid = hub.trials["outag"].statuses[0].pid
            await hub.stop()  # the manager vanishes while the trial runs
            before = len(hub.trials["outag"].metrics)  # a record may still land during the stop's grace
            await hub.wait_for(lambda: "lost the manager" in hub.agent_log(work), 30, "the agent to notice")
            await hub.wait_for(lambda: _gone(pid), 30, "the trial to end while the manager is away")
            assert len(hub.trials["outag"].metrics) == before and hub.trials["outag"].final is None
            await hub.restart(same_port=True)
            await hub.wait_for(lambda: hub.trials["outag"].final is not None, timeout=60, what="the replay")
            hellos = [(a, h.boot_id, restarted) for a, h, restarted in hub.handler.hellos]
        assert len(hellos) == 2 and hellos[0][1] == hellos[1][1] and not hellos[1][2]  # the same agent process
        _assert_exactly_once_in_order(hub.trials["outag"], 30)
        assert hub.trials["outag"].final.state == pb.TRIAL_STATE_SUCCEEDED
        _assert_hub_kept_its_promise(hub)

    run(scenario())


def test_orphan_timeout_stops_trials_and_exits(tmp_path, short_dir):
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            agent = await hub.connect_agent(tmp_path / "w", args=("--orphan-timeout", "2"))
            hub.start_trial("agent-1", "orph1", "sh -c 'while true; do sleep 0.1; done'")
            await hub.wait_for(lambda: bool(hub.trials["orph1"].statuses))
            marker = f"{hub.handler.hellos[0][1].boot_id}/orph1"  # the agent marks its trials' processes
            await hub.wait_for(lambda: marked_processes(marker), 10, "the trial's processes")
            await hub.stop()
            code = await asyncio.to_thread(agent.wait, 60)
        assert code == 3, hub.agent_log(tmp_path / "w")
        assert "orphan timeout" in hub.agent_log(tmp_path / "w")
        assert marked_processes(marker) == [], "a trial kept running after its agent gave up"

    run(scenario())


def test_agent_stopped_by_a_signal_reports_its_trials_as_system_canceled(tmp_path, short_dir):
    """SIGTERM comes from the system (a pod evicted or deleted, a machine going down), never
    from the user: the trials end SYS_CANCELED, saying so, and are reported before it exits."""
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            agent = await hub.connect_agent(tmp_path / "w")
            hub.start_trial("agent-1", "long2", "sleep 600")
            await hub.wait_for(lambda: bool(hub.trials["long2"].statuses))
            agent.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(agent.wait, 30) == 0
        final = hub.trials["long2"].final
        assert final.state == pb.TRIAL_STATE_SYS_CANCELED and "SIGTERM" in final.reason
        assert final.end_cause == pb.END_CAUSE_AGENT_SIGNALLED  # the manager acts on this, not on the words

    run(scenario())


def test_shutdown_command_cancels_trials_and_reports_them(tmp_path, short_dir):
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            agent = await hub.connect_agent(tmp_path / "w")
            hub.start_trial("agent-1", "long1", "sleep 600")
            await hub.wait_for(lambda: bool(hub.trials["long1"].statuses))
            pid = hub.trials["long1"].statuses[0].pid
            hub.send("agent-1", shutdown=pb.Shutdown(reason="experiment over"))
            assert await asyncio.to_thread(agent.wait, 30) == 0
        final = hub.trials["long1"].final
        assert final.state == pb.TRIAL_STATE_USER_CANCELED and "experiment over" in final.reason
        assert _gone(pid)

    run(scenario())


def test_gpu_reports_reach_the_manager_in_hello_and_telemetry(tmp_path, short_dir):
    async def scenario() -> None:
        async with ProdHub(short_dir / "exp") as hub:
            await hub.connect_agent(tmp_path / "w", extra_env={"NNI_AGENT_ARTIFICIAL_GPUS": "3"})
            await hub.wait_for(lambda: any(isinstance(r, pb.GpuReport) for _, r in hub.handler.telemetry_reports),
                               30, "a GPU report")
        (agent_id, hello, restarted) = hub.handler.hellos[0]
        assert agent_id == "agent-1" and not restarted
        gpus = hello.gpus
        assert gpus.provider == "artificial" and [g.index for g in gpus.gpus] == [0, 1, 2]
        assert hello.host.cpu_count >= 1 and hello.agent_version
        report = next(r for _, r in hub.handler.telemetry_reports if isinstance(r, pb.GpuReport))
        assert report.provider == "artificial" and [g.index for g in report.gpus] == [0, 1, 2]

    run(scenario())


def test_manager_file_moves_the_endpoint_without_restarting_trials(tmp_path, short_dir):
    """A backend that must move the tunnel (the old port is stuck) only rewrites the file; the
    hub stays where it is. Tunnels are relays here."""
    script = _paced_script(tmp_path, 40)
    where = tmp_path / "manager-address"
    work = tmp_path / "w"

    async def scenario() -> None:
        first, second = ChaosRelay(1), ChaosRelay(2)
        async with ProdHub(short_dir / "exp") as hub:
            first.target = second.target = hub.address
            await first.start()
            where.write_text(f"127.0.0.1:{first.port}\n")
            await hub.connect_agent(work, manager_file=where)
            hub.start_trial("agent-1", "moved", f"{PY} {script}")
            await hub.wait_for(lambda: len(hub.trials["moved"].metrics) >= 3)
            pid = hub.trials["moved"].statuses[0].pid
            await first.stop()  # the old tunnel is gone: its port refuses
            await hub.wait_for(lambda: f"cannot reach the manager at 127.0.0.1:{first.port}" in hub.agent_log(work),
                               30, "the agent to find the old endpoint dead")
            assert hub.trials["moved"].final is None
            await second.start()
            where.write_text(f"127.0.0.1:{second.port}\n")
            await hub.wait_for(lambda: hub.trials["moved"].final is not None, timeout=60)
        await second.stop()  # after the agent exited (it would wait up to 10 s for an Ack cut off here)
        assert second.port != first.port and hub.handler.sessions("agent-1") >= 2
        assert first.counts["connections"] >= 1 and second.counts["connections"] >= 1
        assert hub.trials["moved"].statuses[0].pid == pid  # the same trial process carried on
        assert all(not restarted for _, _, restarted in hub.handler.hellos)
        _assert_exactly_once_in_order(hub.trials["moved"], 40)
        _assert_hub_kept_its_promise(hub)

    run(scenario())
