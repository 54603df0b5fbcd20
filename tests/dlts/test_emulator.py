"""Self-tests of the DLTS dashboard emulator, driven only over HTTP with aiohttp."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from pathlib import Path

import aiohttp
import pytest

pytestmark = pytest.mark.timeout(60)


def nni_job(dlts, cmd: str, **extra) -> dict:
    """The job JSON NNI's DLTSJobConfig sent (dltsJobConfig.ts)."""
    return {"team": dlts.team, "vcName": dlts.team, "userName": dlts.email, "gpuType": "P40",
            "jobName": "nni_exp_abc_trial_xyz12", "resourcegpu": 0, "image": "msranni/nni", "cmd": cmd,
            "interactivePorts": [], "jobType": "training", "jobtrainingtype": "RegularJob", "ssh": False,
            "ipython": False, "tensorboard": False, "workPath": "", "enableworkpath": True, "dataPath": "",
            "enabledatapath": False, "jobPath": "", "enablejobpath": True, "mountpoints": [],
            "env": [{"name": "TMPDIR", "value": "$HOME/tmp"}], "hostNetwork": False, "useGPUTopology": False,
            "isPrivileged": False, "hostIPC": False, "preemptionAllowed": "False", **extra}


class Client:
    def __init__(self, dlts, session: aiohttp.ClientSession):
        self.dlts, self.s = dlts, session

    async def call(self, method: str, path: str, body=None, auth: dict | None = None, **kw):
        params = self.dlts.auth_query() if auth is None else auth
        async with self.s.request(method, self.dlts.url + path, params=params, json=body, **kw) as r:
            return r.status, r.headers.get("Content-Type", ""), await r.text()

    async def submit(self, body: dict) -> str:
        status, ctype, txt = await self.call("POST", f"api/clusters/{self.dlts.cluster}/jobs", body)
        assert status == 200, txt
        assert ctype.startswith("text/plain")          # the RestAPI text passed through by Koa
        return json.loads(txt)["jobId"]

    async def detail(self, job_id: str) -> dict:
        status, _, txt = await self.call("GET", f"api/v2/clusters/{self.dlts.cluster}/jobs/{job_id}")
        assert status == 200, txt
        return json.loads(txt)

    async def set_status(self, job_id: str, status: str) -> tuple[int, str]:
        code, _, txt = await self.call("PUT", f"api/clusters/{self.dlts.cluster}/jobs/{job_id}/status",
                                       {"status": status})
        return code, txt

    async def wait(self, job_id: str, *statuses: str, timeout: float = 20) -> dict:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            d = await self.detail(job_id)
            if d.get("jobStatus") in statuses:
                return d
            assert asyncio.get_running_loop().time() < deadline, f"job {job_id} stuck in {d.get('jobStatus')}"
            await asyncio.sleep(0.03)


def run(coro):
    return asyncio.run(coro)


async def with_client(dlts, fn):
    async with aiohttp.ClientSession() as s:
        return await fn(Client(dlts, s))


def test_auth_and_team_metadata(dlts):
    async def go(c: Client):
        path = f"api/teams/{dlts.team}/clusters/{dlts.cluster}"
        assert (await c.call("GET", path, auth={}))[0::2] == (403, "Forbidden")
        assert (await c.call("GET", path, auth={"email": dlts.email}))[0::2] == (403, "Forbidden")
        assert (await c.call("GET", path, auth={"email": dlts.email, "password": ""}))[0::2] == (403, "Forbidden")
        wrong = {"email": dlts.email, "password": "0" * 32}
        status, ctype, body = await c.call("GET", path, auth=wrong)
        assert (status, body) == (403, "Invalid token") and ctype.startswith("text/plain")
        other = {"email": "bob@example.com", "password": dlts.password()}     # alice's password for bob
        assert (await c.call("GET", path, auth=other))[0::2] == (403, "Invalid token")
        legacy = {"email": dlts.email, "token": dlts.password().upper()}       # `token`, any hex case
        status, ctype, body = await c.call("GET", path, auth=legacy)
        assert status == 200 and ctype.startswith("application/json")
        team = json.loads(body)
        assert isinstance(team["metadata"], str)                               # a JSON string, as NNI read it
        assert next(iter(json.loads(team["metadata"]))) == "P40"
        assert team["vcName"] == dlts.team
        # the cluster param middleware runs before authentication
        assert (await c.call("GET", f"api/teams/{dlts.team}/clusters/nope", auth={}))[0::2] == (
            404, "Cluster is not found")
        status, _, body = await c.call("GET", f"api/teams/{dlts.team}/clusters/.default")
        assert status == 200 and json.loads(body)["vcName"] == dlts.team
        assert (await c.call("GET", f"api/teams/other/clusters/{dlts.cluster}"))[0::2] == (404, "Team is not found")
        assert (await c.call("GET", "api/nothing/here"))[0::2] == (404, "Not Found")
        assert (await c.call("DELETE", f"api/clusters/{dlts.cluster}/jobs"))[0] == 405
    run(with_client(dlts, go))
    assert all(e["query"].get("password") in (None, "***") for e in dlts.requests())


