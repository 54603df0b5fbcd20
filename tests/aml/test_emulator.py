"""Self-tests of the Azure ML (ARM) emulator: aiohttp over HTTPS, tokens from azure-identity."""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest

from tests.support.aml.emulator.api_versions import DOCUMENTED

pytestmark = pytest.mark.timeout(60)
JOBS_API = "2023-04-01-preview"        # what azure-ai-ml uses for Command job create/cancel
GET_API = "2024-01-01-preview"         # ... and for get/list


def arm_token(scope: str = "https://management.azure.com/.default") -> str:
    from azure.identity import DefaultAzureCredential
    with DefaultAzureCredential() as cred:
        return cred.get_token(scope).token


class Arm:
    def __init__(self, aml, session: aiohttp.ClientSession, token: str | None):
        self.aml, self.s, self.token = aml, session, token
        self.ssl = ssl.create_default_context(cafile=aml.ca_file)

    async def call(self, method: str, path: str, body=None, api: str | None = JOBS_API, token: str | None = "",
                   headers: dict | None = None, full_url: str | None = None):
        h = dict(headers or {})
        tok = self.token if token == "" else token
        if tok is not None:
            h["Authorization"] = f"Bearer {tok}"
        params = {"api-version": api} if api else {}
        url = full_url or self.aml.url + path
        async with self.s.request(method, url, params=None if full_url else params, json=body, headers=h,
                                  ssl=self.ssl) as r:
            txt = await r.text()
            return r.status, r.headers, (json.loads(txt) if txt else None)

    def ws(self, tail: str = "") -> str:
        return self.aml.workspace_path + tail

    async def put_env(self, image: str = "msranni/nni:latest", name: str = "nni-env", version: str = "1"):
        return await self.call("PUT", self.ws(f"/environments/{name}/versions/{version}"),
                               {"properties": {"image": image, "osType": "Linux", "isAnonymous": True}},
                               api="2023-04-01")

    def job_body(self, command: str, env_name: str = "nni-env", **props) -> dict:
        return {"properties": {"jobType": "Command", "command": command,
                               "environmentId": self.ws(f"/environments/{env_name}/versions/1"),
                               "computeId": self.ws(f"/computes/{self.aml.compute}"),
                               "experimentName": "nni_exp_abc", "displayName": "nni_exp_abc_env_xyz12",
                               "resources": {"instanceCount": 1}, "environmentVariables": {}, "tags": {},
                               "properties": {}, **props}}

    async def status(self, name: str) -> str:
        code, _, body = await self.call("GET", self.ws(f"/jobs/{name}"), api=GET_API)
        assert code == 200, body
        return body["properties"]["status"]

    async def wait(self, name: str, *statuses: str, timeout: float = 20) -> str:
        deadline = asyncio.get_running_loop().time() + timeout
        while (st := await self.status(name)) not in statuses:
            assert asyncio.get_running_loop().time() < deadline, f"job {name} stuck in {st}"
            await asyncio.sleep(0.03)
        return st


def run(aml, fn, token: str | None = None):
    async def go():
        async with aiohttp.ClientSession() as s:
            return await fn(Arm(aml, s, token))
    return asyncio.run(go())


def test_token_through_azure_identity_without_network(aml, monkeypatch):
    dialled = []
    real_connect = socket.socket.connect

    def spy(self, address):
        dialled.append(address)
        return real_connect(self, address)
    monkeypatch.setattr(socket.socket, "connect", spy)
    token = arm_token()
    assert dialled == []                                   # no IMDS probe, no login.microsoftonline.com
    monkeypatch.undo()

    async def go(c: Arm):
        code, headers, body = await c.call("GET", c.ws(), api="2024-04-01")
        assert code == 200 and body["properties"]["provisioningState"] == "Succeeded"
        assert headers["x-ms-request-id"]
    run(aml, go, token)


