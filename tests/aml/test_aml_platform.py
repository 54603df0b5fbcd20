"""`platform: aml` end to end on the Azure ML (ARM) emulator (tests/support/aml/fixtures.py): credentials
from azure-identity's DefaultAzureCredential (an Azure CLI login), the backend's real HTTP client
over HTTPS, real agents in the jobs' processes dialling the manager's TLS hub with single-use
credentials. A pool of environments, ARM errors, cleanup, NNI's v1 config and a v2 config built
with NNI's Python API. (A manager restart, an agent that never dials in, a failed or cancelled
trial, a Reader's login and 429 / 5xx bursts, every job platform alike: tests/platforms.)"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.registry import backend_class
from nni_manager.backends.rest_jobs import RestError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.aml.emulator.api_versions import DOCUMENTED
from tests.support.manager.helpers import (form, wait_status)
from tests.support.aml.experiments import base, config_dict, ours, run  # noqa: F401 (base: a fixture)

T = 90.0


def assert_clean(aml: Any, experiment_id: str) -> None:
    aml.wait_for(lambda: all(j["status"] in ("Canceled", "Completed", "Failed") for j in ours(aml, experiment_id)),
                 60, what="every job of the experiment ended")
    aml.wait_for(lambda: not aml.live_pids(), 60, what="no job process left")


def test_pool_runs_ten_trials_on_two_environments_with_studio_urls(aml_in_shared, base: Path) -> None:
    aml = aml_in_shared  # one emulator for the session: its jobs are found by experiment
    cfg = load_config(config_dict(aml, base))
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(10)]
            details = [await wait_status(ts, t.id, "SUCCEEDED", timeout=T) for t in trials]
            assert {d.environment_id for d in details} == {"env1", "env2"}
            exp = ts.experiment_id
            jobs = {j["name"]: j for j in ours(aml, exp)}
            assert sorted(jobs) == [f"nni_exp_{exp}_env_1", f"nni_exp_{exp}_env_2"]
            assert all(j["status"] != "Completed" for j in jobs.values())  # kept, never ended by a trial
            for d in details:  # the job's studio URL, as Azure gives it
                assert d.url and d.url.startswith("https://ml.azure.com/runs/nni_exp_") and "wsid=" in d.url, d.url
            return exp

    exp = run(main())
    assert len(metrics) == 10 and all(len(ms) == len(set(ms)) == 2 for ms in metrics.values())
    assert_clean(aml, exp)
    # clean_up ended the pool: cancelled, or completed when its agents were told to stop first
    assert all(j["status"] in ("Canceled", "Completed") for j in ours(aml, exp)), ours(aml, exp)
    used = aml.api_versions()
    assert used and all(v in DOCUMENTED for vs in used.values() for v in vs), used


def test_unknown_compute_is_one_clear_line(aml_in_shared, base: Path) -> None:
    """(A Reader's login refused, every job platform's credentials alike: tests/platforms/test_job_credentials.py.)"""
    aml = aml_in_shared  # one emulator for the session: its jobs are found by experiment

    async def main(c: Any) -> None:
        async with create_training_service(c):
            pass

    with pytest.raises(RestError) as err:
        run(main(load_config(config_dict(aml, base, computeTarget="no-such-cluster"))))
    assert "404" in str(err.value) and "computeTarget" in str(err.value) and "\n" not in str(err.value), err.value


def test_nni_v1_and_python_api_configs(aml_in_shared, base: Path) -> None:  # logged in to the shared emulator
    v1 = {"authorName": "nni", "trialConcurrency": 1, "trainingServicePlatform": "aml",
          "trial": {"command": "python3 mnist.py", "codeDir": str(base), "image": "msranni/nni", "gpuNum": 0},
          "amlConfig": {"subscriptionId": "s", "resourceGroup": "rg", "workspaceName": "ws",
                        "computeTarget": "gpu", "maxTrialNumPerGpu": 1}}
    o = load_config(v1).training_service.options
    assert (o.subscription_id, o.resource_group, o.workspace_name, o.compute_target, o.docker_image) == (
        "s", "rg", "ws", "gpu", "msranni/nni")
    pytest.importorskip("nni", reason="NNI's Python API needs the nni package")
    from nni.experiment import AlgorithmConfig, AmlConfig, ExperimentConfig
    exp = ExperimentConfig(training_service=AmlConfig(subscription_id="s", resource_group="rg",
                                                      workspace_name="ws", compute_target="gpu"))
    exp.trial_command = "python3 mnist.py"
    exp.trial_code_directory = str(base)
    exp.trial_concurrency = 2
    exp.search_space = {"x": {"_type": "choice", "_value": [1]}}
    exp.tuner = AlgorithmConfig(name="Random")
    cfg = load_config(exp.json())
    assert cfg.training_service.platform == "aml" and cfg.training_service.options.docker_image == "msranni/nni:latest"


def test_dry_run_shows_the_request_bodies(tmp_path: Path) -> None:
    cfg = load_config({"trialCommand": "python3 t.py", "trialConcurrency": 2, "trialCodeDirectory": str(tmp_path),
                       "trainingService": {"platform": "aml", "subscriptionId": "sub", "resourceGroup": "rg",
                                           "workspaceName": "ws", "computeTarget": "gpu", "nniManagerIp": "10.0.0.5"}})  # not dialed: data only
    dry = backend_class("aml")(cfg).render()
    body = dry.requests[0]["properties"]
    assert body["jobType"] == "Command" and body["computeId"].endswith("/workspaces/ws/computes/gpu")
    assert body["environmentId"].split("/environments/")[1].startswith("nni-agent-")
    assert "10.0.0.5:" in body["command"] and "--single-trial" not in body["command"]  # not dialed: data only
    assert "PUT https://management.azure.com/subscriptions/sub/resourceGroups/rg/" in dry.text
    header = dry.text.splitlines()[0]  # says what happens: literals in the command, not masked secrets
    assert "masked" not in header and "literals in the job's command" in header, header
    assert json.loads(dry.text.split("\n", 2)[2].split("\n# PUT")[0])["properties"]["image"] == "msranni/nni:latest"


def test_image_that_cannot_be_pulled_fails_the_trials_in_amls_words(aml, base: Path) -> None:
    """The job fails in Preparing (AML cannot pull the image); after two environments that never
    started, the waiting trials fail with AML's words instead of waiting forever."""
    cfg = load_config(config_dict(aml, base, dockerImage="no-such/image:1"))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "AML job nni_exp_" in d.message and "Failed" in d.message, d.message

    run(main())
    assert all(j["status"] == "Failed" for j in aml.jobs()) and aml.jobs()