def test_job_runs_through_every_status_to_finished(dlts, tmp_path: Path):
    out = tmp_path / "env.json"
    go_file = tmp_path / "go"  # the job runs until the test has looked at it, however loaded the machine
    cmd = (f"export NNI_PLATFORM=dlts && cd {tmp_path} && python -c 'import json,os; "
           f"json.dump(dict(os.environ), open(\"{out}\", \"w\"))' && "
           f"while [ ! -e {go_file} ]; do sleep 0.05; done")

    async def go(c: Client):
        job_id = await c.submit(nni_job(dlts, cmd))
        running = await c.wait(job_id, "running")
        started = dt.datetime.fromisoformat(running["jobStatusDetail"][0]["startedAt"])
        assert started.tzinfo is not None
        pids = dlts.job(job_id)["pids"]
        assert pids, "a running job has live processes"
        for _ in range(100):  # as root the task starts in its own mount namespace, then execs bash
            with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if argv[0] == b"bash":
                break
            await asyncio.sleep(0.02)
        assert b"sleep" not in b" ".join(argv[:2]) and argv[0] == b"bash" and argv[1].endswith(b"command.sh")
        go_file.touch()
        done = await c.wait(job_id, "finished", "failed")
        return job_id, done
    job_id, done = run(with_client(dlts, go))
    assert done["jobStatus"] == "finished"
    assert "finishedAt" in done["jobStatusDetail"][0] and done["jobParams"]["userName"] == dlts.email
    assert done["jobParams"]["preemptionAllowed"] is False                # the string "False", parsed
    history = [h["status"] for h in dlts.job(job_id)["history"]]
    assert history == ["unapproved", "queued", "scheduling", "running", "finished"]
    env = json.loads(out.read_text())
    assert env["DLWS_JOB_ID"] == job_id and env["DLTS_JOB_ID"] == job_id
    assert env["DLWS_VC_NAME"] == dlts.team and env["DLWS_USER_EMAIL"] == dlts.email
    assert env["TMPDIR"] == "$HOME/tmp"                                   # Kubernetes does not expand it
    assert env["DLTS_JOB_TOKEN"] == dlts.password()
    assert dlts.job(job_id)["pids"] == []


def test_failed_job_and_killed_task(dlts):
    async def go(c: Client):
        failed = await c.submit(nni_job(dlts, "echo boom >&2; exit 3"))
        assert (await c.wait(failed, "finished", "failed"))["jobStatus"] == "failed"
        victim = await c.submit(nni_job(dlts, "sleep 60"))
        await c.wait(victim, "running")
        dlts.kill_task(victim)
        assert (await c.wait(victim, "finished", "failed"))["jobStatus"] == "failed"
        return failed, victim
    failed, victim = run(with_client(dlts, go))
    assert dlts.job(failed)["exitCode"] == 3
    assert "boom" in (Path(dlts.job(failed)["taskDir"]) / "stderr").read_text()
    assert dlts.job(victim)["exitCode"] == -9 and dlts.live_pids() == []


def test_submit_errors(dlts_factory):
    dlts = dlts_factory(teams={"nni-team": {"members": ["alice@example.com"]}, "private": {"members": ["x@y"]}})

    async def go(c: Client):
        path = f"api/clusters/{dlts.cluster}/jobs"
        body = nni_job(dlts, "true")
        del body["team"], body["vcName"]
        assert (await c.call("POST", path, body))[0::2] == (400, " should have required property 'team'")
        assert (await c.call("POST", path, data="{nope", headers={"Content-Type": "application/json"}))[0] == 400
        status, _, txt = await c.call("POST", path, nni_job(dlts, "true", jobName=" "))
        assert status == 200 and json.loads(txt) == {"error": "Cannot create job!ERROR: Job name cannot be empty"}
        status, _, txt = await c.call("POST", path, nni_job(dlts, "true", team="private", vcName="private"))
        assert json.loads(txt) == {"error": "Cannot create job!Access Denied!"}
        status, _, txt = await c.call("POST", path, nni_job(dlts, "true", workPath="../etc"))
        assert json.loads(txt) == {"error": "Cannot create job!ERROR: '..' cannot be used in work directory"}
        bob = {"email": "bob@example.com", "password": dlts.password("bob@example.com")}
        status, _, txt = await c.call("POST", path, nni_job(dlts, "true"), auth=bob)
        assert json.loads(txt) == {"error": "Cannot create job!Access Denied!"}
    run(with_client(dlts, go))
    assert dlts.jobs() == []


