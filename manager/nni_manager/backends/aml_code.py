"""AML: the agent and its dependencies as a code asset (the v2 flow), so a job's image needs only Python.

A command job that names a code version (`codeId`) starts in a working directory holding that
version's files: AML's runtime downloads them from the workspace's datastore. The manager puts
there the agent wheel and the dependency wheels (grpcio, protobuf, psutil, ...), and the boot
step unpacks them into the job's private directory:

1. the files and their content hash: the version's name, so equal content is one version;
2. the default datastore (`GET datastores?isDefault=true`, an AzureBlob container); without
   one, no code asset (the image must then carry the agent: a warning says so);
3. the datastore's credentials (`POST datastores/{name}/listSecrets`: an account key or a SAS token, kept in
   memory only, never logged or put in a job); the folder `LocalUpload/{hash}/nni-agent/` (as the AML SDK
   uploads code) is read back and compared with our files, and what is missing or different is uploaded
   with azure-storage-blob (`_sync`): an earlier experiment's files are reused, never trusted by name;
4. `GET codes/nni-agent/versions/{hash}`: there and naming that folder, it is used; naming another (made
   first by someone else: the hash is computable), refused in one console line, and ours is made as
   `{hash}-2`, ...; else `PUT codes/nni-agent/versions/{hash}` with that folder's `codeUri`;
5. an identity-based datastore (`credentials.credentialsType: None`, as in a workspace created
   with `systemDatastoresAuthMode: identity`) has no secrets to list: the files are uploaded with
   the user's own Azure AD identity (the manager's DefaultAzureCredential, token audience
   https://storage.azure.com), as the AML SDK does. Storage then checks the data-plane role: a
   403 fails the experiment at start with one line naming the role (Storage Blob Data
   Contributor), the account and the `az role assignment create` that fixes it, since a bare
   image would otherwise fail every trial later with a less direct line.

Which Python the image has, the manager cannot know before a job runs: AML has no channel cheaper
than a job (a probe job costs a node allocation, minutes, and its answer comes back only through
run logs), and asking users for the image's Python version is one more field to get wrong. So the
asset holds wheels for every CPython the agent supports that the sources provide (the cache,
`agentWheelhouse`, one `pip download` each: agent_deps.resolve_for_pythons), in `deps/cpXY/`, and
the job's shell picks its own Python's directory. That is uploaded once per workspace and content;
each job then downloads a few tens of MB from storage in its own region. An image whose Python no
source covered ends with the boot step's one line naming what is missing.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import quote

from nni_manager import notices
from nni_manager.backends import agent_deps
from nni_manager.backends.agent_wheel import build_agent_wheel
from nni_manager.backends.rest_jobs import RestClient, RestError

if TYPE_CHECKING:
    from azure.core.credentials import AzureSasCredential
    from azure.core.credentials_async import AsyncTokenCredential

# what the blob client takes: an account key (name and key), a SAS, or the user's identity
BlobCredential = Union[dict[str, str], "AzureSasCredential", "AsyncTokenCredential"]

log = logging.getLogger(__name__)

CODE_NAME = "nni-agent"
UPLOAD_ROOT = "LocalUpload"  # where the AML SDK puts code it uploads


@dataclass(frozen=True)
class CodeFiles:
    """What the code asset holds: (name in the asset, local file) pairs, and their content hash."""

    files: tuple[tuple[str, Path], ...]
    digest: str  # the code version
    agent_wheel: str  # the agent wheel's name in the asset

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for _, p in self.files)

    @property
    def pythons(self) -> list[str]:
        return sorted({n.split("/")[1] for n, _ in self.files if n.startswith("deps/")})

    def sha256(self) -> tuple[tuple[str, str], ...]:
        """The job command's `--sha256`: the agent wheel by its name, each dependency wheel as
        `cp311/<wheel>` (the boot step takes its own Python's). A code version is looked up by
        name; what runs is checked by these digests, so a version someone else made is refused."""
        out = []
        for name, path in self.files:
            key = name[len("deps/"):].rsplit(".", 1)[0] if name.startswith("deps/") else name
            out.append((key, agent_deps.sha256_file(path)))
        return tuple(out)


def gather(wheel_dir: Path, wheelhouse: Path | None, where: str = "") -> CodeFiles:
    """The agent wheel and the dependency wheels for each CPython (blocking: builds, resolves, hashes);
    none for any: said on the console (`where`: the jobs' image)."""
    wheel = build_agent_wheel(wheel_dir)
    files = [(wheel.path.name, wheel.path)]
    files += [(f"deps/{rel}", f) for rel, f in agent_deps.per_python_layout(agent_deps.resolve_for_pythons(wheelhouse, where=where))]
    content = hashlib.sha256()
    for name, path in files:
        content.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return CodeFiles(tuple(files), content.hexdigest()[:32], wheel.path.name)


@dataclass(frozen=True)
class CodeAsset:
    code_id: str  # the code version's ARM id, the job's codeId
    agent_wheel: str
    pythons: tuple[str, ...]  # cp311, ...: the Pythons it has dependencies for
    uploaded: int  # bytes uploaded now (0: an earlier experiment did)
    size: int
    sha256: tuple[tuple[str, str], ...] = ()  # what the job's boot step checks (CodeFiles.sha256)


async def ensure(client: RestClient, workspace: str, api_version: str, gather_files: Callable[[], CodeFiles],
                 blob_endpoint: str | None = None, identity: AsyncTokenCredential | None = None) -> CodeAsset | None:
    """The code version for `files`, its folder's content checked (or uploaded) and the version
    created unless it exists; None when the workspace has no default AzureBlob datastore with an
    account key or SAS token, or an identity-based one without `identity` (jobs then need an image
    with the agent, and say so in the boot step's one line). `gather_files` (blocking, run in a
    thread) runs only when there is a datastore. `identity`: the user's async TokenCredential, for
    identity-based datastores.

    A version is never trusted by its name: anyone in the workspace can create `nni-agent:<hash>`
    first (the hash is computable from public wheels), and anyone who may write the datastore's
    container can change the files a version names. So the folder's files are compared with ours
    on every start (read back and hashed, or known by the etags this machine recorded when it last
    wrote or read them; `_sync`), a changed file is uploaded again, and a version whose codeUri
    names another folder is refused in one line on the console: the next free name
    `<hash>-2`, `<hash>-3`, ... is created instead. Each job's boot step checks every file's sha256
    besides, so what someone changes after this check fails the job and never runs."""
    params = {"api-version": api_version}
    store = await _default_datastore(client, workspace, params)
    if store is None:
        return None
    files = await asyncio.to_thread(gather_files)
    props = store.get("properties") or {}
    name = str(store.get("name") or "workspaceblobstore")
    credential: BlobCredential | None
    if identity_based(store):
        credential = identity
        if credential is None:
            log.warning("AML: the datastore %s is identity-based and no Azure identity is at hand to upload the "
                        "agent's code asset: %s", name, NEEDS)
    else:
        secrets = (await client.request("POST", f"{workspace}/datastores/{quote(name, safe='')}/listSecrets",
                                        params=params, retry=True)).body or {}
        credential = _blob_credential(secrets, str(props.get("accountName", "")), name)
        del secrets
    if credential is None:
        return None
    account, container = str(props.get("accountName", "")), str(props.get("containerName", ""))
    canonical = f"{props.get('protocol') or 'https'}://{account}.blob.{props.get('endpoint') or 'core.windows.net'}"
    folder = f"{UPLOAD_ROOT}/{files.digest}/{CODE_NAME}"
    code_uri = f"{canonical}/{container}/{folder}"
    uploaded = await _sync(blob_endpoint or canonical, account, container, credential, folder, files, name, code_uri)
    for version in _version_names(files.digest):
        version_path = f"{workspace}/codes/{CODE_NAME}/versions/{version}"
        reply = await client.request("GET", version_path, params=params, accept=(404,))
        if reply.status == 200:
            uri = str(((reply.body or {}).get("properties") or {}).get("codeUri") or "")
            if uri.rstrip("/") == code_uri:
                break  # ours: its folder was just checked
            notices.say_once(f"aml-code:{workspace}:{version}", (
                f"AML: the code version {CODE_NAME}:{version} in the workspace was not made by nni-manager for this "
                f"agent (its codeUri names {_folder_of(uri)}, not {folder}): it is not used, and the manager's own "
                f"version is created under the next free name. Fix: find out who created it and delete it (`az rest "
                f"--method delete --url https://management.azure.com{version_path}?api-version={api_version}`)"))
            continue
        await client.request("PUT", version_path, params=params, json={"properties": {
            "codeUri": code_uri, "isAnonymous": False,
            "description": "nni-agent and its dependencies' wheels (nni-manager)",
            "properties": {"pythons": " ".join(files.pythons)}}})
        break
    else:
        raise RestError(f"AML: the code versions {CODE_NAME}:{files.digest} to {CODE_NAME}:{version} in the workspace "
                        "were all made by someone else, none for this agent: the agent's code asset has no free name. "
                        "Fix: find out who created them and delete them (`az rest --method delete --url "
                        f"https://management.azure.com{workspace}/codes/{CODE_NAME}/versions/<version>"
                        f"?api-version={api_version}`)")
    return CodeAsset(f"{workspace}/codes/{CODE_NAME}/versions/{version}", files.agent_wheel, tuple(files.pythons),
                     uploaded, files.size, files.sha256())


def _version_names(digest: str, tries: int = 8) -> list[str]:
    """The names a version of this content may take: the content hash, then `<hash>-2`, ... where
    someone else holds it."""
    return [digest] + [f"{digest}-{i}" for i in range(2, tries + 1)]


def _folder_of(uri: str) -> str:
    """The blob folder a codeUri names, for a message (`<container>/<path>`), without the account."""
    rest = uri.split("://", 1)[-1]
    return rest.split("/", 1)[1] if "/" in rest else (rest or "no folder")


NEEDS = ("jobs' images must then carry Python >= 3.8 with nni-agent and its dependencies "
         "(pip install nni-agent)")


async def _default_datastore(client: RestClient, workspace: str, params: dict[str, str]) -> dict[str, Any] | None:
    body = (await client.request("GET", f"{workspace}/datastores", params={**params, "isDefault": "true"})).body
    stores = [s for s in (body or {}).get("value", []) if isinstance(s, dict)]
    if not stores:
        log.warning("AML: the workspace has no default datastore to hold the agent's code asset: %s", NEEDS)
        return None
    store = stores[0]
    kind = (store.get("properties") or {}).get("datastoreType")
    if kind != "AzureBlob":
        log.warning("AML: the default datastore %s is %s, not AzureBlob, so it cannot hold the agent's code "
                    "asset: %s", store.get("name"), kind, NEEDS)
        return None
    return store


def identity_based(store: dict[str, Any]) -> bool:
    """The datastore keeps no credential: callers reach storage with their own identity
    (`credentials: {credentialsType: None}`, AML's NoneDatastoreCredentials)."""
    creds = (store.get("properties") or {}).get("credentials")
    kind = creds.get("credentialsType") if isinstance(creds, dict) else None
    return isinstance(kind, str) and kind.lower() == "none"


ROLE = "Storage Blob Data Contributor"


def _blob_credential(secrets: dict[str, Any], account: str, datastore: str) -> BlobCredential | None:
    kind = secrets.get("secretsType")
    if kind == "AccountKey" and secrets.get("key"):
        return {"account_name": account, "account_key": secrets["key"]}
    if kind == "Sas" and secrets.get("sasToken"):
        from azure.core.credentials import AzureSasCredential
        return AzureSasCredential(str(secrets["sasToken"]).lstrip("?"))
    log.warning("AML: the datastore %s gives no account key or SAS token (secretsType %s), so the agent's code "
                "asset cannot be uploaded: %s", datastore, kind or "none", NEEDS)
    return None


def _etag_record(code_uri: str) -> Path:
    """Where this machine keeps the etags of the asset's blobs as it last wrote or read them (the
    wheel cache's side: the user's own). A blob's etag changes on every write, so equal etags mean
    the content this machine hashed, with no download."""
    return agent_deps.cache_dir() / "aml-code" / f"{hashlib.sha256(code_uri.encode()).hexdigest()[:32]}.json"


def _load_record(path: Path) -> dict[str, str]:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _save_record(path: Path, record: dict[str, str]) -> None:
    import json
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True))
    os.replace(tmp, path)


