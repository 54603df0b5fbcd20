"""NNI's `sharedStorage` section: NFS or an Azure blob container that every worker mounts at
`remoteMountPoint` (the agent does it, `nni_agent.mounts`) and the manager's machine sees at
`localMountPoint` (`localMounted`: the user mounted it, nni-manager mounts it, or neither).

Parsed here, with the other sections; the manager's side (mounting at localMountPoint, the
Azure container check) is `nni_manager.shared_storage`. The storage reaches each agent inside
StartTrial (`agent_env`), over the stream the agent authenticated: the account key is never in
argv, a script or a log (the config's secret rule masks it: `storageAccountKey`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from nni_manager.config.redaction import redacted_repr
from nni_manager.config.section import MISSING, ConfigError, ConfigSection

AGENT_ENV_KEY = "NNI_AGENT_SHARED_STORAGE"  # nni_agent.mounts.ENV_KEY: the agent takes it out of the trial's env
STORAGE_TYPES = ("NFS", "AzureBlob")
LOCAL_MOUNTED = ("usermount", "nnimount", "nomount")


@dataclass
class SharedStorageConfig:
    """NNI's SharedStorageConfig (nni/experiment/config/shared_storage.py), plus `blobEndpoint`."""

    storage_type: str
    local_mount_point: Path
    remote_mount_point: str
    local_mounted: str
    nfs_server: str | None = None
    exported_directory: str | None = None
    storage_account_name: str | None = None
    storage_account_key: str | None = field(default=None, repr=False)
    container_name: str | None = None
    # Ours: the blob service's URL for clouds other than Azure's public one (and Azurite);
    # default https://<storageAccountName>.blob.core.windows.net
    blob_endpoint: str | None = None

    def __repr__(self) -> str:
        return redacted_repr(self)

    @property
    def endpoint(self) -> str:
        return self.blob_endpoint or f"https://{self.storage_account_name}.blob.core.windows.net"

    def local_root(self, experiment_id: str) -> Path:
        """Where the manager's machine sees the experiment's files (NNI's localWorkingRoot)."""
        return self.local_mount_point / "nni" / experiment_id

    def agent_spec(self) -> str:
        """What an agent needs to mount it (JSON, secret included: it travels in StartTrial only)."""
        data: dict[str, str | None] = {"storageType": self.storage_type, "remoteMountPoint": self.remote_mount_point}
        if self.storage_type == "NFS":
            data |= {"nfsServer": self.nfs_server, "exportedDirectory": self.exported_directory}
        else:
            data |= {"storageAccountName": self.storage_account_name, "storageAccountKey": self.storage_account_key,
                     "containerName": self.container_name}
            if self.blob_endpoint:
                data["blobEndpoint"] = self.blob_endpoint
        return json.dumps(data)

    def agent_env(self) -> dict[str, str]:
        return {AGENT_ENV_KEY: self.agent_spec()}


_NFS_FIELDS = ("nfsServer", "exportedDirectory")
_BLOB_FIELDS = ("storageAccountName", "storageAccountKey", "containerName", "blobEndpoint")


def parse(root: ConfigSection) -> SharedStorageConfig | None:
    """The `sharedStorage` section, checked as NNI checks it (and the values an agent would put
    on a mount command line: no option-looking or multi-line ones)."""
    value, path = root.take("sharedStorage")
    if value is MISSING or value is False:
        return None
    s = ConfigSection(value, path, root.base)
    storage_type = s.choice("storageType", options=STORAGE_TYPES, required=True)
    assert storage_type is not None
    local = s.str_("localMountPoint", required=True)
    remote = s.str_("remoteMountPoint", required=True)
    assert local is not None and remote is not None
    local_path = Path(local).expanduser()
    if not local_path.is_absolute():
        raise ConfigError(s.at("localMountPoint"), f"must be an absolute path, got {local!r}",
                          "write e.g. `localMountPoint: /mnt/nni-storage` (NNI requires an absolute path)")
    local_mounted = s.choice("localMounted", options=LOCAL_MOUNTED, required=True)
    assert local_mounted is not None
    cfg = SharedStorageConfig(storage_type=storage_type, local_mount_point=local_path, remote_mount_point=remote,
                              local_mounted=local_mounted)
    _plain(s, "remoteMountPoint", remote)
    _plain(s, "localMountPoint", local)
    own, other = (_NFS_FIELDS, _BLOB_FIELDS) if storage_type == "NFS" else (_BLOB_FIELDS, _NFS_FIELDS)
    for name in other:
        if name in s.data:
            raise ConfigError(s.at(name), f"is not used with storageType: {storage_type}",
                              f"remove it (for {storage_type} give {', '.join(f for f in own if f != 'blobEndpoint')})")
    if storage_type == "NFS":
        cfg.nfs_server = s.str_("nfsServer", required=True)
        cfg.exported_directory = s.str_("exportedDirectory", required=True)
        _plain(s, "nfsServer", cfg.nfs_server)
        _plain(s, "exportedDirectory", cfg.exported_directory)
        if ":" in (cfg.nfs_server or "") and not (cfg.nfs_server or "").startswith("["):
            raise ConfigError(s.at("nfsServer"), f"{cfg.nfs_server!r} is not a host name or address",
                              "write the server's name or address alone (an IPv6 address in brackets: [fd00::1])")
        if not (cfg.exported_directory or "").startswith("/"):
            raise ConfigError(s.at("exportedDirectory"), f"must be the absolute path the server exports, "
                              f"got {cfg.exported_directory!r}", "write e.g. `exportedDirectory: /srv/nfs/nni`")
    else:
        cfg.storage_account_name = s.str_("storageAccountName", required=True)
        key = s.str_("storageAccountKey")
        if not key:  # NNI: "AzureBlob Shared Storage: must set 'storageAccountKey'."
            raise ConfigError(s.at("storageAccountKey"), "is required for AzureBlob",
                              "add `storageAccountKey: ...` (the account's access key, from the Azure portal)")
        cfg.storage_account_key = key
        cfg.container_name = s.str_("containerName", required=True)
        cfg.blob_endpoint = s.str_("blobEndpoint")
        for name, v in (("storageAccountName", cfg.storage_account_name), ("containerName", cfg.container_name),
                        ("blobEndpoint", cfg.blob_endpoint)):
            _plain(s, name, v)
        if "\n" in key or "\r" in key:
            raise ConfigError(s.at("storageAccountKey"), "must be one line", "paste the key without line breaks")
        if cfg.blob_endpoint and not cfg.blob_endpoint.startswith(("https://", "http://")):
            raise ConfigError(s.at("blobEndpoint"), "must be an http(s) URL",
                              "write e.g. `blobEndpoint: https://myaccount.blob.core.chinacloudapi.cn`")
    s.finish()
    return cfg


def _plain(s: ConfigSection, name: str, value: str | None) -> None:
    """A value that becomes an argument of mount/blobfuse: one line, not an option."""
    if value is None:
        return
    if value.startswith("-") or any(c in value for c in "\n\r\0"):
        raise ConfigError(s.at(name), f"{value!r} cannot be used on a mount command line",
                          "write a plain name or path (not starting with '-', on one line)")
