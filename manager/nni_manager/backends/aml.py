"""platform: aml — trials in Azure Machine Learning command jobs, through AML's v2 jobs REST API.

NNI's `aml` configs run unchanged (v2 `platform: aml`, v1 `amlConfig` + `trial.image`). As in NNI,
a pool of up to trialConcurrency jobs (environments) runs trial after trial; each job runs one
`nni-agent` that dials the manager's TLS hub at `nniManagerIp`. NNI drove AML through the retired
SDK v1 and carried every message as run metrics; here AML only runs the job: submit, watch,
cancel (`PUT`/`GET`/`POST .../cancel` on `.../workspaces/{ws}/jobs/{name}`), and everything else
travels over the agent stream.

- Credentials: azure-identity's DefaultAzureCredential (Azure CLI login, environment service
  principal, managed identity). Its ARM token is kept until shortly before it expires and fetched
  anew on a 401: AzureCliCredential does not cache, and each fetch is one `az` process (about a
  second), which per request would make one poll of 8 jobs outlast the poll interval. ARM errors
  become one line naming the missing permission or resource.
- Listing: `Jobs_List` filtered by the experiment's own tag key (never a walk of the workspace),
  following ARM's `nextLink` as given when it names the same host.
- Failed jobs: JobBase carries only the status (the error lives in the studio), so the trial's
  message gives the job's studio page and where its logs are.
- The image is an AML environment (`nni-agent-<hash of the image>`, version 1), created once. It
  needs only Python >= 3.8: the agent and its dependencies come as a code asset (aml_code: the
  workspace's default datastore, a blob upload, a code version named for its content, the job's
  `codeId`), uploaded once per workspace; the next experiment uploads nothing. An identity-based
  datastore is written with the user's own Azure AD token (needs Storage Blob Data Contributor).
- AML has no secret store a job can mount and shows the command in the studio: the agent's
  credential there is single-use (the hub accepts it once, then only that agent's session).
- Status: AML's JobStatus mapped so that a cancelled job ends (NNI left `Canceled` runs alive).

    trainingService:
      platform: aml
      subscriptionId: ...
      resourceGroup: ...
      workspaceName: ...
      computeTarget: gpu-cluster
      dockerImage: msranni/nni:latest   # needs Python >= 3.8 (the agent comes as a code asset)
      nniManagerIp: 20.1.2.3            # the compute cluster must reach nniManagerIp:hubPort
      # ours, other Azure clouds: the endpoint and the audience tokens are requested for
      # (`az cloud show --query "[endpoints.resourceManager, endpoints.activeDirectoryResourceId]"`);
      # the audience is derived for Azure China and US Government when only the endpoint is given
      resourceManagerEndpoint: https://management.chinacloudapi.cn
      resourceManagerAudience: https://management.core.chinacloudapi.cn/
      # ours: where this machine reaches the default datastore's blob service, when not at
      # https://{account}.blob.{endpoint} (a private endpoint's name, an emulator)
      blobEndpoint: https://myaccount.privatelink.blob.core.windows.net
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import ssl
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import quote, urlsplit

from nni_manager.backends import aml_code
from nni_manager.backends.agent_command import Sh
from nni_manager.backends.base import EnvironmentRequest
from nni_manager.backends.rest_jobs import (Job, JobView, RestClient, RestError, RestJobBackend, StateTable, agent_boot,
                                             literal_secret_lines, parse_watch_fields)
from nni_manager.config import ConfigError, ConfigSection, ExperimentConfig

if TYPE_CHECKING:
    from azure.core.credentials import AccessToken
    from azure.identity.aio import DefaultAzureCredential

log = logging.getLogger(__name__)

API_VERSION = "2024-04-01"  # a stable version documented for jobs, environments and computes
ARM = "https://management.azure.com"
# ARM endpoint host -> the audience its tokens are for (`az cloud show`: activeDirectoryResourceId)
CLOUD_AUDIENCES = {"management.azure.com": ARM,
                   "management.chinacloudapi.cn": "https://management.core.chinacloudapi.cn/",
                   "management.usgovcloudapi.net": "https://management.core.usgovcloudapi.net/"}
TOKEN_MARGIN = 300.0  # seconds before expires_on when a cached token is fetched anew
STATES = StateTable({"NotStarted": "waiting", "Starting": "waiting", "Provisioning": "waiting", "Preparing": "waiting",
          "Queued": "waiting", "Scheduled": "waiting", "Running": "running", "Finalizing": "running",
          "NotResponding": "running", "Completed": "succeeded", "Failed": "failed", "CancelRequested": "stopped",
          "Canceled": "stopped"})


@dataclass
class AmlConfig:
    subscription_id: str = ""
    resource_group: str = ""
    workspace_name: str = ""
    compute_target: str = ""
    docker_image: str = "msranni/nni:latest"
    endpoint: str = ARM
    audience: str = ARM
    poll_interval: float | None = None
    connect_timeout: float | None = None
    blob_endpoint: str | None = None


def parse_aml(ts: ConfigSection, config: ExperimentConfig) -> AmlConfig:
    out = AmlConfig()
    for attr, name in (("subscription_id", "subscriptionId"), ("resource_group", "resourceGroup"),
                       ("workspace_name", "workspaceName"), ("compute_target", "computeTarget")):
        setattr(out, attr, ts.str_(name, required=True))
    out.docker_image = ts.str_("dockerImage", "image") or out.docker_image
    endpoint = ts.str_("resourceManagerEndpoint")
    if endpoint is not None:
        if not endpoint.startswith("https://"):
            raise ConfigError(ts.at("resourceManagerEndpoint"), f"must be an https:// URL, got {endpoint!r}",
                              "e.g. https://management.chinacloudapi.cn for Azure China (default: Azure's global ARM)")
        out.endpoint = endpoint.rstrip("/")
    audience = ts.str_("resourceManagerAudience")
    if audience is not None and not audience.startswith("https://"):
        raise ConfigError(ts.at("resourceManagerAudience"), f"must be an https:// URL, got {audience!r}",
                          "your cloud's `az cloud show --query endpoints.activeDirectoryResourceId`")
    out.audience = audience or derive_audience(out.endpoint)
    reuse = ts.bool_("reuseMode")
    if reuse is False:
        raise ConfigError(ts.at("reuseMode"), "must be true on platform aml (AML runs a pool of environments)",
                          "remove reuseMode")
    blob = ts.str_("blobEndpoint")
    if blob is not None and not blob.startswith(("https://", "http://")):
        raise ConfigError(ts.at("blobEndpoint"), f"must be an http(s) URL, got {blob!r}",
                          "the blob service URL of the default datastore's account, e.g. "
                          "https://myaccount.blob.core.windows.net (default: from the datastore)")
    out.blob_endpoint = blob.rstrip("/") if blob else None
    out.poll_interval, out.connect_timeout = parse_watch_fields(ts)
    return out


def derive_audience(endpoint: str) -> str:
    """The token audience of a known cloud's ARM endpoint; Azure's global ARM for any other
    (Azure Stack and private clouds give resourceManagerAudience themselves)."""
    host = (urlsplit(endpoint).hostname or "").lower()
    return CLOUD_AUDIENCES.get(host, ARM)


def _arm_error_words(status: int, body: object) -> tuple[str, str]:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return str(err.get("code", "")), str(err.get("message", ""))[:500]
    return "", str(body or "").strip()[:300]


def _fix_for(status: int, code: str) -> str:
    if code == "InvalidAuthenticationTokenAudience":
        return ("set trainingService.resourceManagerAudience to this cloud's audience "
                "(`az cloud show --query endpoints.activeDirectoryResourceId`)")
    if status == 401:
        return "sign in again (az login) or check the service principal's credentials"
    if status == 403:
        return "give this identity a role that allows it on the workspace, e.g. AzureML Data Scientist"
    if code in ("SubscriptionNotFound", "ResourceGroupNotFound", "ResourceNotFound"):
        return "check subscriptionId, resourceGroup, workspaceName and computeTarget"
    return ""


class _CodeRef(TypedDict, total=False):
    codeId: str  # noqa: N815 - ARM's key


class AmlJobProperties(_CodeRef):
    """An ARM command job's `properties` (Jobs - Create Or Update, API_VERSION), as we fill them."""

    jobType: str  # noqa: N815
    command: str
    environmentId: str  # noqa: N815
    computeId: str  # noqa: N815
    experimentName: str  # noqa: N815
    displayName: str  # noqa: N815
    description: str
    resources: dict[str, int]
    environmentVariables: dict[str, str]  # noqa: N815
    tags: dict[str, str]


