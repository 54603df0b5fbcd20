"""sharedStorage on SSH workers: two hosts (network namespaces reached only through SSH) see an
AzureBlob storage at `remoteMountPoint`, already mounted there (a real bind mount standing for the
blobfuse2 mount, which cannot run here: docs/platforms/shared-storage.md). The container is checked
through the Azure SDK against Azurite; each trial writes to NNI_OUTPUT_DIR and the file is found on
the export; the account key, carried only inside StartTrial, is in no trial environment, no file of
the experiment and nothing on the storage."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nni_manager.config import load_config
from nni_manager.experiment import Experiment
from nni_manager.types import TrialJobStatus
from tests.storage.conftest import AZURITE_ACCOUNT, AZURITE_KEY, azurite  # noqa: F401 (a fixture)

pytestmark = pytest.mark.ssh

TRIAL = f"""
import json, os, socket
import nni_agent as nni
p = nni.get_next_parameter()
with open(os.path.join(os.environ["NNI_OUTPUT_DIR"], "checkingfile.txt"), "a") as f:
    f.write(json.dumps(p))
leaked = [k for k, v in os.environ.items() if "SHARED_STORAGE" in k or {AZURITE_KEY!r} in v]
print("leaked", leaked, "on", os.environ["NNI_SYS_DIR"])
nni.report_final_result(p["x"])
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="nss", dir="/tmp"))  # the hub's Unix socket path must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def mounted_on_hosts(netns_hosts, short_tmp: Path) -> Iterator[tuple[Path, Path]]:
    """(export, mount point): the export bind-mounted at the mount point inside each host's own mount
    namespace (`ip netns exec` gives each one), as a user mounts a share on each worker."""
    if shutil.which("nsenter") is None:
        pytest.skip("needs nsenter (util-linux)")
    export, mount_point = short_tmp / "export", short_tmp / "mnt"
    export.mkdir()
    mount_point.mkdir()
    done: list[int] = []
    try:
        for host in netns_hosts[:2]:
            subprocess.run(["nsenter", "-t", str(host.proc.pid), "-m", "mount", "--bind", str(export),
                            str(mount_point)], check=True, capture_output=True)
            done.append(host.proc.pid)
        yield export, mount_point
    finally:
        for pid in done:
            subprocess.run(["nsenter", "-t", str(pid), "-m", "umount", "-l", str(mount_point)], capture_output=True)


def test_remote_trials_write_outputs_to_the_shared_storage(netns_hosts, azurite, mounted_on_hosts, short_tmp) -> None:  # noqa: F811
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient(azurite, credential={"account_name": AZURITE_ACCOUNT,
                                           "account_key": AZURITE_KEY}).create_container("nni")
    export, mount_point = mounted_on_hosts
    code = short_tmp / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    machines = [{"host": h.machine.host, "port": h.machine.port, "user": h.machine.user,
                 "sshKeyFile": str(h.machine.ssh_key_file), "knownHostsFile": str(h.machine.known_hosts_file),
                 "proxyCommand": h.machine.proxy_command, "pythonPath": h.machine.python_path}
                for h in netns_hosts[:2]]
    config = load_config({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 2,
        "maxTrialNumber": 2, "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": str(short_tmp / "exps"),
        "trialGracePeriod": 1, "trainingService": {"platform": "remote", "machineList": machines},
        "sharedStorage": {"storageType": "AzureBlob", "storageAccountName": AZURITE_ACCOUNT,
                          "storageAccountKey": AZURITE_KEY, "containerName": "nni", "blobEndpoint": azurite,
                          "localMountPoint": str(export), "remoteMountPoint": str(mount_point),
                          "localMounted": "usermount"},
    }, base_dir=short_tmp)
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert [t.status for t in result.trials] == [TrialJobStatus.SUCCEEDED] * 2, [t.message for t in result.trials]
    for t in result.trials:
        trial_dir = export / "nni" / result.experiment_id / "trials" / t.trial_id
        assert json.loads((trial_dir / "nnioutput" / "checkingfile.txt").read_text()) == t.parameters
        assert f"leaked [] on {mount_point}/nni/{result.experiment_id}/trials/{t.trial_id}" in (
            trial_dir / "trial.stdout").read_text()
    for root in (result.experiment_dir, export):
        for path in root.rglob("*"):
            if path.is_file():
                assert AZURITE_KEY.encode() not in path.read_bytes(), path