def test_authentication_refusals(aml, monkeypatch, tmp_path):
    async def go(c: Arm):
        path = c.ws("/jobs/nothing")
        code, headers, body = await c.call("GET", path, token=None)
        assert code == 401 and body["error"]["code"] == "AuthenticationFailed"
        assert headers["WWW-Authenticate"].startswith('Bearer authorization_uri="https://login.windows.net/"')
        code, _, body = await c.call("GET", path, token=None, headers={"Authorization": "Basic eDp5"})
        assert (code, body["error"]["code"]) == (401, "AuthenticationFailedInvalidHeader")
        code, headers, body = await c.call("GET", path, token="not.a.token")
        assert (code, body["error"]["code"]) == (401, "InvalidAuthenticationToken")
        assert 'error="invalid_token"' in headers["WWW-Authenticate"]
        code, _, body = await c.call("GET", path, token=aml.mint_token(lifetime=-60))
        assert (code, body["error"]["code"]) == (401, "ExpiredAuthenticationToken")
        code, _, body = await c.call("GET", path, token=aml.mint_token(audience="https://vault.azure.net"))
        assert (code, body["error"]["code"]) == (401, "InvalidAuthenticationTokenAudience")
        assert "https://vault.azure.net" in body["error"]["message"]
        code, _, body = await c.call("GET", path, token=aml.mint_token(tenant="11111111-2222-3333-4444-555555555555"))
        assert (code, body["error"]["code"]) == (401, "InvalidAuthenticationTokenTenant")
        code, _, body = await c.call("GET", path, token=arm_token("https://management.core.windows.net//.default"))
        assert (code, body["error"]) == (404, {"code": "UserError", "message": "Job nothing not found.",
                                               "details": [], "additionalInfo": []})
    run(aml, go)

    monkeypatch.setenv("AZURE_CONFIG_DIR", aml.config_dir("reader"))
    reader = arm_token()

    async def as_reader(c: Arm):
        assert (await c.call("GET", c.ws(f"/computes/{aml.compute}")))[0] == 200
        code, _, body = await c.call("PUT", c.ws("/jobs/j1"), c.job_body("true"))
        assert (code, body["error"]["code"]) == (403, "AuthorizationFailed")
        msg = body["error"]["message"]
        assert "'Microsoft.MachineLearningServices/workspaces/jobs/write'" in msg
        assert aml.principal_oid("reader") in msg and "reader@contoso.example" in msg
    run(aml, as_reader, reader)

    monkeypatch.setenv("AZURE_CONFIG_DIR", aml.config_dir("norole"))
    norole = arm_token()

    async def as_nobody(c: Arm):
        code, _, body = await c.call("GET", c.ws(f"/computes/{aml.compute}"))
        assert (code, body["error"]["code"]) == (403, "AuthorizationFailed")
        aml.set_roles("norole", ["AzureML Data Scientist"])
        assert (await c.call("GET", c.ws(f"/computes/{aml.compute}")))[0] == 200
    run(aml, as_nobody, norole)

    from azure.core.exceptions import ClientAuthenticationError
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path))            # never logged in
    with pytest.raises(ClientAuthenticationError, match="az login"):
        arm_token()


def test_command_job_runs_to_completed(aml, tmp_path: Path):
    out = tmp_path / "env.json"

    async def go(c: Arm):
        code, _, env = await c.put_env()
        assert code == 201 and env["properties"]["image"] == "msranni/nni:latest"
        assert (await c.put_env())[0] == 200
        code, _, body = await c.put_env(image="other:1")
        assert code == 409 and body["error"]["code"] == "UserError"
        command = f"python -c 'import json,os; json.dump(dict(os.environ), open(\"{out}\", \"w\"))' && sleep 0.2"
        body = c.job_body(command, environmentVariables={"NNI_AGENT_TOKEN_FILE": "/x"})
        code, _, job = await c.call("PUT", c.ws("/jobs/nni_exp_abc_env_xyz12"), body)
        assert code == 201 and job["properties"]["status"] == "NotStarted"
        assert job["name"] == "nni_exp_abc_env_xyz12" and job["id"].endswith("/jobs/nni_exp_abc_env_xyz12")
        studio = job["properties"]["services"]["Studio"]["endpoint"]
        assert studio == (f"https://ml.azure.com/runs/nni_exp_abc_env_xyz12?wsid=/subscriptions/{aml.subscription_id}"
                          f"/resourcegroups/{aml.resource_group}/workspaces/{aml.workspace_name}&tid={aml.tenant_id}")
        code, _, again = await c.call("PUT", c.ws("/jobs/nni_exp_abc_env_xyz12"), {
            "properties": {**body["properties"], "tags": {"k": "v"}}})
        assert code == 200 and again["properties"]["tags"] == {"k": "v"}
        changed = {"properties": {**body["properties"], "command": "echo other"}}
        assert (await c.call("PUT", c.ws("/jobs/nni_exp_abc_env_xyz12"), changed))[0] == 400
        assert await c.wait("nni_exp_abc_env_xyz12", "Completed", "Failed") == "Completed"
    run(aml, go, arm_token())
    j = aml.job("nni_exp_abc_env_xyz12")
    assert [h["status"] for h in j["history"]] == ["NotStarted", "Queued", "Preparing", "Running", "Finalizing",
                                                  "Completed"]
    env = json.loads(out.read_text())
    assert env["AZUREML_RUN_ID"] == env["MLFLOW_RUN_ID"] == "nni_exp_abc_env_xyz12"
    assert env["AZUREML_ARM_SUBSCRIPTION"] == aml.subscription_id
    assert env["AZUREML_ARM_WORKSPACE_NAME"] == aml.workspace_name
    assert env["AZUREML_ARM_PROJECT_NAME"] == "nni_exp_abc"
    assert env["NNI_AGENT_TOKEN_FILE"] == "/x"
    versions = aml.api_versions()
    assert versions["jobs.put"] == [JOBS_API] and versions["jobs.get"] == [GET_API]
    assert versions["environments.versions.put"] == ["2023-04-01"]
    assert all(v in DOCUMENTED for vs in versions.values() for v in vs)
    assert j["pids"] == []


