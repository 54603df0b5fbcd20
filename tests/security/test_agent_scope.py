"""An agent acts only on its own trials, and no path an agent reports is read on the manager.

A second agent ("evil", its own valid token, the real protocol over real gRPC) sends records
for the trial the real local agent runs: status SUCCEEDED with `working_directory: /etc`, a
FINAL metric of 999, a line of stdout, a parameter request, resource use. The manager refuses
them all, says so naming agent and trial, and the trial ends as its own agent says. Then the
WebUI (real server, real HTTP client) serves no manager file outside the experiment: not for
a trial whose own (remote) agent reports `/etc`, nor through a symlink a local trial planted.
"""
from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.types import TrialJobStatus
from tests.support.kube.fixtures import kube_crd_ns, kube_crd_shared  # noqa: F401 - the Kubernetes emulator fixtures
from tests.support.manager.helpers import until
from tests.support.security.agentkit import (
    PASSWD_MARK,
    fleet,
    get,
    metric_json,
    passwd_readable,
    stored_webui,
)
from tests.support.bounded import run_bounded

pytestmark = pytest.mark.skipif(not passwd_readable(), reason="needs a readable /etc/passwd to prove nothing leaks")


def _refusals(caplog: pytest.LogCaptureFixture, agent: str, trial_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and f"agent {agent} " in r.getMessage() and trial_id in r.getMessage()]


def test_records_for_another_agents_trial_are_refused(short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)

    async def body() -> Path:
        async with fleet(short_dir) as f:
            victim = f.victim.id
            heard: list[tuple[str, str]] = []
            asked: list[tuple[str, int]] = []
            f.ts.add_trial_job_metric_listener(lambda m: heard.append((m.id, m.data)))
            f.ts.add_parameter_request_listener(lambda trial_id, index: asked.append((trial_id, index)))
            before = f.detail(victim)
            wd, stdout = before.working_directory, f.experiment_dir / "trials" / victim / "trial.stdout"
            await until(lambda: stdout.exists() and b"honest output" in stdout.read_bytes(), 30, "honest output")

            await f.evil.resources(pb.TrialResources(trial_id=victim, cpu_percent=999.0, rss_bytes=1))
            await f.evil.send(
                {"status": pb.TrialStatus(trial_id=victim, state=pb.TRIAL_STATE_SUCCEEDED, working_directory="/etc",
                                          end_time_ms=1, reason="evil says so")},
                {"metric": pb.Metric(trial_id=victim, trial_seq=1, data=metric_json(victim, "FINAL", 0, 999))},
                {"log": pb.LogChunk(trial_id=victim, stream=pb.LOG_STREAM_STDOUT, offset=0, data=b"PWNED by evil\n")},
                {"parameter_request": pb.ParameterRequest(trial_id=victim, parameter_index=1)},
            )
            await asyncio.sleep(0.2)  # listeners run on the loop: give a wrongly accepted record its chance

            after = f.detail(victim)
            assert after.status == TrialJobStatus.RUNNING, (after.status, after.message)
            assert after.working_directory == wd != "/etc"
            assert not [d for _, d in heard if "999" in d], heard
            assert not [m for m in f.ts.trials.store.metrics(victim) if m["type"] == "FINAL"]
            assert b"PWNED" not in stdout.read_bytes()
            assert asked == []
            used = f.ts.trial_resources(victim)
            assert used is None or used.cpu_percent != 999.0
            assert _refusals(caplog, "evil", victim), "no warning naming the agent and the trial"

            f.release.write_text("1")  # the victim's own agent still decides its end
            await until(lambda: f.detail(victim).status.is_terminal, 60, "the victim to end")
            assert f.detail(victim).status == TrialJobStatus.SUCCEEDED, f.detail(victim).message
            await until(lambda: any(json.loads(d).get("type") == "FINAL" for _, d in heard), 30, "its final")
            assert [json.loads(json.loads(d)["value"]) for _, d in heard if json.loads(d)["type"] == "FINAL"] == [1]
            return f.experiment_dir

    experiment_dir = asyncio.run(body())

    async def view() -> None:
        async with stored_webui(experiment_dir) as api:
            trials = json.loads((await get(f"{api}/trial-jobs"))[1])
            victim = trials[0]["trialJobId"]
            assert trials[0]["status"] == "SUCCEEDED"
            status, text = await get(f"{api}/trial-file/{victim}/passwd")
            assert PASSWD_MARK not in text, "the manager's /etc/passwd was served"
            status, text = await get(f"{api}/trial-file/{victim}/stdout")
            assert status == 200 and b"honest output" in text and b"PWNED" not in text, (status, text[:200])

    asyncio.run(view())


