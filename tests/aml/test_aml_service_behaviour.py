"""`platform: aml` where Azure ML is stricter than a kind test bed: a slow `az` behind
DefaultAzureCredential (tokens must be cached, and fetched anew on a 401), a workspace full of
other people's jobs (Jobs_List by tag, ARM's nextLink followed), listing failures at stop (every
known job still cancelled), a lost PUT answer (the retry resends the same bytes; a differing body
is refused), failed jobs whose JobBase carries no error, and clouds with their own token audience.
Emulator: tests/support/aml/fixtures.py."""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.rest_jobs import BACKOFF_ENV, RestError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.aml.experiments import config_dict, ours, run
from tests.support.manager.helpers import form, until, wait_status

T = 90.0


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


def arm_put(aml: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A PUT as any ARM client sends it, with a token from azure-identity (the `az` stand-in)."""
    token = aml.credential().get_token("https://management.azure.com/.default").token
    req = urllib.request.Request(f"{aml.url}{aml.workspace_path}{path}?api-version=2024-04-01", method="PUT",
                                 data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=aml.ca_file), timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_token_fetched_once_and_again_after_a_401(aml, base: Path) -> None:
    """Each `az` run takes about a second (as the real one): the manager runs it once for a whole
    experiment, and once more when ARM refuses the cached token."""
    cfg = load_config(config_dict(aml, base))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            first = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(4)]
            for t in first:
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            assert len(aml.az_invocations()) == 1, aml.az_invocations()  # dozens of polls, one token
            aml.revoke_tokens()  # ARM refuses it from now on: 401, a fresh token, the same request again
            more = [await ts.submit_trial_job(form(10 + i, x=i, steps=1)) for i in range(2)]
            for t in more:
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            # the next poll met the 401 (its `az` may still be starting on a busy machine)
            await until(lambda: len(aml.az_invocations()) >= 2, T, "a token fetched after the 401")
            await asyncio.sleep(1.0)  # a few more polls: the fresh token is kept
            assert len(aml.az_invocations()) == 2, aml.az_invocations()

    run(main())
    assert 401 in [r["status"] for r in aml.requests()]


def test_listing_filters_by_tag_and_follows_arms_next_link(aml_factory, base: Path, monkeypatch) -> None:
    """A workspace with other experiments' jobs: only this experiment's are listed (Jobs_List's
    `tag`), and a next page is followed even when the endpoint was written in another case."""
    aml = aml_factory(page_size=1)
    for k, v in aml.env().items():
        monkeypatch.setenv(k, v)
    env_path = "/environments/other/versions/1"
    assert arm_put(aml, env_path, {"properties": {"image": "msranni/nni:latest"}})[0] == 201
    for i in range(6):  # someone else's finished jobs: non-archived, so ActiveOnly lists them
        status, _ = arm_put(aml, f"/jobs/someone_else_{i}", {"properties": {
            "jobType": "Command", "command": "true", "environmentId": aml.workspace_path + env_path,
            "computeId": f"{aml.workspace_path}/computes/{aml.compute}", "tags": {"team": "vision"}}})
        assert status == 201
    endpoint = aml.url.replace("127.0.0.1", "Localhost")  # hosts are case-insensitive; ARM's nextLink is not this string
    cfg = load_config(config_dict(aml, base, resourceManagerEndpoint=endpoint))

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(3)]
            for t in trials:
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            return ts.experiment_id

    exp = run(main())
    lists = [r for r in aml.requests() if r.get("kind") == "jobs.list"]
    assert lists and all(r["query"].get("tag") == f"nni_exp_{exp}" for r in lists), lists
    # start (no job yet: one page) and stop (two jobs, one per page: the next page followed)
    assert any("$skipToken" in r["query"] for r in lists), lists
    assert len(lists) <= 3, [r["query"] for r in lists]
    assert all(j["status"] in ("Canceled", "Completed") for j in ours(aml, exp)), ours(aml, exp)


def test_stop_cancels_every_known_job_when_the_listing_fails(aml, base: Path, caplog, monkeypatch) -> None:
    """The stop-time listing fails every time: the jobs this manager knows are cancelled anyway,
    and one line says which may still run."""
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv(BACKOFF_ENV, "0.05")  # every retry of the 3 listings happens, without 30 s of pauses
    aml.hold("Queued")  # jobs that never start their agents: only a cancel ends them
    cfg = load_config(config_dict(aml, base))

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            for i in range(2):
                await ts.submit_trial_job(form(i, x=i))
            await until(lambda: len([j for j in ours(aml, ts.experiment_id) if j["status"] == "Queued"]) == 2, T,
                        "two queued jobs")
            aml.fault(503, count=100, method="GET", path=r"/jobs$")  # every listing at stop
            return ts.experiment_id

    exp = run(main())
    aml.hold(None)
    jobs = ours(aml, exp)
    assert len(jobs) == 2 and all(j["status"] in ("CancelRequested", "Canceled") for j in jobs), jobs
    lines = [r.getMessage() for r in caplog.records if "may still run" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert all(j["name"] in lines[0] for j in jobs), lines[0]
    retried = [r for r in caplog.records if "retrying in" in r.getMessage() and r.getMessage().startswith("AML GET")]
    assert len(retried) >= 3 * 4, [r.getMessage() for r in retried]  # 3 listings at stop, 5 attempts each
    aml.clear_faults()


def test_job_put_after_a_lost_answer_resends_the_identical_body(aml, base: Path) -> None:
    """AML creates the job, the answer is lost; the retry must be the same bytes (a job can only
    change description, tags, displayName, properties and isArchived)."""
    cfg = load_config(config_dict(aml, base))
    aml.fault(None, count=1, method="PUT", path=r"/jobs/nni_exp_", lose_answer=True)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0, x=1, steps=1))
            await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            return ts.experiment_id

    exp = run(main())
    puts = [r for r in aml.requests() if r.get("kind") == "jobs.put"]
    assert [r.get("answer_lost", False) for r in puts] == [True, False], puts
    assert puts[0]["path"] == puts[1]["path"] and puts[1]["status"] == 200  # the same job, updated not created
    assert puts[0]["body_sha256"] == puts[1]["body_sha256"], puts
    # the emulator is as strict as the service: a differing body is refused
    job = next(j for j in aml.jobs() if j["name"].startswith(f"nni_exp_{exp}_"))
    env_id = next(r for r in aml.requests() if r.get("kind") == "environments.versions.put")["path"]
    status, err = arm_put(aml, f"/jobs/{job['name']}", {"properties": {
        "jobType": "Command", "command": "echo changed", "environmentId": env_id}})
    assert status == 400 and "Only description, tags, displayName, properties, and isArchived" in \
        err["error"]["message"], err


def test_failed_job_says_where_its_reason_is(aml, base: Path) -> None:
    """JobBase has no error field: the trial's message gives the job's studio page and its log."""
    cfg = load_config(config_dict(aml, base, dockerImage="no-such/image:1"))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "Failed" in d.message and "https://ml.azure.com/runs/nni_exp_" in d.message, d.message
            assert "std_log.txt" in d.message, d.message

    run(main())
    failed = [j for j in aml.jobs() if j["status"] == "Failed"]
    assert failed and all(j["error"] for j in failed)  # the emulator knows why; JobBase does not say


def test_other_clouds_token_audience(aml_factory, base: Path, monkeypatch) -> None:
    from nni_manager.backends.aml import derive_audience

    assert derive_audience("https://management.chinacloudapi.cn") == "https://management.core.chinacloudapi.cn/"
    assert derive_audience("https://Management.USGovCloudAPI.net/") == "https://management.core.usgovcloudapi.net/"
    assert derive_audience("https://management.azure.com") == "https://management.azure.com"
    china = ["https://management.core.chinacloudapi.cn/", "https://management.core.chinacloudapi.cn"]
    aml = aml_factory(audiences=china)  # an ARM of another cloud: its own audience
    for k, v in aml.env().items():
        monkeypatch.setenv(k, v)

    async def start(c: Any) -> None:
        async with create_training_service(c):
            pass

    with pytest.raises(RestError) as err:  # the endpoint alone: a token for the wrong audience
        run(start(load_config(config_dict(aml, base))))
    assert "401" in str(err.value) and "resourceManagerAudience" in str(err.value), err.value
    run(start(load_config(config_dict(aml, base, resourceManagerAudience=china[0]))))
