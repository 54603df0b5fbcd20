"""The agent and its dependencies reach a bare-Python AML image as a code asset (issue 19, item 3).

The emulator's workspace has a default AzureBlob datastore whose account is Azurite (Microsoft's
Azure Storage emulator, the real blob protocol): the manager reads the datastore, lists its
secrets (an account key, or a SAS token), uploads the agent wheel and the dependency wheels with
azure-storage-blob, creates a code version and names it in each job's `codeId`; the emulator
downloads that version's blobs into the job's working directory as AML's runtime does. The image
`python:3.11-slim` is the system Python alone. A second experiment finds the version and uploads
nothing. The storage credential is never in a job, a command, the manager's files or its log.
"""
from __future__ import annotations

import datetime as dt
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends import agent_deps
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support import trial_isolation
from tests.support.aml.datastore import code_asset_aml, new_container
from tests.support.aml.experiments import base, config_dict, ours, run  # noqa: F401 (base: a fixture)
from tests.support.images import SLIM_IMAGE
from tests.support.manager.helpers import form, wait_status
from tests.support.storage.fixtures import AZURITE_ACCOUNT, AZURITE_KEY, azurite, azurite_oauth  # noqa: F401 (fixtures)

T = 90.0
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"  # scripts/test.sh fills it


def _blobs(endpoint: str, container: str) -> dict[str, str]:
    """name -> etag of every blob in the container."""
    from azure.storage.blob import ContainerClient

    with ContainerClient(endpoint, container, credential={"account_name": AZURITE_ACCOUNT,
                                                          "account_key": AZURITE_KEY}) as cc:
        return {b.name: b.etag for b in cc.list_blobs()}


def _sas(container: str) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    return generate_container_sas(AZURITE_ACCOUNT, container, account_key=AZURITE_KEY,
                                  permission=ContainerSasPermissions(read=True, write=True, create=True, list=True),
                                  expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))


def _kinds(aml: Any) -> list[str]:
    return [r.get("kind") or "" for r in aml.requests()]


@pytest.mark.parametrize("secrets", ["AccountKey", "Sas"])
def test_bare_image_runs_trials_from_a_code_asset_uploaded_once(aml_factory, azurite, base: Path,  # noqa: F811
                                                                 monkeypatch, caplog, secrets: str) -> None:
    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))  # this test's own cache
    container = new_container(azurite)
    secret = AZURITE_KEY if secrets == "AccountKey" else _sas(container)
    aml = aml_factory(datastore={"name": "workspaceblobstore", "accountName": AZURITE_ACCOUNT,
                                 "containerName": container, "blobEndpoint": azurite, "secretsType": secrets,
                                 "key": AZURITE_KEY if secrets == "AccountKey" else "",
                                 "sasToken": secret if secrets == "Sas" else ""})
    from tests.support.aml.fixtures import AZURE_IDENTITY_VARS
    for var in AZURE_IDENTITY_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in aml.env().items():
        monkeypatch.setenv(k, v)
    cfg = load_config({**config_dict(aml, base, dockerImage=SLIM_IMAGE, blobEndpoint=azurite),
                       "agentWheelhouse": str(WHEELHOUSE)})
    caplog.set_level(logging.DEBUG)

    async def experiment() -> str:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(3)]
            for t in trials:
                d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
                assert d.status.value == "SUCCEEDED", d.message
            return ts.experiment_id

    first = run(experiment())
    blobs = _blobs(azurite, container)
    names = sorted(blobs)
    assert any(n.endswith("-py3-none-any.whl") and "/nni_agent-" in n for n in names), names
    assert any("/deps/cp311/grpcio-" in n for n in names), names  # the image's Python's directory
    folder = names[0].split("/nni-agent/")[0]
    assert folder.startswith("LocalUpload/") and all(n.startswith(folder + "/nni-agent/") for n in names), names
    jobs = ours(aml, first)
    code_ids = {aml.job(j["name"])["codeId"] for j in jobs}
    assert len(code_ids) == 1 and next(iter(code_ids)).endswith(f"/codes/nni-agent/versions/{folder.split('/')[1]}")
    kinds = _kinds(aml)
    assert kinds.count("datastores.listSecrets") == 1 and kinds.count("codes.versions.put") == 1, kinds

    second = run(experiment())  # the same agent and wheels: the version exists, nothing is uploaded
    assert _blobs(azurite, container) == blobs  # its files were read back (listed: etags as recorded), not written
    kinds = _kinds(aml)
    # the credential again: a version is trusted only once its folder is checked (tests/security/test_shipped_code.py)
    assert kinds.count("datastores.listSecrets") == 2 and kinds.count("codes.versions.put") == 1, kinds
    assert kinds.count("codes.versions.get") == 2, kinds

    # the storage credential is nowhere: not in jobs (commands, variables), the manager's files or its log
    for j in ours(aml, first) + ours(aml, second):
        view = aml.job(j["name"])
        assert secret not in str(view), j["name"]
        for d in view["taskDirs"]:
            for f in Path(d).parent.rglob("*"):
                if f.is_file() and f.suffix != ".whl" and "work" not in f.parts:
                    assert secret.encode() not in f.read_bytes(), f
    for f in (base / "exps").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert secret not in caplog.text