def test_failed_job_and_unknown_image(aml):
    async def go(c: Arm):
        await c.put_env()
        await c.put_env(image="no/such:image", name="bad-env")
        await c.call("PUT", c.ws("/jobs/fails"), c.job_body("echo boom >&2; exit 2"))
        await c.call("PUT", c.ws("/jobs/nopull"), c.job_body("true", env_name="bad-env"))
        assert await c.wait("fails", "Completed", "Failed") == "Failed"
        assert await c.wait("nopull", "Completed", "Failed") == "Failed"
    run(aml, go, arm_token())
    assert aml.job("fails")["exitCodes"] == [2]
    assert "boom" in (Path(aml.job("fails")["taskDirs"][0]) / "stderr").read_text()
    nopull = aml.job("nopull")
    assert nopull["exitCodes"] == [] and "no/such:image" in nopull["error"]
    assert "Running" not in [h["status"] for h in nopull["history"]]


def test_cancel_returns_202_location_and_leaves_no_process(aml):
    async def go(c: Arm):
        await c.put_env()
        await c.call("PUT", c.ws("/jobs/long"), c.job_body("sleep 60 & sleep 60; wait"))
        await c.wait("long", "Running")
        aml.wait_for(lambda: len(aml.job("long")["pids"]) >= 3, what="three processes")
        aml.hold("CancelRequested")
        code, headers, _ = await c.call("POST", c.ws("/jobs/long/cancel"))
        assert code == 202 and int(headers["Retry-After"]) >= 0
        location = headers["Location"]
        assert location.startswith(aml.url + f"/subscriptions/{aml.subscription_id}/providers/"
                                   "Microsoft.MachineLearningServices/locations/eastus/mfeOperationResults/")
        assert await c.status("long") == "CancelRequested"
        assert (await c.call("GET", "", full_url=location))[0] == 202
        aml.hold(None)
        for _ in range(400):
            code, _, _ = await c.call("GET", "", full_url=location)
            if code == 200:
                break
            await asyncio.sleep(0.02)
        assert code == 200 and await c.status("long") == "Canceled"
        assert aml.job("long")["pids"] == []
        assert (await c.call("POST", c.ws("/jobs/long/cancel")))[0] == 200        # already ended
        code, _, body = await c.call("POST", c.ws("/jobs/nope/cancel"))
        assert (code, body["error"]["code"]) == (404, "UserError")
        await c.call("PUT", c.ws("/jobs/queued"), c.job_body("sleep 60"))
        aml.hold("Queued")
        await c.wait("queued", "Queued")
        assert (await c.call("POST", c.ws("/jobs/queued/cancel")))[0] == 202
        aml.hold(None)
        assert await c.wait("queued", "Canceled") == "Canceled"
    run(aml, go, arm_token())
    assert aml.live_pids() == []
    assert [h["status"] for h in aml.job("long")["history"]][-2:] == ["CancelRequested", "Canceled"]