def test_a_path_an_agent_reports_for_its_own_trial_is_not_read(short_dir: Path) -> None:
    """Its own trial: every record is taken, but the directory it names (outside the experiment,
    on the manager's host) is never read: not by the WebUI, not by `nni-manager logs`."""
    outside = short_dir / "outside"
    outside.mkdir()
    (outside / "passwd").write_bytes(PASSWD_MARK + b"x:0:0 outside secret\n")
    (outside / "trial.log").write_bytes(b"outside secret log\n")

    async def body() -> tuple[Path, str]:
        async with fleet(short_dir) as f:
            own = await f.submit()  # the local agent is busy: placed on evil, the least loaded
            start = await f.evil.started()
            assert start.trial_id == own.id
            await f.evil.send(
                {"status": pb.TrialStatus(trial_id=own.id, state=pb.TRIAL_STATE_RUNNING,
                                          working_directory=str(outside), start_time_ms=1)},
                {"log": pb.LogChunk(trial_id=own.id, stream=pb.LOG_STREAM_STDOUT, offset=0, data=b"evil's own line\n")},
                {"metric": pb.Metric(trial_id=own.id, trial_seq=1, data=metric_json(own.id, "FINAL", 0, 5))},
                {"status": pb.TrialStatus(trial_id=own.id, state=pb.TRIAL_STATE_SUCCEEDED,
                                          working_directory=str(outside), end_time_ms=2)},
            )
            # its own trial: every record is taken (an honest agent's behaviour is unchanged)
            d = f.detail(own.id)
            assert d.status == TrialJobStatus.SUCCEEDED and d.working_directory == str(outside)
            assert [m["type"] for m in f.ts.trials.store.metrics(own.id)] == ["FINAL"]
            copy = f.experiment_dir / "trials" / own.id / "trial.stdout"
            assert copy.read_bytes() == b"evil's own line\n"
            return f.experiment_dir, own.id

    experiment_dir, own = asyncio.run(body())

    async def view() -> None:
        async with stored_webui(experiment_dir) as api:
            status, text = await get(f"{api}/trial-file/{own}/passwd")
            assert b"outside secret" not in text and status != 200, (status, text[:200])
            status, text = await get(f"{api}/trial-file/{own}/trial.log")  # no trial.log of its own: stdout
            assert (status, text) == (200, b"evil's own line\n")

    asyncio.run(view())
    logs = subprocess.run([sys.executable, "-m", "nni_manager", "logs", str(experiment_dir), own, "--trial-log"],
                          capture_output=True, timeout=120)
    assert logs.returncode == 0 and b"outside secret" not in logs.stdout, (logs.stdout, logs.stderr)
    logs = subprocess.run([sys.executable, "-m", "nni_manager", "logs", str(experiment_dir), own],
                          capture_output=True, timeout=120)
    assert logs.returncode == 0 and logs.stdout == b"evil's own line\n", (logs.stdout, logs.stderr)


def test_a_symlink_in_a_local_trials_directory_leads_nowhere(short_dir: Path) -> None:
    async def body() -> tuple[Path, str]:
        async with fleet(short_dir, symlink=True) as f:
            wd = Path(f.victim.working_directory)
            assert (wd / "leak").is_symlink()
            f.release.write_text("1")
            await until(lambda: f.detail(f.victim.id).status.is_terminal, 60, "the victim to end")
            return f.experiment_dir, f.victim.id

    experiment_dir, victim = asyncio.run(body())

    async def view() -> None:
        async with stored_webui(experiment_dir) as api:
            status, text = await get(f"{api}/trial-file/{victim}/leak")
            assert PASSWD_MARK not in text and status != 200, (status, text[:200])
            status, text = await get(f"{api}/trial-file/{victim}/stdout")
            assert status == 200 and b"honest output" in text, (status, text[:200])

    asyncio.run(view())


def test_every_member_of_an_environment_reports_for_its_trial_and_no_other_agent(
        kube_crd_ns: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811 (the imported fixture)
    """Cluster platforms place a trial on a whole environment: each member's records are its
    own (a TFJob's two workers here); an agent outside the environment is refused."""
    from nni_manager.service import create_training_service
    from tests.support.kube.operators import experiment, replica_views, role
    from tests.support.manager.helpers import form, wait_status
    from tests.support.security.agentkit import RawAgent

    caplog.set_level(logging.WARNING)
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "kubeflow", operator="tf-operator", apiVersion="v1", reuseMode=False,
                     worker=role(2))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            heard: list[str] = []
            ts.add_trial_job_metric_listener(lambda m: heard.append(json.loads(json.loads(m.data)["value"])["replica"]))
            job = await ts.submit_trial_job(form(0, forever=["worker"]))
            await wait_status(ts, job.id, "RUNNING", timeout=60)
            await until(lambda: sorted(heard) == ["worker-0", "worker-1"], 60, "a metric of each member")
            await replica_views(ts, job.id, ["worker-0", "worker-1"])  # each member's log, apart
            assert len(ts.trials.get(job.id).agents) == 2
            spec = ts.core.add_agent("outsider")
            async with RawAgent(f"unix:{spec.hub_unix_socket}", spec.agent_id, spec.token) as outsider:
                await outsider.send(
                    {"status": pb.TrialStatus(trial_id=job.id, state=pb.TRIAL_STATE_FAILED, reason="outsider")},
                    {"metric": pb.Metric(trial_id=job.id, trial_seq=1,
                                         data=metric_json(job.id, "FINAL", 0, {"replica": "outsider"}))})
            await asyncio.sleep(0.2)
            assert ts.trials.get(job.id).status == TrialJobStatus.RUNNING
            assert sorted(heard) == ["worker-0", "worker-1"]
            assert _refusals(caplog, "outsider", job.id)
            await ts.cancel_trial_job(job.id)
            done = await wait_status(ts, job.id, "USER_CANCELED", "SYS_CANCELED", timeout=60)
            assert done.status == TrialJobStatus.USER_CANCELED, done.message

    run_bounded(body(), 150)
