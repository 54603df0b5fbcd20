"""Fixtures `aml` and `aml_factory`: an Azure ML (ARM) emulator in its own process, over HTTPS.

Credentials come from azure-identity, never a hand-made header: the fixture writes an `az`
stand-in (tests/support/aml/emulator/az_cli.py) and an Azure CLI "login" (AZURE_CONFIG_DIR), puts it
first on PATH and sets AZURE_TOKEN_CREDENTIALS=AzureCliCredential, so DefaultAzureCredential
is only the CLI credential: no managed identity (IMDS, 169.254.169.254), no network at all.
`aml` applies that environment to the test (monkeypatch); `aml.env()` gives it for subprocesses.
See tests/support/aml/emulator/README.md.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support.emulators import RestControls, emulator_factory, start_emulator_process
from tests.support.images import SLIM_IMAGE, slim_python_dir

from tests.support.aml.emulator.tokens import mint

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = str(Path(sys.executable).parent)
MARK = "AML_EMULATOR"
# variables that would let azure-identity pick another credential or identity
AZURE_IDENTITY_VARS = ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_CLIENT_CERTIFICATE_PATH",
                       "AZURE_USERNAME", "AZURE_PASSWORD", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_AUTHORITY_HOST",
                       "IDENTITY_ENDPOINT", "IDENTITY_HEADER", "MSI_ENDPOINT", "MSI_SECRET", "IMDS_ENDPOINT")





class Aml(RestControls):
    """A running emulator: ids of its workspace, its URL and CA, credentials and test controls."""

    marker = MARK
    job_key = "name"

    def __init__(self, state: Path, proc: subprocess.Popen, cfg: dict):
        self.state, self.proc, self.cfg = state, proc, cfg
        self.instance: str = cfg["instance"]
        self.subscription_id: str = cfg["subscription"]
        self.resource_group: str = cfg["resourceGroup"]
        self.workspace_name: str = cfg["workspace"]
        self.tenant_id: str = cfg["tenant"]
        self.compute: str = cfg["computes"][0]["name"]
        self.port = int((state / "port").read_text())
        self.url = f"https://127.0.0.1:{self.port}"          # the resourceManagerEndpoint override
        self.ca_file = str(state / "ca.crt")
        self.az_bin = str(state / "az" / "bin")
        self._ssl = ssl.create_default_context(cafile=self.ca_file)

    @property
    def workspace_path(self) -> str:
        return (f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}/providers/"
                f"Microsoft.MachineLearningServices/workspaces/{self.workspace_name}")

    def aml_config(self, **overrides) -> dict:
        """NNI's v2 `trainingService` for this workspace, with our endpoint override."""
        return {"platform": "aml", "subscriptionId": self.subscription_id, "resourceGroup": self.resource_group,
                "workspaceName": self.workspace_name, "computeTarget": self.compute,
                "dockerImage": "msranni/nni:latest", "resourceManagerEndpoint": self.url, **overrides}

    @property
    def storage_front(self) -> str:
        """An identity-based datastore's account as the manager reaches it (its blobEndpoint): the
        emulated storage authorization (emulator/storage_front.py) in front of Azurite, same CA."""
        port = int((self.state / "storage-front-port").read_text())
        return f"https://127.0.0.1:{port}/{self.cfg['datastore']['accountName']}"

    # ------------------------------------------------------------ credentials
    def config_dir(self, principal: str = "default") -> str:
        return str(self.state / "az" / "profiles" / principal)

    def env(self, principal: str = "default") -> dict[str, str]:
        """Environment changes for a process that should log in as `principal` through azure-identity
        (values to set; the AZURE_* identity variables listed in AZURE_IDENTITY_VARS must be unset)."""
        return {"PATH": self.az_bin + os.pathsep + os.environ.get("PATH", ""),
                "AZURE_CONFIG_DIR": self.config_dir(principal), "AZURE_TOKEN_CREDENTIALS": "AzureCliCredential",
                "REQUESTS_CA_BUNDLE": self.ca_file}

    def credential(self):
        """DefaultAzureCredential as the manager builds it (call under `aml`'s environment)."""
        from azure.identity import DefaultAzureCredential
        return DefaultAzureCredential()

    def mint_token(self, principal: str = "default", *, audience: str = "https://management.azure.com",
                   lifetime: float = 3600.0, tenant: str | None = None) -> str:
        """A raw token for negative tests only (expired, wrong audience or tenant)."""
        p = self.cfg["principals_by_name"][principal]
        return mint((self.state / "token-signing.key").read_bytes(), audience=audience,
                    tenant=tenant or self.tenant_id, oid=p["oid"], upn=p["upn"], lifetime=lifetime)[0]

    def principal_oid(self, principal: str = "default") -> str:
        return self.cfg["principals_by_name"][principal]["oid"]

    def set_roles(self, principal: str, roles: list[str]) -> None:
        self._call("PUT", f"principals/{self.principal_oid(principal)}", {"roles": roles})

    # ------------------------------------------------------------ controls
    def _call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(f"{self.url}/_emulator/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self._ssl, timeout=30) as r:
            return json.loads(r.read())

    def api_versions(self) -> dict[str, list[str]]:
        """Operation kind (e.g. 'jobs.put') -> the api-versions received for it."""
        return self._call("GET", "api-versions")

    def hold(self, status: str | None) -> None:
        """Jobs stop advancing when they reach `status` (None releases them)."""
        self._call("POST", "hold", {"status": status})

    def step(self, seconds: float) -> None:
        self._call("POST", "step", {"seconds": seconds})

    def kill_task(self, name: str, sig: int = signal.SIGKILL) -> None:
        self._call("POST", f"jobs/{name}/kill-task", {"signal": int(sig)})

    def az_invocations(self) -> list[str]:
        """One line per `az account get-access-token` run so far (its resource)."""
        log = self.state / "az" / "invocations.log"
        return log.read_text().splitlines() if log.exists() else []

    def revoke_tokens(self) -> None:
        """Every token issued so far is refused from now on with 401 (as ARM refuses a revoked one)."""
        self._call("POST", "revoke-tokens", {})



def _write_az(state: Path, key_file: Path, cfg: dict) -> None:
    """The az stand-in and one CLI login (profile) per principal."""
    bin_dir = state / "az" / "bin"
    bin_dir.mkdir(parents=True)
    az = bin_dir / "az"
    az.write_text(f"#!/bin/sh\nPYTHONPATH='{ROOT}' exec '{sys.executable}' -m tests.support.aml.emulator.az_cli \"$@\"\n")
    os.chmod(az, 0o755)
    for name, p in cfg["principals_by_name"].items():
        d = state / "az" / "profiles" / name
        d.mkdir(parents=True)
        prof = d / "emulator_profile.json"
        prof.write_text(json.dumps({"tenant": cfg["tenant"], "subscription": cfg["subscription"], "oid": p["oid"],
                                    "upn": p["upn"], "key_file": str(key_file), "lifetime": p.get("lifetime", 3600),
                                    "delay": cfg["azDelay"], "log_file": str(state / "az" / "invocations.log")}))
        os.chmod(prof, 0o600)


def start_aml(base: Path, *, principals: dict[str, list[str]] | None = None, computes: list[dict] | None = None,
              images: dict[str, str] | None = None, step: float = 0.05, hold: str | None = None,
              retry_after: int = 1, page_size: int = 20, audiences: list[str] | None = None,
              az_delay: float = 1.0, datastore: dict | None = None) -> Aml:
    """principals: name -> built-in roles on the workspace (default {'default': ['Contributor'],
    'reader': ['Reader'], 'norole': []}); images: image -> bin dir first on PATH ('*' = any);
    az_delay: seconds each `az account get-access-token` takes (the real one: about a second);
    datastore: the default AzureBlob datastore (emulator/assets.py `Datastore`: accountName,
    containerName, key or sasToken, blobEndpoint where Azurite listens; secretsType None: identity-based,
    with blobCaFile for Azurite's HTTPS and `storage_front` the URL the manager uses); none: the workspace has none.
    A principal's roles may include "Storage Blob Data Contributor" (the storage front checks it)."""
    state = base / f"aml-{secrets.token_hex(3)}"
    state.mkdir(parents=True)
    key_file = state / "token-signing.key"
    key_file.write_bytes(secrets.token_bytes(32))
    os.chmod(key_file, 0o600)
    principals = principals if principals is not None else {
        "default": ["Contributor"], "reader": ["Reader"], "norole": []}
    by_name = {n: {"oid": str(uuid.uuid4()), "upn": f"{n}@contoso.example", "roles": r} for n, r in principals.items()}
    cfg = {"instance": secrets.token_hex(8), "subscription": str(uuid.uuid4()), "resourceGroup": "nni-rg",
           "workspace": "nni-ws", "region": "eastus", "tenant": str(uuid.uuid4()),
           "computes": computes or [{"name": "cpu-cluster", "vmSize": "STANDARD_DS3_V2", "maxNodes": 4}],
           "images": images if images is not None else {
               "msranni/nni:latest": VENV_BIN, "msranni/nni": VENV_BIN, "nni-test/python:3.11": VENV_BIN,
               "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04": VENV_BIN,
               SLIM_IMAGE: slim_python_dir(state)},
           "step": step, "hold": hold, "azDelay": az_delay, "retryAfter": retry_after, "pageSize": page_size,
           "audiences": audiences, "datastore": datastore, "principals": {p["oid"]: {"roles": p["roles"], "upn": p["upn"]}
                                                  for p in by_name.values()},
           "principals_by_name": by_name}
    (state / "config.json").write_text(json.dumps(cfg))
    _write_az(state, key_file, cfg)
    proc = start_emulator_process("tests.support.aml.emulator", state, [], what="AML emulator",
                                  drop_env=(MARK, *AZURE_IDENTITY_VARS))
    return Aml(state, proc, cfg)


@pytest.fixture
def aml_factory():
    with emulator_factory("aml-emu-", start_aml, "the AML emulator") as make:
        yield make


@pytest.fixture
def aml(aml_factory, monkeypatch) -> Aml:
    """An emulator, with this test's environment logged in as its 'default' principal (Contributor)."""
    return logged_in(aml_factory(), monkeypatch)


@pytest.fixture(scope="session")
def aml_shared():
    """One emulator (default options) for the session, for tests that find their jobs by their
    experiment and read no emulator-wide record (requests, every job): `aml_in_shared`."""
    with emulator_factory("aml-emu-", start_aml, "the AML emulator") as make:
        yield make()


@pytest.fixture
def aml_in_shared(aml_shared, monkeypatch):
    """`aml_shared`, logged in as `aml` is; afterwards its faults and hold are undone, and the test
    must leave no job process running (as a private one's stop checks)."""
    yield logged_in(aml_shared, monkeypatch)
    aml_shared.clear_faults()
    aml_shared.hold(None)
    aml_shared.wait_for(lambda: not aml_shared.live_pids(), 60, what="no job process left by this test")


def logged_in(a: Aml, monkeypatch: pytest.MonkeyPatch) -> Aml:
    """This test's environment logged in (the Azure CLI's) as `a`'s 'default' principal (Contributor)."""
    for var in AZURE_IDENTITY_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in a.env().items():
        monkeypatch.setenv(k, v)
    return a