def test_trials_import_the_images_old_protobuf_while_the_agent_runs_with_its_shipped_one(
        aml_factory, azurite, base: Path, monkeypatch) -> None:  # noqa: F811
    """The image's Python has protobuf 3.19 (on its PYTHONPATH, `agentEnv`) and nothing else: the
    agent runs with the protobuf of the code asset; the trial (the image's Python, an old-style
    `_pb2` module) sees none of the agent's path and SUCCEEDS (tests/support/trial_isolation.py)."""
    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    old = trial_isolation.old_protobuf()
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))
    aml = code_asset_aml(aml_factory, azurite, monkeypatch)
    trial = trial_isolation.write_trial(base / "isolation-code")
    cfg = load_config({**config_dict(aml, base, dockerImage=SLIM_IMAGE, blobEndpoint=azurite,
                                     agentEnv={"PYTHONPATH": str(old)}),
                       "agentWheelhouse": str(WHEELHOUSE), "trialCodeDirectory": str(base / "isolation-code"),
                       "trialCommand": f"python3 {trial}"})

    async def experiment() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
            assert d.status.value == "SUCCEEDED", d.message

    run(experiment())


def test_a_job_naming_an_unknown_code_version_is_refused_as_aml_refuses_it(aml, base: Path) -> None:
    import ssl
    import urllib.error
    import json
    import urllib.request

    from azure.identity import DefaultAzureCredential

    token = DefaultAzureCredential().get_token("https://management.azure.com/.default").token
    ctx = ssl.create_default_context(cafile=aml.ca_file)

    def put(path: str, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(f"{aml.url}{aml.workspace_path}{path}?api-version=2024-04-01", method="PUT",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    env = f"{aml.workspace_path}/environments/e/versions/1"
    assert put("/environments/e/versions/1", {"properties": {"image": "msranni/nni:latest"}})[0] == 201
    code_id = f"{aml.workspace_path}/codes/nni-agent/versions/0123"
    status, body = put("/jobs/j1", {"properties": {"jobType": "Command", "command": "true", "environmentId": env,
                                                   "codeId": code_id}})
    assert status == 404 and body["error"]["code"] == "UserError", body
    assert body["error"]["message"] == f"Could not find asset with ID: {code_id}", body
    status, body = put("/codes/nni-agent/versions/0123", {"properties": {}})
    assert status == 400 and "CodeUri" in body["error"]["message"], body



def test_default_image_runs_nni_trial_code_from_the_code_asset(aml_factory, azurite, base: Path,  # noqa: F811
                                                               monkeypatch) -> None:
    """NNI's default image as it really is (Python 3.8 and `nni`, no grpcio or protobuf;
    tests/support/nni_image.py): the code asset's cp38 directory lets unmodified NNI trial code run."""
    from tests.support.aml.fixtures import AZURE_IDENTITY_VARS
    from tests.support.nni_image import PY38_FINAL, PY38_TRIAL, cp38_wheelhouse, final_results, nni_latest_bin

    image_bin, why = nni_latest_bin()
    if image_bin is None:
        pytest.skip(why)
    wheelhouse, why = cp38_wheelhouse()
    if wheelhouse is None:
        pytest.skip(why)
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))  # this test's own cache
    container = new_container(azurite)
    aml = aml_factory(images={"msranni/nni:latest": image_bin},
                      datastore={"name": "workspaceblobstore", "accountName": AZURITE_ACCOUNT,
                                 "containerName": container, "blobEndpoint": azurite, "secretsType": "AccountKey",
                                 "key": AZURITE_KEY, "sasToken": ""})
    for var in AZURE_IDENTITY_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in aml.env().items():
        monkeypatch.setenv(k, v)
    code = base / "nni-code"
    code.mkdir()
    (code / "mnist.py").write_text(PY38_TRIAL)
    cfg = load_config({**config_dict(aml, base, dockerImage="msranni/nni:latest", blobEndpoint=azurite),
                       "trialCommand": "python3 mnist.py", "trialCodeDirectory": str(code),
                       "agentWheelhouse": str(wheelhouse)})
    metrics: list[str] = []

    async def experiment() -> tuple[str, str]:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics.append(m.data))
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
            return d.status.value, d.message

    status, message = run(experiment())
    assert status == "SUCCEEDED", message
    names = sorted(_blobs(azurite, container))
    assert any("/deps/cp38/grpcio-" in n for n in names), names
    assert final_results(metrics) == [PY38_FINAL], metrics