def test_arm_errors(aml):
    async def go(c: Arm):
        code, _, body = await c.call("GET", c.ws("/computes/gpu-cluster"))
        assert code == 404 and body["error"]["code"] == "ResourceNotFound"
        assert "computes/gpu-cluster' under resource group" in body["error"]["message"]
        code, _, body = await c.call("GET", c.ws(f"/computes/{aml.compute}"))
        assert code == 200 and body["properties"]["computeType"] == "AmlCompute"
        other_ws = c.ws().replace("/workspaces/nni-ws", "/workspaces/other")
        assert (await c.call("GET", other_ws + "/jobs/x"))[2]["error"]["code"] == "ResourceNotFound"
        other_rg = c.ws().replace("/resourceGroups/nni-rg", "/resourceGroups/other")
        assert (await c.call("GET", other_rg + "/jobs/x"))[2]["error"]["code"] == "ResourceGroupNotFound"
        other_sub = c.ws().replace(aml.subscription_id, "00000000-0000-0000-0000-000000000000")
        assert (await c.call("GET", other_sub + "/jobs/x"))[0:3:2] == (404, {"error": {
            "code": "SubscriptionNotFound",
            "message": "The subscription '00000000-0000-0000-0000-000000000000' could not be found."}})
        code, _, body = await c.call("GET", c.ws("/jobs/x"), api=None)
        assert (code, body["error"]["code"]) == (400, "MissingApiVersionParameter")
        await c.put_env()
        assert (await c.call("PUT", c.ws("/jobs/bad.name"), c.job_body("true")))[0] == 400
        code, _, body = await c.call("PUT", c.ws("/jobs/j"), c.job_body("true", env_name="missing"))
        assert code == 404 and body["error"]["message"].startswith("Could not find asset with ID")
        code, _, body = await c.call("PUT", c.ws("/jobs/j"), c.job_body(
            "true", computeId=c.ws("/computes/gpu-cluster")))
        assert code == 400 and "gpu-cluster" in body["error"]["message"]
        assert (await c.call("PUT", c.ws("/jobs/j"), {"properties": {"jobType": "Command"}}))[0] == 400
        assert aml.jobs() == []
    run(aml, go, arm_token())


def test_throttling_5xx_and_hang(aml):
    async def go(c: Arm):
        path = c.ws(f"/computes/{aml.compute}")
        aml.fault(429, retry_after=7, method="GET", path="/computes/")
        code, headers, body = await c.call("GET", path)
        assert (code, headers["Retry-After"], body["error"]["code"]) == (429, "7", "SubscriptionRequestsThrottled")
        assert aml.principal_oid() in body["error"]["message"]
        aml.fault(503, count=2)
        assert [(await c.call("GET", path))[0] for _ in range(3)] == [503, 503, 200]
        aml.fault(None, hang=2.0)
        with pytest.raises(asyncio.TimeoutError):
            async with c.s.get(aml.url + path, params={"api-version": GET_API}, ssl=c.ssl,
                               headers={"Authorization": f"Bearer {c.token}"},
                               timeout=aiohttp.ClientTimeout(total=0.3)):
                pass
        assert (await c.call("GET", path))[0] == 200
    run(aml, go, arm_token())


def test_list_pages_and_stop_kills_processes(aml_factory, monkeypatch):
    aml = aml_factory(page_size=2)
    for k, v in aml.env().items():
        monkeypatch.setenv(k, v)

    async def go(c: Arm):
        await c.put_env()
        for i in range(3):
            await c.call("PUT", c.ws(f"/jobs/job{i}"), c.job_body("setsid sleep 60 & sleep 60"))
        code, _, page = await c.call("GET", c.ws("/jobs"), api=GET_API)
        assert code == 200 and len(page["value"]) == 2 and page["nextLink"].startswith(aml.url)
        code, _, rest = await c.call("GET", "", full_url=page["nextLink"])
        assert len(rest["value"]) == 1 and "nextLink" not in rest
        assert {j["name"] for j in page["value"] + rest["value"]} == {"job0", "job1", "job2"}
        for i in range(3):
            await c.wait(f"job{i}", "Running")
    run(aml, go, arm_token())
    aml.wait_for(lambda: len(aml.live_pids()) >= 6, what="six processes")
    aml.stop()
    assert aml.leftover_processes() == []