class AmlJobRequest(TypedDict):
    properties: AmlJobProperties


class AmlBackend(RestJobBackend[AmlConfig, AmlJobRequest]):
    platform = "aml"
    service = "AML"
    states = STATES
    single_use_credentials = True
    secret_words = RestJobBackend.LITERAL_SECRET_WORDS

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.client: RestClient | None = None
        self._credential: DefaultAzureCredential | None = None
        self._token: AccessToken | None = None  # (token, expires_on), cached
        self._token_lock = asyncio.Lock()
        self.studio: dict[str, str] = {}  # job name -> studio URL
        self.code: aml_code.CodeAsset | None = None  # the agent's code asset, once open() made sure of it

    options_type = AmlConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> AmlConfig:
        return parse_aml(section, config)

    @property
    def workspace(self) -> str:
        o = self.opts
        return (f"/subscriptions/{quote(o.subscription_id, safe='')}/resourceGroups/{quote(o.resource_group, safe='')}"
                f"/providers/Microsoft.MachineLearningServices/workspaces/{quote(o.workspace_name, safe='')}")

    @property
    def environment_id(self) -> str:
        digest = hashlib.sha256(self.opts.docker_image.encode()).hexdigest()[:12]
        return f"{self.workspace}/environments/nni-agent-{digest}/versions/1"

    # ------------------------------------------------------------------ client
    async def _auth(self) -> dict[str, str]:
        """The cached ARM token, fetched when there is none or it expires within TOKEN_MARGIN."""
        async with self._token_lock:
            if self._token is None or self._token.expires_on - TOKEN_MARGIN <= time.time():
                self._token = await self._fetch_token()
            return {"Authorization": f"Bearer {self._token.token}"}

    async def _fetch_token(self) -> AccessToken:
        scope = self.opts.audience.rstrip("/") + "/.default"
        assert self._credential is not None  # open() made it
        try:
            return await self._credential.get_token(scope)
        except Exception as e:  # azure-identity says which credentials it tried
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RestError(f"no Azure credential for {self.opts.audience}: {first} (sign in with `az login`, "
                            "set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, or run on a managed identity)") from e

    async def _drop_token(self, refused: str) -> None:
        """ARM refused the token (revoked, rotated, clock skew): the next request fetches one,
        unless another request has already replaced it."""
        async with self._token_lock:
            if self._token is not None and refused == f"Bearer {self._token.token}":
                self._token = None

    async def _call(self, method: str, path: str, **kw: Any) -> Any:  # ARM's answers, shaped per API
        assert self.client is not None
        reply = await self.client.request(method, self.workspace + path, params={"api-version": API_VERSION}, **kw)
        return reply.body

    async def open(self) -> None:
        from azure.identity.aio import DefaultAzureCredential

        self._credential = DefaultAzureCredential()
        # trust what requests/azure-core trust (REQUESTS_CA_BUNDLE), else the system's CAs
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
        context = ssl.create_default_context(cafile=bundle) if bundle else ssl.create_default_context()
        self.client = RestClient(self.opts.endpoint, self.service, auth=self._auth, error_words=_arm_error_words,
                                 fix_for=_fix_for, ssl=context, reauth=self._drop_token)
        o = self.opts
        # the credentials, the workspace and the compute, now: one clear line at start
        await self._call("GET", f"/computes/{quote(o.compute_target, safe='')}")
        await self._call("PUT", self.environment_id[len(self.workspace):], json={"properties": {
            "image": o.docker_image, "description": "nni-agent environments (nni-manager)"}})
        assert self.ctx is not None
        gather = partial(aml_code.gather, self.ctx.experiment_dir / "agent-wheel", self.config.agent_wheelhouse,
                         f"AML jobs of the image {o.docker_image}")
        self.code = await aml_code.ensure(self.client, self.workspace, API_VERSION, gather, o.blob_endpoint,
                                           identity=self._credential)
        if self.code is not None:
            c = self.code
            log.info("AML: the agent's code asset %s (%.1f MB, dependencies for %s; %s)", c.code_id.rsplit("/", 1)[-1],
                     c.size / 1e6, ", ".join(c.pythons) or "no Python",
                     f"uploaded {c.uploaded / 1e6:.1f} MB" if c.uploaded else "already in the workspace")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self._credential is not None:
            await self._credential.close()

    # ------------------------------------------------------------------ the job
    def job_request(self, env: EnvironmentRequest, name: str) -> AmlJobRequest:
        m = env.members[0]
        token_lines, ca_lines = literal_secret_lines(m.token, m.ca_certificate)
        command = agent_boot(hub_address=m.hub_address, agent_id=env.env_id, token_lines=token_lines,
                             tls=bool(m.ca_certificate), ca_lines=ca_lines, orphan_timeout=self.orphan_timeout,
                             single_trial=bool(env.trial_id), env=self.agent_env, image=self.opts.docker_image,
                             wheel=Sh(f'"$PWD/{self.code.agent_wheel}"') if self.code else "",
                             deps_dir=Sh('"$PWD/deps"') if self.code else "",
                             sha256=self.code.sha256 if self.code else ())
        code: _CodeRef = {"codeId": self.code.code_id} if self.code else {}
        return {"properties": {
            "jobType": "Command",
            "command": "\n".join(command),
            **code,
            "environmentId": self.environment_id,
            "computeId": f"{self.workspace}/computes/{self.opts.compute_target}",
            "experimentName": f"nni_exp_{self.experiment_id}",
            "displayName": name,
            "description": f"nni-agent environment {env.env_id} of NNI experiment {self.experiment_id}",
            "resources": {"instanceCount": 1},
            "environmentVariables": {},
            "tags": {"nni_experiment": self.experiment_id, self.tag_key: ""},
        }}

    def render_request(self, request: AmlJobRequest) -> str:
        return (f"# PUT {self.opts.endpoint}{self.environment_id}?api-version={API_VERSION}\n"
                + json.dumps({"properties": {"image": self.opts.docker_image}}, indent=2) + "\n"
                f"# PUT {self.opts.endpoint}{self.workspace}/jobs/<name>?api-version={API_VERSION}\n"
                "# (the agent's credential in the command is single-use: spent when the agent enrols; at start the\n"
                "# job also gets codeId, the agent's code asset in the default datastore, made once per workspace)\n"
                + json.dumps(request, indent=2))

    async def submit(self, job: Job, request: AmlJobRequest) -> None:
        # PUT is idempotent (201 created, then 200): safe to retry
        body = await self._call("PUT", f"/jobs/{quote(job.name, safe='')}", json=request)
        self._remember_studio(job.name, body)

    def _remember_studio(self, name: str, body: Any) -> None:
        endpoint = ((((body or {}).get("properties") or {}).get("services") or {}).get("Studio") or {}).get("endpoint")
        if endpoint:
            self.studio[name] = endpoint

    async def cancel(self, job: Job) -> None:
        # 202 with a Location to poll: the poll loop sees CancelRequested, then Canceled
        await self._call("POST", f"/jobs/{quote(job.name, safe='')}/cancel", retry=True, accept=(404,))

    def job_url(self, job: Job) -> str:
        return self.studio.get(job.name, "")

    @property
    def tag_key(self) -> str:
        """A tag key only this experiment's jobs carry: Jobs_List's `tag` filter takes a key."""
        return f"nni_exp_{self.experiment_id}"

    async def list_jobs(self) -> dict[str, JobView]:
        """Every live job of this experiment: Jobs_List filtered by its tag key, page by page. Read
        at start (re-attaching) and stop only (`list_once`): a poll looks at each tracked job
        (at most trialConcurrency of them) with `describe`, as the listing leaves ended jobs out."""
        out: dict[str, JobView] = {}
        path: str | None = f"{self.workspace}/jobs"
        params: dict[str, str] | None = {"api-version": API_VERSION, "listViewType": "ActiveOnly", "tag": self.tag_key}
        assert self.client is not None
        while path:
            reply = await self.client.request("GET", path, params=params)
            for item in (reply.body or {}).get("value", []):
                if str(item.get("name", "")).startswith(self.prefix):
                    out[item["name"]] = self._view(item)
            path, params = self._next_page((reply.body or {}).get("nextLink")), None
        return out

    list_once = True

    async def describe(self, job: Job) -> JobView | None:
        try:
            return self._view(await self._call("GET", f"/jobs/{quote(job.name, safe='')}"))
        except RestError as e:
            if e.status != 404:
                raise
            return None

    def _next_page(self, link: object) -> str | None:
        """ARM's nextLink, followed as given (it carries its own query) when it names the
        endpoint's host: the token is never sent elsewhere."""
        if not link:
            return None
        mine, theirs = urlsplit(self.opts.endpoint), urlsplit(str(link))
        if (theirs.scheme.lower(), theirs.hostname, theirs.port or 443) != \
                (mine.scheme.lower(), mine.hostname, mine.port or 443):
            log.warning("AML: not following a job listing's nextLink to another host (%s): the listing may be "
                        "incomplete", theirs.hostname)
            return None
        return str(link)

    def _view(self, item: dict[str, Any]) -> JobView:
        name = str(item.get("name"))
        self._remember_studio(name, item)
        props = item.get("properties") or {}
        status = str(props.get("status") or "Unknown")
        phase = self.states.phase(status)
        if phase == "stopped":
            words = f"AML job {name} was {status} outside this experiment (by a user or an administrator)"
        else:
            words = f"AML job {name} is {status} on compute {self.opts.compute_target}"
        if phase == "failed":  # JobBase has no error field: the reason is in the studio
            where = self.studio.get(name)
            words += ("; AML gives the reason on the job's page in the studio (Overview, and Outputs + logs: "
                      f"user_logs/std_log.txt): {where}" if where else "; see the job in Azure ML studio")
        return JobView(name, phase, words, settled=status not in ("CancelRequested", "Finalizing"))
