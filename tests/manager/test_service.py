"""TrainingService end to end: real agent subprocess, real trial processes, real gRPC."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from nni_manager.config import ExperimentConfig
from nni_manager.service import TrainingService, create_training_service
from nni_manager.store import Store
from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobMetric, TrialJobStatus
from tests.support.manager.helpers import form, kill_tree, param_record, until, wait_status
from tests.support.bounded import run_bounded

TERMINAL = ("SUCCEEDED", "FAILED", "USER_CANCELED", "EARLY_STOPPED", "SYS_CANCELED")


def run(coro: Any) -> Any:
    return run_bounded(coro, 90)


def values(metrics: list[TrialJobMetric], trial_id: str) -> list[tuple[str, int, str]]:
    out = []
    for m in metrics:
        if m.id == trial_id:
            d = json.loads(m.data)
            out.append((d["type"], d["sequence"], d["value"]))
    return out


def test_succeeded_metrics_logs_and_listeners(make_config: Callable[..., ExperimentConfig]) -> None:
    async def body() -> None:
        got: list[TrialJobMetric] = []
        got_async: list[TrialJobMetric] = []
        statuses: list[tuple[str, str]] = []

        async def async_listener(m: TrialJobMetric) -> None:
            got_async.append(m)

        async with create_training_service(make_config()) as ts:
            assert len(ts.experiment_id) == 8 and ts.experiment_id[0].isalpha()
            assert ts.experiment_dir == make_config().experiment_working_directory / ts.experiment_id
            assert ts.is_multi_phase_job_supported
            ts.add_trial_job_metric_listener(got.append)
            ts.add_trial_job_metric_listener(async_listener)
            ts.add_trial_job_status_listener(lambda d: statuses.append((d.id, d.status.value)))
            job = await ts.submit_trial_job(form(0, x=5))
            assert len(job.id) == 5 and job.id[0].isalpha() and job.status == TrialJobStatus.WAITING
            assert job.message  # says what it waits for
            done = await wait_status(ts, job.id, "SUCCEEDED")
            assert done.start_time and done.end_time and done.end_time >= done.start_time
            assert done.working_directory and done.agent_id == "local" and done.message == ""
            assert (Path(done.working_directory) / "cuda.txt").read_text() == "<unset>"  # no scheduling
            assert values(got, job.id) == [("PERIODICAL", 0, "0"), ("PERIODICAL", 1, "1"), ("PERIODICAL", 2, "2"),
                                           ("FINAL", 0, "5")]
            await until(lambda: len(got_async) == 4, what="async listener")
            assert (job.id, "RUNNING") in statuses and statuses[-1] == (job.id, "SUCCEEDED")

            ts.remove_trial_job_metric_listener(got.append)
            second = await ts.submit_trial_job(form(1, x=6))
            await wait_status(ts, second.id, "SUCCEEDED")
            await until(lambda: len(got_async) == 8, what="async listener, second trial")
            assert values(got, second.id) == []  # removed

            logs = ts.experiment_dir / "trials" / job.id
            assert f"trial {job.id} params" in (logs / "trial.stdout").read_text()
            assert (logs / "trial.stderr").read_text() == "to stderr\n"
            assert [t.id for t in await ts.list_trial_jobs()] == [job.id, second.id]
            [info] = ts.agents()
            assert info["name"] == "local" and info["connected"] and info["host"].pid > 0
            exp_dir = ts.experiment_dir
        ro = Store.open_readonly(exp_dir)
        assert ro.experiment()["status"] == "STOPPED"
        assert len(ro.metrics(job.id)) == 4 and len(ro.metrics()) == 8
        assert [t.status for t in ro.trials()] == [TrialJobStatus.SUCCEEDED] * 2
        assert [e[0] for e in ro.events(job.id)] == ["WAITING", "RUNNING", "SUCCEEDED"]

    run(body())


def test_failed_canceled_early_stopped_and_max_duration(make_config: Callable[..., ExperimentConfig],
                                                        short_dir: Path) -> None:
    async def body() -> None:
        release = str(short_dir / "never")
        async with create_training_service(make_config(max_trial_duration=1.0)) as ts:
            failed = await ts.submit_trial_job(form(0, action="fail"))
            user = await ts.submit_trial_job(form(1, action="sleep", release=release))
            early = await ts.submit_trial_job(form(2, action="sleep", release=release))
            timed = await ts.submit_trial_job(form(3, action="sleep", release=release))
            d = await wait_status(ts, failed.id, "FAILED")
            assert d.message.startswith("exit code 3")
            await wait_status(ts, user.id, "RUNNING")
            await wait_status(ts, early.id, "RUNNING")
            await ts.cancel_trial_job(user.id)
            await ts.cancel_trial_job(early.id, is_early_stopped=True)
            assert (await wait_status(ts, user.id, "USER_CANCELED")).is_early_stopped is False
            assert (await wait_status(ts, early.id, "EARLY_STOPPED")).is_early_stopped is True
            d = await wait_status(ts, timed.id, "EARLY_STOPPED")
            assert d.is_early_stopped and d.message
            await ts.cancel_trial_job(failed.id)  # terminal: a no-op
            assert (await ts.get_trial_job(failed.id)).status == TrialJobStatus.FAILED
            with pytest.raises(KeyError, match="no trial 'zzzzz'"):
                await ts.get_trial_job("zzzzz")

    run(body())


def test_multi_phase(make_config: Callable[..., ExperimentConfig]) -> None:
    async def body() -> None:
        async with create_training_service(make_config()) as ts:
            asks: list[tuple[str, int]] = []
            metrics: list[TrialJobMetric] = []
            ts.add_trial_job_metric_listener(metrics.append)

            def on_request(trial_id: str, index: int) -> None:
                asks.append((trial_id, index))
                hp = HyperParameters(param_record(index, y=42), index)
                asyncio.ensure_future(ts.update_trial_job(trial_id, TrialJobApplicationForm(-1, hp)))

            ts.add_parameter_request_listener(on_request)
            job = await ts.submit_trial_job(form(0, action="phases"))
            await wait_status(ts, job.id, "SUCCEEDED")
            assert asks == [(job.id, 1)]
            assert values(metrics, job.id)[-1] == ("FINAL", 0, "42")

    run(body())


def test_cancel_waiting_trial_and_cluster_metadata(make_config: Callable[..., ExperimentConfig],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNI_AGENT_ARTIFICIAL_GPUS", "1")

    async def body() -> None:
        cfg = make_config(trial_gpu_number=1, platform_fields={"use_active_gpu": False})
        async with create_training_service(cfg) as ts:
            await ts.set_cluster_metadata("k", "v")
            assert await ts.get_cluster_metadata("k") == "v"
            first = await ts.submit_trial_job(form(0, action="sleep", release="/nonexistent"))
            second = await ts.submit_trial_job(form(1))
            await wait_status(ts, first.id, "RUNNING")
            d = await ts.get_trial_job(second.id)
            assert d.status == TrialJobStatus.WAITING
            assert d.message == f"waiting for a GPU: the only GPU of local is taken by trials {first.id}"
            await ts.cancel_trial_job(second.id)
            assert (await ts.get_trial_job(second.id)).status == TrialJobStatus.USER_CANCELED

    run(body())


def test_sys_canceled_after_reconnect_window(make_config: Callable[..., ExperimentConfig], short_dir: Path) -> None:
    async def body() -> None:
        ts = create_training_service(make_config(platform_fields={"reconnect_window": 1.0}))
        async with ts:
            job = await ts.submit_trial_job(form(0, action="sleep", release=str(short_dir / "never")))
            await wait_status(ts, job.id, "RUNNING")
            agent_pid = int((ts.experiment_dir / "agents" / "local" / "agent.pid").read_text())
            trial_pid = ts.trial_pid(job.id)
            os.kill(agent_pid, signal.SIGKILL)
            lost = await until(lambda: _message_if(ts, job.id, "contact with agent local lost at"), what="lost")
            assert lost.endswith("waiting up to 1 s for it to reconnect")
            assert (await ts.get_trial_job(job.id)).status == TrialJobStatus.RUNNING
            d = await wait_status(ts, job.id, "SYS_CANCELED")
            assert d.message == "agent local did not reconnect within 1 s"
        kill_tree(trial_pid)

    run(body())


def _message_if(ts: TrainingService, trial_id: str, prefix: str) -> str | None:
    msg = ts.trials.by_id[trial_id].message
    return msg if msg.startswith(prefix) else None


def test_from_yaml_config_and_secrets_not_stored(short_dir: Path, code_dir: Path) -> None:
    yml = short_dir / "config.yml"
    yml.write_text(
        f"trialCommand: {os.sys.executable} trial.py\n"
        f"trialCodeDirectory: {code_dir}\n"
        "trialConcurrency: 1\n"
        f"experimentWorkingDirectory: {short_dir / 'exps'}\n"
        "trainingService:\n  platform: local\n"
    )

    async def body() -> Path:
        async with create_training_service(yml) as ts:
            job = await ts.submit_trial_job(form(0, x=2))
            await wait_status(ts, job.id, "SUCCEEDED")
            return ts.experiment_dir

    exp_dir = run(body())
    stored = Store.open_readonly(exp_dir).experiment()["config"]
    assert stored["trial_code_directory"] == str(code_dir)
    from nni_manager.service.nni_api import _redacted

    assert _redacted({"machine_list": [{"password": "pw", "host": "h"}], "extra": {"token": "t"}}) == {
        "machine_list": [{"password": "***", "host": "h"}], "extra": {"token": "***"}}


def test_real_agent_with_wrong_token_is_refused(make_config: Callable[..., ExperimentConfig], short_dir: Path) -> None:
    async def body() -> tuple[int, str]:
        async with create_training_service(make_config()) as ts:
            await until(lambda: ts.agent_connected("local"), what="the real agent")
            env = dict(os.environ, NNI_AGENT_TOKEN="not-the-token-42")
            proc = await asyncio.to_thread(  # the hub must keep serving meanwhile
                subprocess.run,
                [sys.executable, "-m", "nni_agent", "--manager", f"unix:{ts.experiment_dir / 'hub.sock'}",
                 "--agent-id", "local", "--work-dir", str(short_dir / "intruder")],
                env=env, capture_output=True, text=True, timeout=30,
            )
            assert ts.agent_connected("local")  # the real agent is undisturbed
            return proc.returncode, proc.stderr

    code, err = run(body())
    assert code == 2
    assert "agent local: invalid token" in err and "not-the-token-42" not in err


def test_bad_code_directory_fails_start_cleanly(make_config: Callable[..., ExperimentConfig], short_dir: Path) -> None:
    cfg = make_config()
    cfg.training_service.platform = "remote"  # bundles the code first; remote backend never reached
    cfg.trial_code_directory = short_dir / "missing"

    async def body() -> None:
        ts = TrainingService(cfg)
        with pytest.raises(ValueError, match="is not a directory"):
            await ts.start()
        assert not (ts.experiment_dir / "hub.sock").exists()

    run(body())


def test_restarted_agent_that_lost_a_trial(make_config: Callable[..., ExperimentConfig], short_dir: Path) -> None:
    async def body() -> subprocess.Popen[bytes]:
        async with create_training_service(make_config(platform_fields={"reconnect_window": 30})) as ts:
            job = await ts.submit_trial_job(form(0, action="sleep", release=str(short_dir / "never")))
            await wait_status(ts, job.id, "RUNNING")
            work = ts.experiment_dir / "agents" / "local"
            os.kill(int((work / "agent.pid").read_text()), signal.SIGKILL)
            trial_pid = ts.trial_pid(job.id)
            token = ts.trials.store.agent_by_name("local")["token"]
            again = subprocess.Popen(
                [sys.executable, "-m", "nni_agent", "--manager", f"unix:{ts.experiment_dir / 'hub.sock'}",
                 "--agent-id", "local", "--work-dir", str(work)],
                env=dict(os.environ, NNI_AGENT_TOKEN=token), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            d = await wait_status(ts, job.id, "SYS_CANCELED")
            assert d.message == "agent local restarted and lost the trial"
            kill_tree(trial_pid)
            later = await ts.submit_trial_job(form(1))  # the new agent takes new trials
            await wait_status(ts, later.id, "SUCCEEDED")
        return again

    again = run(body())
    assert again.wait(timeout=20) == 0  # the manager's Shutdown stopped it


def test_trials_fail_at_once_with_every_reason_when_no_machine_is_usable(make_config: Callable[..., ExperimentConfig]) -> None:
    import socket

    from nni_manager.backends.remote.config import MachineConfig, RemoteConfig
    from nni_manager.config import TrainingServiceConfig

    closed = []
    for _ in range(2):  # two loopback ports nothing listens on
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed.append(s.getsockname()[1])
    machines = [MachineConfig(host="127.0.0.1", port=p, user="nobody", password="pw") for p in closed]
    config = make_config()
    config.training_service = TrainingServiceConfig(platform="remote", options=RemoteConfig(machines))

    async def body() -> None:
        async with create_training_service(config) as ts:
            await until(lambda: all(a["failed"] for a in ts.agents()), what="both machines failed")
            job = await ts.submit_trial_job(form(0))
            detail = await ts.get_trial_job(job.id)
            assert detail.status == TrialJobStatus.FAILED
            assert detail.message.startswith("no machine is usable")
            for port in closed:
                assert f"127.0.0.1:{port}" in detail.message and "cannot connect" in detail.message

    run(body())


def test_local_experiment_listens_on_no_tcp_port(make_config: Callable[..., ExperimentConfig]) -> None:
    import psutil

    async def body() -> None:
        before = {c.laddr for c in psutil.Process().net_connections(kind="tcp") if c.status == "LISTEN"}
        async with create_training_service(make_config()) as ts:
            job = await ts.submit_trial_job(form(0))
            await wait_status(ts, job.id, "SUCCEEDED")
            listening = {c.laddr for c in psutil.Process().net_connections(kind="tcp") if c.status == "LISTEN"}
            assert listening == before  # the agent came in over hub.sock only
            assert (ts.experiment_dir / "hub.sock").exists()

    run(body())
