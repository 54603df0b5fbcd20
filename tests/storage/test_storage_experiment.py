"""sharedStorage end to end on the local platform: the real manager, agent and trial processes.

The worker's mount is a real one the user made (a bind mount of a directory standing for the NFS
export: this machine's kernel has no NFS client, see test_mounts.py); the trial writes to
NNI_OUTPUT_DIR and the file is found on the export, in NNI's layout. AzureBlob's container is
checked through the real Azure SDK against Azurite; the agent's blobfuse2 mount then fails with its
one-line error, since blobfuse2 (Microsoft's own package repository only) is not installable here."""
from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.experiment import Experiment
from nni_manager.config.shared_storage import SharedStorageConfig
from nni_manager.shared_storage import check_container
from nni_manager.types import TrialJobStatus

from tests.support.storage.fixtures import AZURITE_ACCOUNT, AZURITE_KEY

TRIAL = """
    import json, os
    import nni_agent as nni
    p = nni.get_next_parameter()
    # NNI's own shared-storage test trial (config_sharedstorage_trial.py) writes here
    with open(os.path.join(os.environ["NNI_OUTPUT_DIR"], "checkingfile.txt"), "a") as f:
        f.write(json.dumps(p))
    leaked = [k for k, v in os.environ.items() if "SHARED_STORAGE" in k or "{key}" in v]
    print("sys", os.environ["NNI_SYS_DIR"], "leaked", leaked)
    nni.report_final_result(p["x"])
"""


def _config(tmp_path: Path, storage: dict[str, Any], key: str = "") -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(textwrap.dedent(TRIAL.replace("{key}", key or "no-key-given")))
    config = {
        "trialCommand": "python trial.py", "trialCodeDirectory": "code", "trialConcurrency": 2, "maxTrialNumber": 2,
        "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}}, "tuner": {"name": "GridSearch"},
        "trainingService": {"platform": "local"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 1,
        "sharedStorage": storage,
    }
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_trial_outputs_land_on_the_share(tmp_path: Path, bind_mount: tuple[Path, Path]) -> None:
    export, mount_point = bind_mount
    config = load_config(_config(tmp_path, {
        "storageType": "NFS", "nfsServer": "127.0.0.1", "exportedDirectory": "/srv/nfs",
        "localMountPoint": str(export), "remoteMountPoint": str(mount_point), "localMounted": "usermount"}))
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert [t.status for t in result.trials] == [TrialJobStatus.SUCCEEDED] * 2, [t.message for t in result.trials]
    for t in result.trials:
        trial_dir = export / "nni" / result.experiment_id / "trials" / t.trial_id  # NNI's layout on the storage
        assert json.loads((trial_dir / "nnioutput" / "checkingfile.txt").read_text()) == t.parameters
        stdout = (trial_dir / "trial.stdout").read_text()
        assert f"sys {mount_point}/nni/{result.experiment_id}/trials/{t.trial_id} leaked []" in stdout
        assert (trial_dir / "parameter.cfg").is_file()
    # the user's mount stays, as it was
    from nni_agent.mounts import is_mounted
    assert is_mounted(mount_point)


def test_usermount_without_the_local_mount_point_is_refused_before_any_trial(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, {
        "storageType": "NFS", "nfsServer": "127.0.0.1", "exportedDirectory": "/srv/nfs",
        "localMountPoint": str(tmp_path / "not-there"), "remoteMountPoint": str(tmp_path / "r"),
        "localMounted": "usermount"}))
    with pytest.raises(ConfigError) as info:
        asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert str(info.value) == (
        f"config field `sharedStorage.localMountPoint`: NFS shared storage: localMountPoint {tmp_path}/not-there "
        "does not exist. Fix: mount the storage there first (localMounted: usermount), or set "
        "`localMounted: nnimount`")
    assert not (tmp_path / "r").exists()


def _blob(endpoint: str, key: str = AZURITE_KEY, container: str = "nni") -> SharedStorageConfig:
    return SharedStorageConfig(storage_type="AzureBlob", local_mount_point=Path("/unused"), remote_mount_point="m",
                               local_mounted="nomount", storage_account_name=AZURITE_ACCOUNT, storage_account_key=key,
                               container_name=container, blob_endpoint=endpoint)


def _make_container(endpoint: str, name: str) -> Any:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient(endpoint, credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY})
    return service.create_container(name)