def test_kill_passes_through_killing_and_leaves_no_process(dlts):
    async def go(c: Client):
        job_id = await c.submit(nni_job(dlts, "sleep 60 & sleep 60; wait"))
        await c.wait(job_id, "running")
        dlts.wait_for(lambda: len(dlts.job(job_id)["pids"]) >= 3, what="the job's three processes")
        assert await c.set_status(job_id, "bogus") == (400, ".status should be equal to one of the allowed values")
        dlts.hold("killing")
        code, txt = await c.set_status(job_id, "killing")
        assert code == 200 and json.loads(txt) == {"result": "Success, the job is scheduled to be terminated."}
        await c.wait(job_id, "killing")
        dlts.hold(None)
        killed = await c.wait(job_id, "killed")
        assert "finishedAt" in killed["jobStatusDetail"][0]
        code, txt = await c.set_status(job_id, "killing")
        assert json.loads(txt) == {"result": f"Cannot Kill the job. Job ID:{job_id}"}
        queued = await c.submit(nni_job(dlts, "sleep 60"))
        dlts.hold("queued")
        await c.wait(queued, "queued")
        await c.set_status(queued, "killing")
        dlts.hold(None)
        await c.wait(queued, "killed")
        return job_id
    job_id = run(with_client(dlts, go))
    assert dlts.live_pids() == [] and dlts.job(job_id)["pids"] == []


def test_pause_and_resume(dlts):
    async def go(c: Client):
        job_id = await c.submit(nni_job(dlts, "sleep 60"))
        await c.wait(job_id, "running")
        dlts.pause(job_id)
        await c.wait(job_id, "paused")
        assert dlts.job(job_id)["pids"] == []
        code, txt = await c.set_status(job_id, "queued")                 # the dashboard's resume
        assert json.loads(txt) == {"result": "Success, the job is scheduled to be resumed."}
        await c.wait(job_id, "running")
        await c.set_status(job_id, "pausing")                            # users may pause too
        await c.wait(job_id, "paused")
        return job_id
    job_id = run(with_client(dlts, go))
    j = dlts.job(job_id)
    assert j["attempt"] == 2
    assert [h["status"] for h in j["history"]][3:] == [
        "running", "pausing", "paused", "unapproved", "queued", "scheduling", "running", "pausing", "paused"]


def test_visibility_list_and_unknown_status(dlts_factory):
    dlts = dlts_factory(teams={"nni-team": {"members": ["*"], "admins": ["boss@example.com"]}})

    async def go(c: Client):
        job_id = await c.submit(nni_job(dlts, "true"))
        await c.wait(job_id, "finished")
        bob = {"email": "bob@example.com", "password": dlts.password("bob@example.com")}
        boss = {"email": "boss@example.com", "password": dlts.password("boss@example.com")}
        path = f"api/v2/clusters/{dlts.cluster}/jobs/{job_id}"
        assert json.loads((await c.call("GET", path, auth=bob))[2]) == {}
        assert json.loads((await c.call("GET", path, auth=boss))[2])["jobId"] == job_id
        assert json.loads((await c.call("GET", f"api/v2/clusters/{dlts.cluster}/jobs/nope"))[2]) == {}
        listed = json.loads((await c.call("GET", f"api/v2/clusters/{dlts.cluster}/teams/{dlts.team}/jobs",
                                          auth={**dlts.auth_query(), "user": "all", "limit": "5"}))[2])
        assert [j["jobName"] for j in listed] == ["nni_exp_abc_trial_xyz12"]
        dlts.force_status(job_id, "error")
        assert (await c.detail(job_id))["jobStatus"] == "error"
    run(with_client(dlts, go))


def test_unknown_image_stays_scheduling(dlts_factory):
    dlts = dlts_factory(images={"nni-test/python:3.11": os.path.dirname(os.sys.executable)})

    async def go(c: Client):
        job_id = await c.submit(nni_job(dlts, "true", image="no/such:image"))
        await c.wait(job_id, "scheduling")
        await asyncio.sleep(0.3)
        d = await c.detail(job_id)
        assert d["jobStatus"] == "scheduling" and "ImagePullBackOff" in json.dumps(d["jobStatusDetail"])
        await c.set_status(job_id, "killing")
        await c.wait(job_id, "killed")
    run(with_client(dlts, go))


def test_faults_5xx_429_and_hang(dlts):
    async def go(c: Client):
        path = f"api/teams/{dlts.team}/clusters/{dlts.cluster}"
        dlts.fault(502, count=2, method="GET", path="/clusters/")
        assert (await c.call("GET", path))[0::2] == (502, "Bad Gateway")
        assert (await c.call("GET", path))[0::2] == (502, "Bad Gateway")
        assert (await c.call("GET", path))[0] == 200
        dlts.fault(429, retry_after=3)
        async with c.s.get(dlts.url + path, params=dlts.auth_query()) as r:
            assert r.status == 429 and r.headers["Retry-After"] == "3"
        dlts.fault(None, hang=2.0)
        with pytest.raises(asyncio.TimeoutError):
            await c.call("GET", path, timeout=aiohttp.ClientTimeout(total=0.3))
        assert (await c.call("GET", path))[0] == 200
    run(with_client(dlts, go))


def test_stop_kills_running_jobs(dlts_factory):
    dlts = dlts_factory()

    async def go(c: Client):
        job_id = await c.submit(nni_job(dlts, "setsid sleep 60 & sleep 60"))
        await c.wait(job_id, "running")
        dlts.wait_for(lambda: len(dlts.live_pids()) >= 2, what="both processes")
    run(with_client(dlts, go))
    assert dlts.leftover_processes()
    dlts.stop()
    assert dlts.leftover_processes() == []
