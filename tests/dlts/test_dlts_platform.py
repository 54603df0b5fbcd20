"""`platform: dlts` end to end on the DLTS dashboard emulator (tests/support/dlts/fixtures.py): NNI's v1
config unchanged, the backend's real HTTP client with md5 query-string auth, real agents in the
jobs' processes dialling the manager's TLS hub with single-use enrolment credentials. Every
status path of DLTS' own, config errors, a reused credential, cleanup. (A manager restart, an agent
that never dials in, a failed or cancelled trial, a wrong password and the dashboard's faults, every
job platform alike: tests/platforms.)"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.registry import backend_class
from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.manager.helpers import TRIAL, form, message_with, sleeper, wait_status
from tests.support.bounded import run_bounded

T = 90.0


def run(coro: Any) -> Any:
    return run_bounded(coro, 240)


@pytest.fixture
def dlts(dlts_in_shared: Any) -> Any:
    """This module's tests share one emulator: each finds its jobs by its experiment (`job_of`)."""
    return dlts_in_shared


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


def v1_config(dlts: Any, base: Path, **dlts_config: Any) -> dict[str, Any]:
    """NNI's v1 DLTS config (nnictl YAML), pointed at the emulator; `pollInterval` is ours."""
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return {"authorName": "nni", "experimentName": "dlts", "trialConcurrency": 2, "maxExecDuration": "1h",
            "trainingServicePlatform": "dlts", "nniManagerIp": "127.0.0.1", "logDir": str(base / "exps"),
            "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "tuner": {"builtinTunerName": "Random"},
            "trial": {"command": f"{sys.executable} trial.py", "codeDir": str(code), "gpuNum": 0,
                      "image": "msranni/nni"},
            "dltsConfig": {**dlts.dlts_config(), "pollInterval": "0.3s", **dlts_config}}


def job_of(dlts: Any, experiment_id: str, trial_id: str) -> dict[str, Any]:
    return next(j for j in dlts.jobs() if j["jobName"] == f"nni_exp_{experiment_id}_trial_{trial_id}")


def test_status_paths_of_nni_v1_config(dlts, base: Path, caplog) -> None:
    """finished (metrics once), paused by an administrator (stopped: a paused trial cannot resume);
    the password never shows. (Failed, killed by us, killed by someone else, every job platform
    alike: tests/platforms/test_job_{failure,cancel,contract}.py.)"""
    caplog.set_level(logging.INFO)
    cfg = load_config(v1_config(dlts, base))
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            exp = ts.experiment_id
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            ok = await ts.submit_trial_job(form(0, x=5, steps=2))
            d = await wait_status(ts, ok.id, "SUCCEEDED", timeout=T)
            job = job_of(dlts, exp, ok.id)
            # the 2020 dashboard's job page route, /jobs/{clusterId}/{jobId} (NNI linked /job/{team}/{cluster}/{id})
            assert d.url == f"{dlts.url}jobs/{dlts.cluster}/{job['jobId']}", d.url
            assert [json.loads(m)["type"] for m in metrics[ok.id]] == ["PERIODICAL", "PERIODICAL", "FINAL"]
            # the job's state follows the trial (off the loop: the manager keeps serving its agents)
            await asyncio.to_thread(dlts.wait_status, job["jobId"], "finished", timeout=T)

            paused = await ts.submit_trial_job(sleeper(base, 4, "c"))
            await wait_status(ts, paused.id, "RUNNING", timeout=T)
            dlts.pause(job_of(dlts, exp, paused.id)["jobId"])
            await wait_status(ts, paused.id, "SYS_CANCELED", timeout=T)
            await message_with(ts, paused.id, "paused", "cannot resume")
            return exp

    exp = run(main())
    assert all(len(ms) == len(set(ms)) for ms in metrics.values())
    dlts.wait_for(lambda: not dlts.live_pids(), 60, what="no job process left")
    ended = ("finished", "failed", "killed", "paused")
    dlts.wait_for(lambda: all(j["jobStatus"] in ended for j in dlts.jobs()), 30, what="every job ended")
    jobs = [j for j in dlts.jobs() if j["jobName"].startswith(f"nni_exp_{exp}_trial_")]
    assert len(jobs) == 2 and all(j["jobStatus"] in ("finished", "failed", "killed", "paused") for j in jobs), [
        (j["jobStatus"], j["history"]) for j in jobs]
    sent = dlts.requests()
    assert all("password" not in json.dumps(r) or "***" in json.dumps(r) for r in sent)
    assert dlts.password() not in caplog.text
    first = jobs[0]["jobParams"]  # the job JSON NNI sent (as the RestAPI stored it)
    assert first["gpuType"] == "P40" and first["vcName"] == dlts.team and first["jobtrainingtype"] == "RegularJob"