def test_blob_container_checked_through_the_azure_sdk(azurite: str) -> None:
    _make_container(azurite, "nni")
    check_container(_blob(azurite))  # the account, key and container are right: no error
    with pytest.raises(ConfigError) as info:
        check_container(_blob(azurite, container="missing"))
    assert str(info.value) == (f"config field `sharedStorage.containerName`: AzureBlob shared storage: container "
                               f"missing of account {AZURITE_ACCOUNT} does not exist at {azurite}. Fix: create the "
                               "container, or fix containerName")
    wrong = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk="
    with pytest.raises(ConfigError) as info:
        check_container(_blob(azurite, key=wrong))
    assert str(info.value) == (f"config field `sharedStorage.storageAccountKey`: AzureBlob shared storage: container "
                               f"nni of account {AZURITE_ACCOUNT}: the service refused the key (authentication "
                               "failed). Fix: copy the account's access key from the Azure portal")


def test_blob_experiment_workers_say_what_they_lack_and_the_key_stays_hidden(tmp_path: Path, azurite: str) -> None:
    if shutil.which("blobfuse2") or shutil.which("blobfuse"):
        pytest.skip("blobfuse is installed here: this test is about a worker without it")
    container = _make_container(azurite, "nni")
    config = load_config(_config(tmp_path, {
        "storageType": "AzureBlob", "storageAccountName": AZURITE_ACCOUNT, "storageAccountKey": AZURITE_KEY,
        "containerName": "nni", "blobEndpoint": azurite, "localMountPoint": str(tmp_path / "local"),
        "remoteMountPoint": "blob", "localMounted": "nomount"}, key=AZURITE_KEY))
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert [t.status for t in result.trials] == [TrialJobStatus.FAILED] * 2
    for t in result.trials:  # remoteMountPoint relative: under the agent's work directory
        assert t.message.startswith(f"AzureBlob shared storage: cannot mount container nni of account "
                                    f"{AZURITE_ACCOUNT} on "), t.message
        assert t.message.endswith("/blob: blobfuse2 not found; install blobfuse2 (Microsoft's package repository: "
                                  "https://github.com/Azure/azure-storage-fuse) on this worker")
    for path in result.experiment_dir.rglob("*"):  # store, logs, bundles: never the key
        if path.is_file():
            assert AZURITE_KEY.encode() not in path.read_bytes(), path
    assert list(container.list_blobs()) == []  # nothing was written to the container without a mount


def test_nnimount_keeps_a_mount_already_there(tmp_path: Path, bind_mount: tuple[Path, Path]) -> None:
    """`localMounted: nnimount` over a mount that exists: used, and left mounted at the end."""
    from nni_agent.mounts import is_mounted

    export, mount_point = bind_mount
    config = load_config(_config(tmp_path, {
        "storageType": "NFS", "nfsServer": "127.0.0.1", "exportedDirectory": "/srv/nfs",
        "localMountPoint": str(mount_point), "remoteMountPoint": str(mount_point), "localMounted": "nnimount"}))
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert [t.status for t in result.trials] == [TrialJobStatus.SUCCEEDED] * 2, [t.message for t in result.trials]
    assert len(list((export / "nni" / result.experiment_id / "trials").glob("*/nnioutput/checkingfile.txt"))) == 2
    assert is_mounted(mount_point)


def test_nnimount_failure_stops_the_start_with_the_cause(tmp_path: Path) -> None:
    """The manager runs the agent's mount code (`python -m nni_agent.mounts`) for nnimount; on this
    kernel, without an NFS client, the real mount fails and the start stops naming why."""
    import os

    if os.geteuid() != 0 or not (os.path.exists("/sbin/mount.nfs") or os.path.exists("/usr/sbin/mount.nfs")):
        pytest.skip("needs root and mount.nfs (nfs-common)")
    if any(ln.split()[-1] in ("nfs", "nfs4") for ln in Path("/proc/filesystems").read_text().splitlines()):
        pytest.skip("this kernel has an NFS client: the failure path does not arise")
    local = tmp_path / "local"
    config = load_config(_config(tmp_path, {
        "storageType": "NFS", "nfsServer": "127.0.0.1", "exportedDirectory": "/srv/nfs",
        "localMountPoint": str(local), "remoteMountPoint": str(tmp_path / "r"), "localMounted": "nnimount"}))
    with pytest.raises(ConfigError) as info:
        asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert str(info.value) == (
        f"config field `sharedStorage.localMounted`: NFS shared storage: cannot mount 127.0.0.1:/srv/nfs on {local}: "
        f"`mount -t nfs 127.0.0.1:/srv/nfs {local}` failed: mount.nfs: No such device; this machine's kernel has "
        "no NFS client (nfs is missing from /proc/filesystems). Fix: fix the cause named, or mount it yourself and "
        "set `localMounted: usermount`")
    assert not (tmp_path / "r").exists()  # no worker started
