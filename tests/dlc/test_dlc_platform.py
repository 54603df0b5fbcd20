"""`platform: dlc` end to end on the PAI-DLC emulator: NNI's config fields, the official SDK signing
every call with the AccessKey, real agents in the jobs' pods dialling the manager's TLS hub with
single-use credentials, a pool of jobs, several pods per job, config mistakes, and no secret in a
job or a log. (A wrong key refused in one line, a failed or cancelled trial, a job stopped outside,
a manager restart, an agent that never dials, the gateway's faults, every job platform alike:
tests/platforms.)"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.manager.helpers import TRIAL, form, wait_status
from tests.support.bounded import run_bounded


@pytest.fixture
def dlc(dlc_in_shared: Any) -> Any:
    """This module's tests share one emulator: each finds its jobs by its experiment (`ours`)."""
    return dlc_in_shared

T = 90.0


def config(dlc: Any, base: Path, manager_ip: str | None = "127.0.0.1", **ts: Any) -> Any:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return load_config({"trialCommand": "python3 trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 2,
                        "experimentWorkingDirectory": str(base / "exps"), "trialGracePeriod": 2,
                        **({"nniManagerIp": manager_ip} if manager_ip else {}),
                        "trainingService": dlc.training_service(**ts)})


def ours(dlc: Any, experiment_id: str) -> list[dict[str, Any]]:
    return [j for j in dlc.jobs() if j["DisplayName"].startswith(f"nni_exp_{experiment_id}_")]


def test_pool_of_dlc_jobs_runs_trials_and_keeps_the_access_key_secret(dlc: Any, short_dir: Path) -> None:
    cfg = config(dlc, short_dir)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(4)]
            details = [await wait_status(ts, t.id, "SUCCEEDED", timeout=T) for t in trials]
            assert {d.environment_id for d in details} <= {"env1", "env2"}
            assert all(d.url.startswith("https://pai-dlc.console.aliyun.com/#/jobs/detail?jobId=dlc") for d in details)
            assert len(ours(dlc, ts.experiment_id)) <= 2
            return ts.experiment_id

    exp = run_bounded(main(), 240)
    jobs = ours(dlc, exp)
    assert jobs and all(j["JobType"] == "PyTorchJob" and j["DataSources"] == [
        {"DataSourceId": "data-nas-1", "DataSourceType": "nas"}, {"DataSourceId": "data-oss-1", "DataSourceType": "oss"}]
        for j in jobs)
    dlc.wait_for(lambda: all(j["Status"] in ("Stopped", "Succeeded") for j in ours(dlc, exp)), 60,
                 what="every job of the experiment ended")
    dlc.wait_for(lambda: not dlc.live_pids(), 60, what="no pod process left")
    secret = dlc.access_key_secret
    assert not any(secret in (j["UserCommand"] or "") for j in jobs)
    stored = b"".join(p.read_bytes() for p in (short_dir / "exps").rglob("*") if p.is_file())
    assert stored and secret.encode() not in stored  # the experiment's store, logs and files
    assert {r["action"] for r in dlc.requests()} >= {"ListJobs", "CreateJob", "StopJob"}


def test_a_trial_runs_on_every_pod_of_a_job(dlc: Any, short_dir: Path) -> None:
    # and, as NNI's config_dlc.yml, without nniManagerIp: agents dial where this machine reaches DLC from
    cfg = config(dlc, short_dir, manager_ip=None, podCount=2)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0, x=1, steps=1))
            d = await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            assert sorted(d.agents) == sorted([f"{d.environment_id}-0", f"{d.environment_id}-1"]), d

    run_bounded(main(), 240)


@pytest.mark.parametrize("field,value,words", [
    ("jobType", "MXJob", "one of TFJob, PyTorchJob"),
    ("podCount", 0, "must be >= 1"),
    ("containerStorageMountPoint", "data", "full path"),
    ("ecsSpec", "{'cpu': 2}", "resource_id"),
])
def test_config_mistakes_name_the_field(dlc: Any, short_dir: Path, field: str, value: Any, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(dlc, short_dir, **{field: value})
    assert info.value.field == f"trainingService.{field}" and words in str(info.value), str(info.value)


def test_the_resource_group_form_of_ecs_spec(dlc: Any, short_dir: Path) -> None:
    cfg = config(dlc, short_dir, ecsSpec="{'resource_id':'rg19d2oleg252kke','cpu':2,'memory':8,'gpu':0}")
    from nni_manager.service.hybrid import make_backend
    request = make_backend(cfg).render().text
    assert '"ResourceId": "rg19d2oleg252kke"' in request and '"Memory": "8Gi"' in request
    assert dlc.access_key_secret not in request and "single-use credential" in request
