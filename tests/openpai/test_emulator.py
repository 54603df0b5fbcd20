"""Self-tests of the OpenPAI rest-server emulator, driven only through HTTP (aiohttp) as a client
such as NNI's OpenPAI training service would, plus its /_emulator controls."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.openpai.emulator.protocol import schemas_dir

DETAIL_STATUS_KEYS = {
    "username", "state", "subState", "executionType", "retries", "retryDetails", "retryDelayTime", "createdTime",
    "launchedTime", "completedTime", "attemptId", "attemptState", "appId", "appProgress", "appTrackingUrl",
    "appCreatedTime", "appLaunchedTime", "appCompletedTime", "appExitCode", "appExitSpec", "appExitDiagnostics",
    "appExitMessages", "appExitTriggerMessage", "appExitTriggerTaskRoleName", "appExitTriggerTaskIndex",
    "appExitType", "virtualCluster", "submissionTime"}
TASK_KEYS = {
    "taskIndex", "taskUid", "taskState", "containerId", "containerIp", "containerNodeName", "containerPorts",
    "containerGpus", "containerLog", "containerExitCode", "containerExitSpec", "containerExitDiagnostics",
    "retries", "accountableRetries", "createdTime", "launchedTime", "completedTime", "attemptId", "attemptState"}
LIST_KEYS = {
    "debugId", "name", "username", "state", "subState", "executionType", "tags", "retries", "retryDetails",
    "retryDelayTime", "submissionTime", "createdTime", "launchedTime", "completedTime", "appExitCode",
    "virtualCluster", "totalGpuNumber", "totalTaskNumber", "totalTaskRoleNumber", "jobPriority"}


def job_yaml(name: str, commands: list[str], *, instances: int = 1, role: str = "taskrole", vc: str | None = None,
             extra: dict | None = None, role_extra: dict | None = None) -> str:
    """The job NNI generates (generateJobConfigInYamlFormat), with our commands."""
    job = {"protocolVersion": 2, "name": name, "type": "job", "jobRetryCount": 0,
           "prerequisites": [{"type": "dockerimage", "uri": "msranni/nni:latest", "name": "docker_image_0"}],
           "taskRoles": {role: {"instances": instances,
                                "completion": {"minFailedInstances": 1, "minSucceededInstances": -1},
                                "taskRetryCount": 0, "dockerImage": "docker_image_0",
                                "resourcePerInstance": {"gpu": 0, "cpu": 1, "memoryMB": 1024},
                                "commands": commands, **(role_extra or {})}},
           "extras": {"storages": [{"name": "confignfs"}], "submitFrom": "submit-job-v2"}}
    if vc:
        job["defaults"] = {"virtualCluster": vc}
    job.update(extra or {})
    return yaml.safe_dump(job, sort_keys=False)


def _decode(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


class Client:
    """What a PAI client does: bearer token, text/yaml submit, JSON reads."""

    def __init__(self, pai, token: str | None = None):
        self.pai, self.token = pai, token if token is not None else pai.token

    def _h(self, extra: dict | None = None) -> dict:
        h = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return {**h, **(extra or {})}

    async def submit(self, body: str):
        async with aiohttp.ClientSession() as s:
            async with s.post(self.pai.api + "/jobs", data=body.encode(),
                              headers=self._h({"Content-Type": "text/yaml"})) as r:
                return r.status, _decode(await r.text())

    async def get(self, path: str, timeout: float = 10):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(self.pai.api + path, headers=self._h({"Content-Type": "application/json"})) as r:
                return r.status, _decode(await r.text())

    async def stop(self, name: str, user: str | None = None, body=None):
        async with aiohttp.ClientSession() as s:
            async with s.put(f"{self.pai.api}/jobs/{user or self.pai.username}~{name}/executionType",
                             json={"value": "STOP"} if body is None else body, headers=self._h()) as r:
                return r.status, await r.json(content_type=None)

    async def wait_state(self, name: str, *states: str, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            st, d = await self.get(f"/jobs/{self.pai.username}~{name}")
            if st == 200 and d["jobStatus"]["state"] in states:
                return d
            assert time.monotonic() < deadline, f"job {name} never reached {states}: {d}"
            await asyncio.sleep(0.05)


def run(coro):
    return asyncio.run(coro)


def task_files(pai, name: str, filename: str) -> list[str]:
    return sorted(p.read_text() for p in (pai.state_dir / "jobs").rglob(filename))


# ----------------------------------------------------------------------------- submit / validation
def test_accepts_pinned_examples(pai_factory):
    pai = pai_factory(virtual_clusters={"default": {"tasks": 0}})     # nothing runs: no network
    c = Client(pai)
    files = sorted((schemas_dir() / "examples" / "pai").glob("*.yaml")) + \
        sorted((schemas_dir() / "examples" / "openpai-protocol").glob("*.yaml"))
    assert len(files) >= 5

    async def go():
        for f in files:
            st, body = await c.submit(f.read_text())
            name = yaml.safe_load(f.read_text())["name"]
            assert (st, body) == (202, {"status": 202,
                                        "message": f"Update job {name} for user alice successfully."}), f.name
            d = await c.wait_state(name, "WAITING")
            assert d["jobStatus"]["subState"] == "AttemptPreparing"
            assert all(t["taskState"] == "WAITING" and t["containerIp"] is None
                       for r in d["taskRoles"].values() for t in r["taskStatuses"])
            assert (await c.stop(name))[0] == 202
            await c.wait_state(name, "STOPPED")
    run(go())
    assert pai.live_pids() == []
    assert task_files(pai, "*", "user.sh") == []          # never started


@pytest.mark.parametrize("mutate, expect", [
    (lambda j: j["taskRoles"].update({"bad-name": j["taskRoles"]["taskrole"]}),
     {"keyword": "additionalProperties", "dataPath": ".taskRoles", "params": {"additionalProperty": "bad-name"}}),
    (lambda j: j.update({"trialConcurrency": 2}),
     {"keyword": "additionalProperties", "dataPath": "", "params": {"additionalProperty": "trialConcurrency"}}),
    (lambda j: j.pop("taskRoles"),
     {"keyword": "required", "dataPath": "", "params": {"missingProperty": ".taskRoles"}}),
    (lambda j: j.update({"name": "has space"}),
     {"keyword": "pattern", "dataPath": ".name"}),
    (lambda j: j["taskRoles"]["taskrole"].update({"instances": 0}),
     {"keyword": "minimum", "dataPath": ".taskRoles.taskrole.instances"}),
    (lambda j: j["taskRoles"]["taskrole"]["resourcePerInstance"].pop("gpu"),
     {"keyword": "required", "dataPath": ".taskRoles.taskrole.resourcePerInstance"}),
])
def test_rejects_invalid_protocol_with_ajv_errors(pai_shared, mutate, expect):
    pai = pai_shared  # refused requests create nothing: one emulator for them all
    job = yaml.safe_load(job_yaml("bad", ["true"]))
    mutate(job)
    st, body = run(Client(pai).submit(yaml.safe_dump(job)))
    assert st == 400 and body["code"] == "InvalidProtocolError"
    errors = json.loads(body["message"])
    assert any(all(e.get(k) == v for k, v in expect.items()) for e in errors), errors
    assert pai.jobs() == []


def test_semantic_protocol_errors_and_yaml_errors(pai_shared):
    pai = pai_shared
    c = Client(pai)
    job = yaml.safe_load(job_yaml("sem", ["true"]))
    job["taskRoles"]["taskrole"]["dockerImage"] = "nope"
    assert run(c.submit(yaml.safe_dump(job))) == (400, {"code": "InvalidProtocolError",
                                                        "message": "Prerequisite nope does not exist."})
    job = yaml.safe_load(job_yaml("sem", ["true"]))
    job["prerequisites"].append(dict(job["prerequisites"][0]))
    assert run(c.submit(yaml.safe_dump(job)))[1]["message"] == \
        "Duplicate dockerimage prerequisites docker_image_0."
    st, body = run(c.submit("name: [unclosed\n"))               # js-yaml throws: express answers 500
    assert st == 500 and set(body) == {"message"}
    assert pai.jobs() == []


def test_auth_errors(pai_shared):
    pai = pai_shared
    no_token, bad = Client(pai, token=""), Client(pai, token="wrong")
    assert run(no_token.get("/jobs")) == (401, {"code": "UnauthorizedUserError",
                                                "message": "Guest is not allowed to do this operation."})
    assert run(bad.submit(job_yaml("x", ["true"]))) == (401, {"code": "UnauthorizedUserError",
                                                              "message": "Your token is invalid."})
    assert pai.jobs() == []


def test_conflict_vc_storage_and_not_found_errors(pai):
    c = Client(pai)
    assert run(c.submit(job_yaml("dup", ["true"])))[0] == 202
    assert run(c.submit(job_yaml("dup", ["true"]))) == (409, {"code": "ConflictJobError",
                                                              "message": "Job alice~dup already exists."})
    assert run(c.submit(job_yaml("vc", ["true"], vc="nosuchvc"))) == (
        403, {"code": "ForbiddenUserError", "message": "User alice is not allowed to do operation in nosuchvc"})
    st, body = run(c.submit(job_yaml("st", ["true"], extra={"extras": {"storages": [{"name": "other"}]}})))
    assert (st, body) == (404, {"code": "NoStorageError", "message": "Storage other is not found."})
    assert run(c.get("/jobs/alice~missing")) == (404, {"code": "NoJobError",
                                                       "message": "Job alice~missing is not found."})
    assert run(c.get("/nothing")) == (404, {"code": "NoApiError", "message": "API /api/v2/nothing is not found."})
    assert run(c.stop("dup", body={"value": "PAUSE"})) == (400, {
        "code": "InvalidParametersError",
        "message": 'child "value" fails because ["value" must be one of [STOP, START]]'})


# ----------------------------------------------------------------------------- running jobs
def test_job_succeeds_with_list_and_detail_shapes(pai):
    c = Client(pai)

    async def go():
        assert (await c.submit(job_yaml("ok", ["echo hello", "echo done > result.txt"])))[0] == 202
        d = await c.wait_state("ok", "SUCCEEDED")
        st, lst = await c.get("/jobs?username=alice")
        st2, other = await c.get("/jobs?username=bob")
        st3, cfg = await c.get("/jobs/alice~ok/config")
        return d, (st, lst), (st2, other), (st3, cfg)
    d, (st, lst), (st2, other), (st3, cfg) = run(go())
    js = d["jobStatus"]
    assert set(js) == DETAIL_STATUS_KEYS and js["appExitCode"] == 0 and js["subState"] == "Completed"
    assert js["appTrackingUrl"] == "" and js["completedTime"] >= js["launchedTime"] >= js["createdTime"] > 0
    assert js["appExitSpec"]["phrase"] == "Succeeded" and js["appExitType"] == "Succeeded"
    (t,) = d["taskRoles"]["taskrole"]["taskStatuses"]
    assert TASK_KEYS <= set(t) and t["taskState"] == "SUCCEEDED" and t["containerExitCode"] == 0
    assert t["containerIp"] == "127.0.0.1" and set(t["containerPorts"]) == {"ssh", "http"}
    assert st == 200 and [set(i) for i in lst] == [LIST_KEYS]
    assert lst[0]["name"] == "ok" and lst[0]["state"] == "SUCCEEDED" and lst[0]["totalTaskNumber"] == 1
    assert (st2, other) == (200, [])
    assert st3 == 200 and cfg["name"] == "ok" and cfg["taskRoles"]["taskrole"]["commands"][0] == "echo hello"
    assert task_files(pai, "ok", "result.txt") == ["done\n"]


def test_job_fails_with_runtime_exit_code_and_diagnostics(pai):
    c = Client(pai)
    run(c.submit(job_yaml("bad", ["echo some failure >&2", "exit 3"])))
    d = run(c.wait_state("bad", "FAILED"))
    js = d["jobStatus"]
    # the runtime turns an unrecognised user exit code into 255 and keeps the original in its summary
    assert js["appExitCode"] == 255 and js["appExitSpec"]["phrase"] == "PAIRuntimeUnknownFailed"
    assert js["appExitMessages"]["runtime"]["originUserExitCode"] == 3
    assert "some failure" in js["appExitMessages"]["runtime"]["errorLogs"]["user"]
    assert js["appExitTriggerTaskRoleName"] == "taskrole" and js["appExitTriggerTaskIndex"] == 0
    assert "originUserExitCode: 3" in js["appExitDiagnostics"]
    (t,) = d["taskRoles"]["taskrole"]["taskStatuses"]
    assert t["taskState"] == "FAILED" and t["containerExitCode"] == 255


def test_stop_kills_whole_process_tree(pai_factory):
    pai = pai_factory(grace=0.5)
    c = Client(pai)
    # a child that ignores SIGTERM, so the grace period and SIGKILL are exercised
    cmd = "bash -c 'trap \"\" TERM; while true; do sleep 0.1; done' & sleep 300"

    async def go():
        await c.submit(job_yaml("long", [cmd]))
        await c.wait_state("long", "RUNNING")
        pai.wait_for(lambda: len(pai.live_pids()) >= 3, what="task processes")
        assert await c.stop("long") == (202, {"status": 202, "message": "Execute job alice~long successfully."})
        states = set()
        deadline = time.monotonic() + 20
        while "STOPPED" not in states:
            states.add((await c.get("/jobs/alice~long"))[1]["jobStatus"]["state"])
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        return states, (await c.get("/jobs/alice~long"))[1]
    states, d = run(go())
    assert "STOPPING" in states
    assert d["jobStatus"]["appExitCode"] == -210 and d["jobStatus"]["executionType"] == "STOP"
    assert d["taskRoles"]["taskrole"]["taskStatuses"][0]["containerExitCode"] == -220
    assert pai.live_pids() == [] and pai.leftover_processes() == []


def test_other_user_can_read_but_not_stop(pai_factory):
    pai = pai_factory(users={"alice": {"virtualClusters": ["default"], "storages": ["confignfs"]},
                             "bob": {"virtualClusters": ["default"], "storages": ["confignfs"]}},
                      virtual_clusters={"default": {}})
    alice, bob = Client(pai), Client(pai, token=pai.token_of("bob"))
    run(alice.submit(job_yaml("mine", ["sleep 300"])))
    assert run(bob.get("/jobs/alice~mine"))[0] == 200          # the real server does not hide jobs
    assert run(bob.stop("mine", user="alice")) == (403, {
        "code": "ForbiddenUserError", "message": "User bob is not allowed to execute job alice~mine."})
    assert run(alice.stop("mine"))[0] == 202
    run(alice.wait_state("mine", "STOPPED"))


def test_two_instances_see_pai_environment(pai):
    c = Client(pai)
    cmd = ("env | grep -E '^(PAI_|FC_TASK_INDEX|NVIDIA_VISIBLE)' | sort > env.txt")
    run(c.submit(job_yaml("envs", [cmd], instances=2, role="train_worker",
                          role_extra={"resourcePerInstance": {"gpu": 0, "cpu": 1, "memoryMB": 512,
                                                              "ports": {"tb": 2}}})))
    d = run(c.wait_state("envs", "SUCCEEDED"))
    tasks = d["taskRoles"]["trainworker"]["taskStatuses"]               # FC role name: convertName
    envs = [dict(line.split("=", 1) for line in text.splitlines()) for text in task_files(pai, "envs", "env.txt")]
    assert len(envs) == 2
    by_index = {int(e["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"]): e for e in envs}
    assert set(by_index) == {0, 1}
    for i, e in by_index.items():
        assert e["PAI_TASK_INDEX"] == str(i) and e["FC_TASK_INDEX"] == str(i)
        assert e["PAI_JOB_NAME"] == "alice~envs" and e["PAI_USER_NAME"] == "alice"
        assert e["PAI_CURRENT_TASK_ROLE_NAME"] == "train_worker" and e["PAI_TASK_ROLE_COUNT"] == "1"
        assert e["PAI_TASK_ROLE_TASK_COUNT_train_worker"] == "2" and e["PAI_VIRTUAL_CLUSTER"] == "default"
        assert e["PAI_HOST_IP_trainworker_0"] == e["PAI_HOST_IP_trainworker_1"] == "127.0.0.1"
        assert e["NVIDIA_VISIBLE_DEVICES"] == "none" and "PAI_TASK_ROLE_NAME" not in e
        for j in (0, 1):                                    # peers' ports match the detail
            assert e[f"PAI_PORT_LIST_trainworker_{j}_tb"] == tasks[j]["containerPorts"]["tb"]
            assert e[f"PAI_PORT_LIST_trainworker_{j}_http"] == tasks[j]["containerPorts"]["http"]
        assert len(e["PAI_PORT_LIST_trainworker_0_tb"].split(",")) == 2
        assert e["PAI_TASK_ROLE_trainworker_HOST_LIST"] == ",".join(
            f"127.0.0.1:{tasks[j]['containerPorts']['http']}" for j in (0, 1))
        assert e["PAI_CONTAINER_HOST_PORT"] == tasks[i]["containerPorts"]["http"]
    ports = [p for t in tasks for v in t["containerPorts"].values() for p in v.split(",")]
    assert len(ports) == len(set(ports)) == 8


def test_secrets_rendered_in_runtime_only(pai):
    c = Client(pai)
    secret = "hunter2-s3cr3t"
    run(c.submit(job_yaml("sec", ["echo token=<% $secrets.tok %> first=<% $secrets.list[0] %> > got.txt",
                                  "sleep 300"],
                          extra={"secrets": {"tok": secret, "list": ["a1"]}, "parameters": {"p": 7}})))
    run(c.wait_state("sec", "RUNNING"))
    pai.wait_for(lambda: task_files(pai, "sec", "got.txt"), what="got.txt")
    assert task_files(pai, "sec", "got.txt") == [f"token={secret} first=a1\n"]
    for pid in pai.live_pids():                                  # not in any argv, nor environment
        for f in ("cmdline", "environ"):
            try:
                assert secret.encode() not in Path(f"/proc/{pid}/{f}").read_bytes()
            except FileNotFoundError:
                pass
    st, cfg = run(c.get("/jobs/alice~sec/config"))
    assert st == 200 and cfg["secrets"] == "******" and secret not in json.dumps(cfg)
    assert secret not in json.dumps(pai.jobs())
    run(c.stop("sec"))
    run(c.wait_state("sec", "STOPPED"))
    assert secret.encode() not in (pai.state_dir / "emulator.log").read_bytes()


def test_waiting_job_runs_when_capacity_frees(pai):
    c = Client(pai)                                           # vc2 holds one task at a time

    async def go():
        await c.submit(job_yaml("first", ["sleep 300"], vc="vc2"))
        await c.wait_state("first", "RUNNING")
        await c.submit(job_yaml("second", ["echo ran > ran.txt"], vc="vc2"))
        await asyncio.sleep(0.3)
        d = await c.wait_state("second", "WAITING")
        assert d["jobStatus"]["launchedTime"] is None and d["jobStatus"]["appLaunchedTime"] is None
        assert d["taskRoles"]["taskrole"]["taskStatuses"][0]["taskState"] == "WAITING"
        assert task_files(pai, "second", "ran.txt") == []
        await c.stop("first")
        await c.wait_state("second", "SUCCEEDED")
        # capacity raised from outside: two waiting jobs then run together
        pai.set_capacity("vc2", tasks=0)
        await c.submit(job_yaml("third", ["true"], vc="vc2"))
        await c.submit(job_yaml("fourth", ["true"], vc="vc2"))
        await asyncio.sleep(0.3)
        assert (await c.wait_state("third", "WAITING")) and (await c.wait_state("fourth", "WAITING"))
        pai.set_capacity("vc2", tasks=2)
        await c.wait_state("third", "SUCCEEDED")
        await c.wait_state("fourth", "SUCCEEDED")
    run(go())
    assert task_files(pai, "second", "ran.txt") == ["ran\n"]


def test_node_failure_fails_job_or_retries(pai):
    c = Client(pai)
    marker = pai.state_dir / "attempted"
    run(c.submit(job_yaml("lost", ["sleep 300"])))
    run(c.wait_state("lost", "RUNNING"))
    pai.wait_for(lambda: pai.live_pids(), what="task process")
    assert pai.kill_task("lost", "taskrole", 0)
    d = run(c.wait_state("lost", "FAILED"))
    assert d["jobStatus"]["appExitCode"] == 137
    assert d["jobStatus"]["appExitSpec"]["phrase"] == "ContainerSigKillReceived"
    # jobRetryCount 1: the platform failure is retried in a new attempt, which succeeds
    cmd = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; sleep 300"
    run(c.submit(job_yaml("retry", [cmd], extra={"jobRetryCount": 1})))
    run(c.wait_state("retry", "RUNNING"))
    pai.wait_for(marker.exists, what="first attempt")
    assert pai.kill_task("retry", "taskrole", 0, node_lost=True)
    d = run(c.wait_state("retry", "SUCCEEDED"))
    assert d["jobStatus"]["retries"] == 1 and d["jobStatus"]["attemptId"] == 1
    st, old = run(c.get("/jobs/alice~retry/attempts/0"))
    assert st == 200 and old["jobStatus"]["appExitCode"] == -1001
    assert old["jobStatus"]["appExitSpec"]["phrase"] == "PodNodeLost"


def test_fault_injection(pai):
    c = Client(pai)
    pai.fault("error", count=2)
    assert run(c.get("/jobs")) == (500, {"code": "UnknownError", "message": "connect ECONNREFUSED 10.0.1.5:9748"})  # not dialed: data only
    assert run(c.get("/jobs"))[0] == 500
    assert run(c.get("/jobs")) == (200, [])
    pai.fault("error", status=502, count=1, method="POST")
    assert run(c.get("/jobs"))[0] == 200                         # only POST matches
    st, body = run(c.submit(job_yaml("f", ["true"])))
    assert st == 502 and "502 Bad Gateway" in body and pai.jobs() == []
    pai.fault("hang", count=1, hang_seconds=30)
    with pytest.raises(asyncio.TimeoutError):
        run(c.get("/jobs", timeout=0.5))
    pai.fault("error", seconds=60, path=r"^/api/v2/jobs/")
    assert run(c.get("/jobs/alice~x"))[0] == 500 and run(c.get("/jobs/alice~y"))[0] == 500
    assert run(c.get("/jobs"))[0] == 200
    pai.clear_faults()
    assert run(c.get("/jobs/alice~x"))[0] == 404
    assert [r["status"] for r in pai.requests()][:3] == [500, 500, 200]


def test_rate_limit_on_submit(pai_factory):
    pai = pai_factory(rate_limits={"submit": 2})
    c = Client(pai)
    assert [run(c.submit(job_yaml(f"r{i}", ["true"])))[0] for i in range(2)] == [202, 202]
    st, body = run(c.submit(job_yaml("r3", ["true"])))
    assert (st, body) == (429, "Too many requests, please try again later.")
    assert run(c.get("/jobs"))[0] == 200                          # other limits are separate

    async def retry_after() -> str | None:
        async with aiohttp.ClientSession() as s:
            async with s.post(pai.api + "/jobs", data=job_yaml("r4", ["true"]).encode(),
                              headers=c._h({"Content-Type": "text/yaml"})) as r:
                return r.headers.get("Retry-After")
    # express-rate-limit 5: Retry-After is the whole window (windowMs / 1000), not the time left
    assert run(retry_after()) == "3600"


def test_storages_mounted_where_the_protocol_says(pai_factory):
    pai = pai_factory(rate_limits={"list": 0})
    (pai.storage_dir("confignfs") / "hello.txt").write_text("from the storage")
    c = Client(pai)
    for name, entry, where in (("m1", {"name": "confignfs"}, "/mnt/confignfs"),
                               ("m2", {"name": "confignfs", "mountPath": "/mnt/elsewhere/data"},
                                "/mnt/elsewhere/data")):
        text = job_yaml(name, [f"cat {where}/hello.txt > $PAI_WORK_DIR/seen.txt"])
        doc = yaml.safe_load(text)
        doc["extras"] = {"storages": [entry]}
        assert run(c.submit(yaml.safe_dump(doc)))[0] == 202
        run(c.wait_state(name, "SUCCEEDED", "FAILED"))
        job = next(j for j in pai.jobs() if j["name"] == name)
        assert job["state"] == "SUCCEEDED", job["detail"]["jobStatus"].get("appExitDiagnostics")
    assert not Path("/mnt/elsewhere").exists()  # mount points are made in the task, never on the host


def test_emulator_shutdown_kills_tasks(pai):
    c = Client(pai)
    run(c.submit(job_yaml("orphan", ["sleep 300 & sleep 300"], instances=2)))
    run(c.wait_state("orphan", "RUNNING"))
    pai.wait_for(lambda: len(pai.live_pids()) >= 4, what="task processes")
    pai.stop()
    assert pai.proc.returncode == 0
    assert pai.leftover_processes() == []


def test_completion_policy_min_succeeded_stops_the_rest(pai):
    c = Client(pai)
    job = yaml.safe_load(job_yaml("mpi", ["sleep 300"], role="worker"))
    job["taskRoles"]["master"] = {**job["taskRoles"]["worker"], "completion": {"minSucceededInstances": 1},
                                  "commands": ["echo 'quoted \"args\" && $PAI_TASK_ROLE_COUNT'"]}
    run(c.submit(yaml.safe_dump(job)))
    d = run(c.wait_state("mpi", "SUCCEEDED"))
    assert d["jobStatus"]["appExitTriggerTaskRoleName"] == "master"
    assert d["jobStatus"]["appExitTriggerMessage"] == \
        "SucceededTaskCount 1 has reached MinSucceededTaskCount 1 in the TaskRole"
    (w,) = d["taskRoles"]["worker"]["taskStatuses"]
    assert (w["taskState"], w["containerExitCode"]) == ("STOPPED", -220)
    pai.wait_for(lambda: pai.live_pids() == [], what="worker killed")