async def _sync(endpoint: str, account: str, container: str, credential: BlobCredential, folder: str,
                files: CodeFiles, datastore: str, code_uri: str) -> int:
    """Make `folder` hold our files: each one there already is kept only when its content is ours
    (its etag as this machine recorded it, else read back and hashed), every other one is uploaded;
    the bytes sent. A file that was there with other content is said on the console once (someone
    who may write the container changed it). Blobs we do not ship are left alone: the boot step
    reads only the files whose sha256 the job names. Errors name the blob service's code, never
    the credential or a signed URL."""
    import os

    from azure.core.exceptions import AzureError, HttpResponseError
    from azure.storage.blob.aio import ContainerClient

    # azure-core's HTTP logging names headers and URLs (redacted, but never needed here)
    logging.getLogger("azure").setLevel(max(logging.getLogger("azure").getEffectiveLevel(), logging.WARNING))
    sent = 0
    token = hasattr(credential, "get_token")
    # trust what the ARM client trusts (REQUESTS_CA_BUNDLE): aiohttp itself reads no such variable
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
    verify: dict[str, Any] = {"connection_verify": bundle} if bundle else {}
    record_path = _etag_record(code_uri)
    known = _load_record(record_path)
    record: dict[str, str] = {}
    changed: list[str] = []
    try:
        async with ContainerClient(endpoint, container, credential=credential, **verify) as cc:
            there = {b.name: str(b.etag) async for b in cc.list_blobs(name_starts_with=f"{folder}/")}
            for name, path in files.files:
                blob = f"{folder}/{name}"
                if blob in there:
                    if known.get(blob) == there[blob]:
                        record[blob] = there[blob]
                        continue
                    download = await cc.download_blob(blob)
                    data = await download.readall()
                    if hashlib.sha256(data).hexdigest() == await asyncio.to_thread(agent_deps.sha256_file, path):
                        record[blob] = str(download.properties.etag)
                        continue
                    changed.append(name)
                data = await asyncio.to_thread(path.read_bytes)
                reply = await cc.get_blob_client(blob).upload_blob(data, overwrite=True)
                record[blob] = str(reply.get("etag"))
                sent += len(data)
    except HttpResponseError as e:
        status = getattr(e, "status_code", None)
        code = getattr(e, "error_code", None) or status or ""
        if token and status is None:  # azure-identity found no token (it names what it tried)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RestError(f"AML: no Azure token for storage account {account} (identity-based datastore "
                            f"{datastore}): {first} (sign in with `az login`)") from None
        if token and status == 403 and str(code) not in ("AuthenticationFailed", "InvalidAuthenticationInfo"):
            raise RestError(
                f"AML: your Azure identity may not write to storage account {account} (identity-based datastore "
                f"{datastore}: {code}): it needs the role \"{ROLE}\" there; grant it with `az role assignment create "
                f"--role \"{ROLE}\" --assignee <your user or app id> --scope <the storage account's resource id, "
                f"or its container {container}>` (it takes a few minutes to apply), then start the experiment again") from None
        raise RestError(f"AML: uploading the agent's code asset to container {container} of storage account "
                        f"{account} (datastore {datastore}) was refused: {code}; the workspace's identity or the "
                        "datastore's credential may lack write access") from None
    except AzureError as e:
        raise RestError(f"AML: cannot reach the blob service of storage account {account} (datastore {datastore}) "
                        f"to upload the agent's code asset: {type(e).__name__} (set trainingService.blobEndpoint if "
                        "this machine reaches it at another address)") from None
    await asyncio.to_thread(_save_record, record_path, record)
    if changed:
        notices.say_once(f"aml-code:{code_uri}", (
            f"AML: {len(changed)} file(s) of the agent's code asset in container {container} of datastore {datastore} "
            f"({folder}/{changed[0]}{', ...' if len(changed) > 1 else ''}) were not what nni-manager uploaded: someone "
            "who may write that container changed them; the manager's own were uploaded again, and each job checks "
            "every file's sha256 before it runs it. Fix: find out who changed them, and allow only the experiment's "
            "users to write that container"))
    if sent:
        log.info("AML: uploaded %.1f MB of the agent's code asset to datastore %s", sent / 1e6, datastore)
    return sent
