"""The `sharedStorage` section: NNI's fields, each mistake one error naming the field and the fix,
and the account key kept out of every repr and log."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ConfigError, SecretFormatter, secret_values
from nni_manager.loader import load_config

KEY = "a2V5LWZvci1jb25maWctdGVzdHM="


def _load(tmp_path: Path, **storage: Any):
    (tmp_path / "code").mkdir(exist_ok=True)
    return load_config({"trialCommand": "python t.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
                        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "tuner": {"name": "Random"},
                        "trainingService": {"platform": "local"}, "sharedStorage": storage}, base_dir=tmp_path)


NFS = {"storageType": "NFS", "localMountPoint": "/mnt/l", "remoteMountPoint": "r", "nfsServer": "nfs.example",
       "exportedDirectory": "/export", "localMounted": "nnimount"}
BLOB = {"storageType": "AzureBlob", "localMountPoint": "/mnt/l", "remoteMountPoint": "/mnt/r",
        "storageAccountName": "acct", "storageAccountKey": KEY, "containerName": "c", "localMounted": "usermount"}


def test_nfs_and_blob_sections(tmp_path: Path) -> None:
    nfs = _load(tmp_path, **NFS).shared_storage
    assert (nfs.storage_type, nfs.nfs_server, nfs.exported_directory, nfs.remote_mount_point) == (
        "NFS", "nfs.example", "/export", "r")
    assert nfs.local_mount_point == Path("/mnt/l") and nfs.local_mounted == "nnimount"
    config = _load(tmp_path, **BLOB)
    blob = config.shared_storage
    assert blob.storage_account_key == KEY and blob.endpoint == "https://acct.blob.core.windows.net"
    assert KEY not in repr(config) and KEY not in repr(blob)
    assert KEY in secret_values(config)  # what the manager's log formatter masks
    record = logging.LogRecord("x", logging.INFO, "", 0, "mounting with %s", (KEY,), None)
    assert KEY not in SecretFormatter(secrets=secret_values(config)).format(record)
    snake = _load(tmp_path, storage_type="NFS", local_mount_point="/mnt/l", remote_mount_point="r",
                  nfs_server="h", exported_directory="/e", local_mounted="nomount").shared_storage  # NNI's key rule
    assert (snake.nfs_server, snake.local_mounted) == ("h", "nomount")


@pytest.mark.parametrize(("change", "message"), [
    ({"storageType": "S3"}, "config field `sharedStorage.storageType`: must be one of NFS, AzureBlob, got 'S3'"),
    ({"localMounted": "automount"}, "config field `sharedStorage.localMounted`: must be one of usermount, nnimount, "
                                     "nomount, got 'automount'"),
    ({"localMountPoint": "rel/dir"}, "config field `sharedStorage.localMountPoint`: must be an absolute path, "
                                     "got 'rel/dir'"),
    ({"nfsServer": None}, "config field `sharedStorage.nfsServer`: is required"),
    ({"nfsServer": "-oexec"}, "config field `sharedStorage.nfsServer`: '-oexec' cannot be used on a mount command line"),
    ({"exportedDirectory": "export"}, "config field `sharedStorage.exportedDirectory`: must be the absolute path the "
                                      "server exports, got 'export'"),
    ({"remoteMountPoint": "a\nb"}, "config field `sharedStorage.remoteMountPoint`: 'a\\nb' cannot be used on a mount"),
    ({"containerName": "c"}, "config field `sharedStorage.containerName`: is not used with storageType: NFS"),
    ({"exportedDir": "/x"}, "config field `sharedStorage.exportedDir`: unknown field. Fix: did you mean `exportedDirectory`?"),
])
def test_nfs_mistakes(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, **{**NFS, **change})
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(("change", "message"), [
    ({"storageAccountKey": None}, "config field `sharedStorage.storageAccountKey`: is required for AzureBlob"),
    ({"containerName": None}, "config field `sharedStorage.containerName`: is required"),
    ({"blobEndpoint": "ftp://x"}, "config field `sharedStorage.blobEndpoint`: must be an http(s) URL"),
    ({"nfsServer": "h"}, "config field `sharedStorage.nfsServer`: is not used with storageType: AzureBlob"),
])
def test_blob_mistakes_never_show_the_key(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, **{**BLOB, **change})
    assert str(info.value).startswith(message) and KEY not in str(info.value)