def _identity_aml(aml_factory, azurite_oauth, monkeypatch, roles: list[str]) -> tuple[Any, str]:  # noqa: F811
    """An AML emulator whose default datastore is identity-based (credentialsType None) over an
    HTTPS Azurite with OAuth; the test logged in as 'default' with `roles`. The manager trusts
    both the emulator's CA (ARM, the storage front) and Azurite's (REQUESTS_CA_BUNDLE)."""
    from tests.support.aml.fixtures import AZURE_IDENTITY_VARS

    container = _container_tls(azurite_oauth)
    aml = aml_factory(principals={"default": roles},
                      datastore={"name": "workspaceblobstore", "accountName": AZURITE_ACCOUNT,
                                 "containerName": container, "blobEndpoint": azurite_oauth.endpoint,
                                 "blobCaFile": azurite_oauth.ca_file, "secretsType": "None", "key": AZURITE_KEY})
    for var in AZURE_IDENTITY_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in aml.env().items():
        monkeypatch.setenv(k, v)
    return aml, container


def _container_tls(az: Any) -> str:
    from azure.storage.blob import BlobServiceClient

    name = f"azureml-blobstore-{uuid.uuid4()}"
    BlobServiceClient(az.endpoint, credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY},
                      connection_verify=az.ca_file).create_container(name)
    return name


def _blobs_tls(az: Any, container: str) -> dict[str, str]:
    from azure.storage.blob import ContainerClient

    with ContainerClient(az.endpoint, container, credential={"account_name": AZURITE_ACCOUNT,
                                                             "account_key": AZURITE_KEY},
                         connection_verify=az.ca_file) as cc:
        return {b.name: b.etag for b in cc.list_blobs()}


def test_identity_based_datastore_gets_the_code_asset_with_the_users_own_token(
        aml_factory, azurite_oauth, base: Path, monkeypatch, caplog) -> None:  # noqa: F811
    """No secrets to list: the upload carries the user's Azure AD token (audience
    https://storage.azure.com), which Azurite (OAuth) and the emulated role check accept; a bare
    image runs trials from it; a second experiment finds the version and uploads nothing."""
    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))
    aml, container = _identity_aml(aml_factory, azurite_oauth, monkeypatch,
                                   ["Contributor", "Storage Blob Data Contributor"])
    bundle = base / "cas.pem"
    bundle.write_text(Path(aml.ca_file).read_text() + Path(azurite_oauth.ca_file).read_text())
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    cfg = load_config({**config_dict(aml, base, dockerImage=SLIM_IMAGE, blobEndpoint=aml.storage_front),
                       "agentWheelhouse": str(WHEELHOUSE)})
    caplog.set_level(logging.DEBUG)

    async def experiment() -> str:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(2)]
            for t in trials:
                d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
                assert d.status.value == "SUCCEEDED", d.message
            return ts.experiment_id

    first = run(experiment())
    blobs = _blobs_tls(azurite_oauth, container)
    names = sorted(blobs)
    assert any("/nni_agent-" in n for n in names) and any("/deps/cp311/grpcio-" in n for n in names), names
    assert all(n.startswith("LocalUpload/") for n in names), names
    assert {aml.job(j["name"])["codeId"] for j in ours(aml, first)} == {
        f"{aml.workspace_path}/codes/nni-agent/versions/{names[0].split('/')[1]}"}
    kinds = _kinds(aml)
    assert "datastores.listSecrets" not in kinds and kinds.count("codes.versions.put") == 1, kinds
    assert "get-access-token https://storage.azure.com" in aml.az_invocations(), aml.az_invocations()

    run(experiment())  # the version exists: no upload; a storage token to check its folder
    assert _blobs_tls(azurite_oauth, container) == blobs
    kinds = _kinds(aml)
    assert kinds.count("codes.versions.put") == 1 and kinds.count("codes.versions.get") == 2, kinds
    assert aml.az_invocations().count("get-access-token https://storage.azure.com") == 2, aml.az_invocations()


