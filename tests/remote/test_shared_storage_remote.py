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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.experiment import Experiment
from nni_manager.types import TrialJobStatus
from tests.support.storage.fixtures import AZURITE_ACCOUNT, AZURITE_KEY, azurite  # noqa: F401 (a fixture)

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


def test_remote_trials_write_outputs_to_the_shared_storage(netns_hosts, root_login, azurite, mounted_on_hosts,  # noqa: F811
                                                           short_tmp) -> None:
    """Logged in as root: the bind mount stands for blobfuse2's, which NNI makes with sudo and
    `allow_other` (any user writes there); a bind mount of the manager's (root's) folder is not."""
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient(azurite, credential={"account_name": AZURITE_ACCOUNT,
                                           "account_key": AZURITE_KEY}).create_container("nni")
    export, mount_point = mounted_on_hosts
    code = short_tmp / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    machines = [{"host": m.host, "port": m.port, "user": m.user, "sshKeyFile": str(m.ssh_key_file),
                 "knownHostsFile": str(m.known_hosts_file), "proxyCommand": m.proxy_command, "pythonPath": m.python_path}
                for m in map(root_login, netns_hosts[:2])]
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


GANESHA_CONF = """
NFS_CORE_PARAM {{ Protocols = 4; NFS_Port = 2049; Enable_NLM = false; Enable_RQUOTA = false; }}
NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = "{root}/recovery"; }}
EXPORT {{ Export_Id = 1; Path = "{root}/export"; Pseudo = /export; Access_Type = RW; Squash = No_Root_Squash;
         Protocols = 4; Transports = TCP; SecType = sys; FSAL {{ Name = VFS; }} }}
"""


@pytest.fixture
def nfs_server(netns_hosts, short_tmp: Path) -> Iterator[Path]:
    """A real NFS server (NFS-Ganesha, userspace, VFS back end) inside the first host's network
    namespace, on its own 127.0.0.1:2049; yields the exported directory. The kernel's nfsd cannot
    run on this machine kind (no nfsd in /proc/filesystems, no modules)."""
    exe = shutil.which("ganesha.nfsd")
    if exe is None or not list(Path("/usr/lib").glob("*/ganesha/libfsalvfs.so")):
        pytest.skip("needs nfs-ganesha and nfs-ganesha-vfs (scripts/test.sh installs them)")
    root = short_tmp / "ganesha"
    (root / "export").mkdir(parents=True)
    (root / "ganesha.conf").write_text(GANESHA_CONF.format(root=root))
    host = netns_hosts[0].name
    proc = subprocess.Popen(["ip", "netns", "exec", host, exe, "-F", "-f", str(root / "ganesha.conf"),
                             "-L", str(root / "ganesha.log"), "-p", str(root / "ganesha.pid"), "-N", "NIV_EVENT"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        log = root / "ganesha.log"
        deadline = time.monotonic() + 30
        while "NFS SERVER INITIALIZED" not in (log.read_text(errors="replace") if log.exists() else ""):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"nfs-ganesha did not start: {log.read_text(errors='replace')[-800:] if log.exists() else ''}")
            time.sleep(0.2)
        yield root / "export"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_remote_trial_mounts_a_real_nfs_server(netns_hosts, root_login, nfs_server: Path, short_tmp: Path) -> None:
    """The worker mounts <nfsServer>:<exportedDirectory> itself, as NNI does, from a server that runs
    in the worker's network namespace. With an NFS client in the kernel the trial's output lands in the
    export; without one (this project's machines) the trial fails with the one-line reason. Mounting
    needs root (NNI: passwordless sudo, which this machine lacks): the SSH login is root's."""
    code = short_tmp / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    h = root_login(netns_hosts[0])
    mount_point = short_tmp / "nfs-mnt"
    config = load_config({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [7]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": str(short_tmp / "exps"),
        "trialGracePeriod": 1, "trainingService": {"platform": "remote", "machineList": [{
            "host": h.host, "port": h.port, "user": h.user, "sshKeyFile": str(h.ssh_key_file),
            "knownHostsFile": str(h.known_hosts_file), "proxyCommand": h.proxy_command,
            "pythonPath": h.python_path}]},
        "sharedStorage": {"storageType": "NFS", "nfsServer": "127.0.0.1", "exportedDirectory": "/export",
                          "localMountPoint": str(short_tmp / "local"), "remoteMountPoint": str(mount_point),
                          "localMounted": "nomount"},
    }, base_dir=short_tmp)
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    [trial] = result.trials
    kernel_nfs = any(ln.split()[-1] in ("nfs", "nfs4") for ln in Path("/proc/filesystems").read_text().splitlines())
    if kernel_nfs:
        assert trial.status == TrialJobStatus.SUCCEEDED, trial.message
        out = nfs_server / "nni" / result.experiment_id / "trials" / trial.trial_id / "nnioutput" / "checkingfile.txt"
        assert json.loads(out.read_text()) == {"x": 7}
    else:
        assert trial.status == TrialJobStatus.FAILED
        # mount.nfs said "No such device" and exited 32 under the local agent but 0 under this SSH-started
        # one (cause not found): either way the reason names the command, mount's words and the cause
        assert trial.message.startswith(f"NFS shared storage: cannot mount 127.0.0.1:/export on {mount_point}: "
                                        f"`mount -t nfs 127.0.0.1:/export {mount_point}` "), trial.message
        assert trial.message.endswith(": mount.nfs: No such device; this machine's kernel has no NFS client "
                                      "(nfs is missing from /proc/filesystems)"), trial.message
