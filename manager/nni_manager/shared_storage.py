"""The manager's side of NNI's `sharedStorage` (the section itself is `config.shared_storage`):
mount it at `localMountPoint` when `localMounted: nnimount`, check the user's mount
(`usermount`), and check an AzureBlob container through the Azure SDK before any worker starts.

Trials work in `<mount>/nni/<experiment>/trials/<trial>` with NNI_OUTPUT_DIR its `nnioutput`
folder, as in NNI; the code still travels over the agent's stream.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys

from nni_manager.config.section import ConfigError
from nni_manager.config.shared_storage import SharedStorageConfig

log = logging.getLogger(__name__)


class SharedStorageError(ConfigError):
    """The manager's side of the shared storage failed: one line naming the cause and the field
    to change (the CLI prints it as it prints any config error)."""

    def __init__(self, problem: str, field: str = "sharedStorage.localMounted",
                 fix: str = "fix the cause named, or mount it yourself and set `localMounted: usermount`") -> None:
        super().__init__(field, problem, fix)


def prepare_local(cfg: SharedStorageConfig, experiment_id: str) -> bool:
    """Before any worker starts: mount the storage at localMountPoint (`nnimount`), or check the
    user's mount is there (`usermount`); AzureBlob's container is checked first through the
    Azure SDK when it is installed. True when nni-manager mounted it (and must unmount it)."""
    if cfg.storage_type == "AzureBlob":
        check_container(cfg)
    mounted = False
    if cfg.local_mounted == "nnimount":  # what the user mounted there already stays theirs
        mounted = _mount_tool("mount", cfg) == "mounted"
    elif cfg.local_mounted == "usermount" and not cfg.local_mount_point.is_dir():
        raise SharedStorageError(
            f"{cfg.storage_type} shared storage: localMountPoint {cfg.local_mount_point} does not exist",
            "sharedStorage.localMountPoint",
            "mount the storage there first (localMounted: usermount), or set `localMounted: nnimount`")
    if cfg.local_mounted != "nomount":
        root = cfg.local_root(experiment_id)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SharedStorageError(f"{cfg.storage_type} shared storage: cannot create {root}: "
                                     f"{e.strerror or e}") from None
    return mounted


def release_local(cfg: SharedStorageConfig) -> None:
    """At the experiment's end: unmount what prepare_local mounted (NNI's cleanUp)."""
    try:
        _mount_tool("unmount", cfg)
    except SharedStorageError as e:
        log.warning("%s", e)


def _mount_tool(action: str, cfg: SharedStorageConfig) -> str:
    """The agent's mount code (nni_agent.mounts), run as a program: the storage, key included,
    goes on its stdin, never its argv."""
    spec = json.loads(cfg.agent_spec())
    spec["remoteMountPoint"] = str(cfg.local_mount_point)
    result = subprocess.run([sys.executable, "-m", "nni_agent.mounts", action, str(cfg.local_mount_point)],
                            input=json.dumps(spec), capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        raise SharedStorageError(lines[-1] if lines else f"{cfg.storage_type} shared storage: {action} failed")
    return result.stdout.strip()


def check_container(cfg: SharedStorageConfig) -> None:
    """Fail before any worker starts when the account, key or container is wrong (a blobfuse
    mount on every worker would fail later, each with a less clear message)."""
    try:
        from azure.core.exceptions import (
            AzureError,
            ClientAuthenticationError,
            HttpResponseError,
            ResourceNotFoundError,
        )
        from azure.storage.blob import ContainerClient
    except ImportError:
        log.info("azure-storage-blob is not installed: the container is not checked before the workers mount it")
        return
    what = f"AzureBlob shared storage: container {cfg.container_name} of account {cfg.storage_account_name}"
    client = ContainerClient(cfg.endpoint, cfg.container_name or "",
                             credential={"account_name": cfg.storage_account_name or "",
                                         "account_key": cfg.storage_account_key or ""},
                             connection_timeout=10, read_timeout=20, retry_total=1)
    try:
        with client:
            client.get_container_properties()
    except ResourceNotFoundError:
        raise SharedStorageError(f"{what} does not exist at {cfg.endpoint}", "sharedStorage.containerName",
                                 "create the container, or fix containerName") from None
    except HttpResponseError as e:  # Azure (and Azurite) answer a wrong key with 403 AuthenticationFailed
        if not isinstance(e, ClientAuthenticationError) and e.status_code != 403:
            raise SharedStorageError(f"{what}: the service answered {e.status_code} {e.reason}",
                                     "sharedStorage.storageAccountName",
                                     "check the account name and container (and blobEndpoint)") from None
        raise SharedStorageError(f"{what}: the service refused the key (authentication failed)",
                                 "sharedStorage.storageAccountKey",
                                 "copy the account's access key from the Azure portal") from None
    except AzureError as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if cfg.storage_account_key:
            message = message.replace(cfg.storage_account_key, "***")
        raise SharedStorageError(f"{what}: cannot reach {cfg.endpoint}: {message[:300]}",
                                 "sharedStorage.storageAccountName",
                                 "check the account name (and blobEndpoint) and this machine's network") from None