def test_enrolment_credential_in_the_job_is_single_use(dlts, base: Path, caplog) -> None:
    """Anyone who reads a job's `cmd` in the dashboard sees the agent's credential: once the agent
    has enrolled it is spent, and running the same command again gets nowhere. Since whoever
    enrolled first may have been the copy, the session is revoked and the trial's environment
    fails, loudly, instead of a thief keeping it."""
    caplog.set_level(logging.WARNING, logger="nni_manager.hub.server")
    cfg = load_config(v1_config(dlts, base))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(sleeper(base, 0, "x"))
            await wait_status(ts, t.id, "RUNNING", timeout=T)
            cmd = job_of(dlts, ts.experiment_id, t.id)["jobParams"]["cmd"]
            copy = await asyncio.to_thread(
                subprocess.run, ["bash", "-c", cmd], capture_output=True, text=True, timeout=60,
                env={k: v for k, v in os.environ.items() if not k.startswith("NNI_")})
            assert copy.returncode == 2, copy.stderr[-2000:]  # refused for good, not retried
            assert "enrolment credential already used" in copy.stderr + copy.stdout
            assert any(r.levelno == logging.ERROR and "presented a second time" in r.getMessage()
                       for r in caplog.records)
            ended = await wait_status(ts, t.id, "SYS_CANCELED", timeout=T)
            assert "enrolment credential was presented a second time" in ended.message

    run(main())


def test_missing_fields_are_one_clear_line_and_fall_back_on_a_jobs_variables(dlts, base: Path, monkeypatch) -> None:
    """(A wrong password, every job platform's credentials alike: tests/platforms/test_job_credentials.py.)"""
    for name, env in (("email", "DLWS_USER_EMAIL"), ("password", "DLTS_JOB_TOKEN"), ("team", "DLWS_VC_NAME")):
        monkeypatch.delenv(env, raising=False)
        data = v1_config(dlts, base)
        del data["dltsConfig"][name]
        with pytest.raises(ConfigError) as cerr:
            load_config(data)
        assert f"`{name}` field in `dltsConfig` is not configured." in str(cerr.value) and env in str(cerr.value)
    # NNI's fallbacks: the variables a DLTS job has
    for k, v in dlts.env().items():
        monkeypatch.setenv(k, v)
    data = v1_config(dlts, base)
    for name in ("email", "password", "team", "cluster"):
        del data["dltsConfig"][name]
    o = load_config(data).training_service.options
    assert (o.email, o.team, o.cluster) == (dlts.email, dlts.team, ".default")


def test_dry_run_prints_nnis_job_json_without_a_usable_secret(tmp_path: Path) -> None:
    cfg = load_config({"trainingServicePlatform": "dlts", "trialConcurrency": 1,
                       "trial": {"command": "python3 t.py", "codeDir": str(tmp_path), "gpuNum": 1, "image": "img"},
                       "dltsConfig": {"dashboard": "http://dash.example", "team": "t", "email": "e@x",
                                      "password": "pw-SECRET"}})
    dry = backend_class("dlts")(cfg).render()
    assert "pw-SECRET" not in dry.text and "http://dash.example/api/clusters/.default/jobs" in dry.text
    job = dry.requests[0]
    assert job["jobName"] == "nni_exp_dryrun_trial_dryrun" and job["resourcegpu"] == 1 and job["image"] == "img"
    assert job["preemptionAllowed"] == "False" and job["env"] == [{"name": "TMPDIR", "value": "$HOME/tmp"}]  # NNI's
    assert "--single-trial" in job["cmd"] and "single-use" in dry.text
    header = dry.text.splitlines()[0]  # says what happens: literals in the command, not masked secrets
    assert "masked" not in header and "literals in the job's command" in header, header