def test_identity_without_a_storage_data_role_gets_one_line_naming_the_role(
        aml_factory, azurite_oauth, base: Path, monkeypatch) -> None:  # noqa: F811
    from nni_manager.backends.rest_jobs import RestError

    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))
    aml, container = _identity_aml(aml_factory, azurite_oauth, monkeypatch, ["Contributor"])
    bundle = base / "cas.pem"
    bundle.write_text(Path(aml.ca_file).read_text() + Path(azurite_oauth.ca_file).read_text())
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    cfg = load_config({**config_dict(aml, base, dockerImage=SLIM_IMAGE, blobEndpoint=aml.storage_front),
                       "agentWheelhouse": str(WHEELHOUSE)})

    async def experiment() -> None:
        async with create_training_service(cfg):
            pass

    with pytest.raises(RestError) as err:
        run(experiment())
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text, text
    assert '"Storage Blob Data Contributor"' in text and AZURITE_ACCOUNT in text, text
    assert "az role assignment create" in text and "AuthorizationPermissionMismatch" in text, text
    assert _blobs_tls(azurite_oauth, container) == {}
    assert [j for j in aml.requests() if j.get("kind") == "jobs.put"] == []
    assert "codes.versions.put" not in _kinds(aml)

    aml.set_roles("default", ["Contributor", "Storage Blob Data Contributor"])  # the fix the line names
    run(experiment())
    assert _blobs_tls(azurite_oauth, container), "granted the role, the upload goes through"
    assert _kinds(aml).count("codes.versions.put") == 1


def test_identity_datastore_storage_checks_token_audience_signature_and_role(
        aml_factory, azurite_oauth, base: Path, monkeypatch) -> None:  # noqa: F811
    """What the manager's upload relies on is checked, not waved through: Azurite (OAuth) refuses a
    token for another audience, the storage front one this directory did not sign and a principal
    without a Storage Blob Data role; listSecrets has nothing for an identity-based datastore."""
    import json
    import ssl
    import time
    import urllib.error
    import urllib.request

    from azure.core.credentials import AccessToken
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
    from azure.storage.blob import ContainerClient

    from tests.support.aml.emulator.tokens import mint

    aml, container = _identity_aml(aml_factory, azurite_oauth, monkeypatch, ["Contributor"])

    class Static:
        def __init__(self, token: str) -> None:
            self.token = token

        def get_token(self, *scopes: str, **kw: Any) -> AccessToken:
            return AccessToken(self.token, int(time.time()) + 3600)

    def upload(token: str, direct: bool = False) -> None:
        with ContainerClient(azurite_oauth.endpoint if direct else aml.storage_front, container,
                             credential=Static(token), connection_verify=azurite_oauth.ca_file if direct
                             else aml.ca_file) as cc:
            cc.upload_blob("probe", b"x", overwrite=True)

    arm_token = aml.mint_token(audience="https://management.azure.com")
    for direct in (True, False):  # Azurite itself, then the front: the audience is ARM's, not storage's
        with pytest.raises(ClientAuthenticationError) as err:
            upload(arm_token, direct)
        assert err.value.error_code == "AuthenticationFailed", err.value
    forged = mint(b"another directory's key", audience="https://storage.azure.com", tenant=aml.tenant_id,
                  oid=aml.principal_oid(), upn="default@contoso.example")[0]
    with pytest.raises(ClientAuthenticationError) as err:  # the front: not signed by this directory
        upload(forged)
    assert err.value.error_code == "InvalidAuthenticationInfo", err.value
    with pytest.raises(HttpResponseError) as err:  # the front: no Storage Blob Data role
        upload(aml.mint_token(audience="https://storage.azure.com"))
    assert err.value.status_code == 403 and err.value.error_code == "AuthorizationPermissionMismatch", err.value
    aml.set_roles("default", ["Contributor", "Storage Blob Data Contributor"])
    upload(aml.mint_token(audience="https://storage.azure.com"))
    assert list(_blobs_tls(azurite_oauth, container)) == ["probe"]

    token = aml.mint_token(audience="https://management.azure.com")
    req = urllib.request.Request(f"{aml.url}{aml.workspace_path}/datastores/workspaceblobstore/listSecrets"
                                 "?api-version=2024-04-01", method="POST", data=b"{}",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, context=ssl.create_default_context(cafile=aml.ca_file), timeout=30)
    assert http.value.code == 400 and "None" in json.loads(http.value.read())["error"]["message"]
    req = urllib.request.Request(f"{aml.url}{aml.workspace_path}/datastores?api-version=2024-04-01&isDefault=true",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=aml.ca_file), timeout=30) as r:
        store = json.loads(r.read())["value"][0]["properties"]
    assert store["credentials"] == {"credentialsType": "None"} and store["datastoreType"] == "AzureBlob", store
