"""The agent's side of sharedStorage (nni_agent.mounts): what it runs, and the one-line errors when
it cannot mount. NFS itself cannot be mounted on this project's machines: their kernel has no NFS
client (`nfs` is absent from /proc/filesystems and there are no kernel modules), so the tests here
run the real `mount -t nfs` and check the error it leads to; docs/platforms/shared-storage.md says so."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nni_agent import mounts

KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHM="


def _nfs(mount_point: str = "/mnt/nni") -> mounts.Storage:
    return mounts.Storage({"storageType": "NFS", "remoteMountPoint": mount_point, "nfsServer": "127.0.0.1",
                           "exportedDirectory": "/srv/nfs dir"})


def _blob(mount_point: str = "/mnt/nni") -> mounts.Storage:
    return mounts.Storage({"storageType": "AzureBlob", "remoteMountPoint": mount_point, "storageAccountName": "acct",
                           "storageAccountKey": KEY, "containerName": "c1"})


def _kernel_has_nfs() -> bool:
    return any(line.split()[-1] in ("nfs", "nfs4") for line in Path("/proc/filesystems").read_text().splitlines())


def test_nfs_command_is_an_argv_and_its_text_is_quoted(tmp_path: Path) -> None:
    argv, env = _nfs().mount_argv(tmp_path / "m p")
    assert argv == ["mount", "-t", "nfs", "127.0.0.1:/srv/nfs dir", str(tmp_path / "m p")]
    assert env == {}
    assert mounts.shown(argv) == f"mount -t nfs '127.0.0.1:/srv/nfs dir' '{tmp_path}/m p'"


def test_blob_key_goes_to_blobfuse_through_its_environment_never_argv(tmp_path: Path) -> None:
    storage = _blob()
    argv, env = storage.mount_argv(tmp_path)
    assert argv[1:3] == ["mount", str(tmp_path)] and not any(KEY in a for a in argv)
    assert env["AZURE_STORAGE_ACCESS_KEY"] == KEY and env["AZURE_STORAGE_ACCOUNT"] == "acct"
    assert env["AZURE_STORAGE_ACCOUNT_CONTAINER"] == "c1"
    assert KEY not in repr(storage)
    cache = storage.tmp_path()
    storage.discard_cache()  # nothing mounted from it: it goes
    assert not cache.exists()


def test_relative_mount_point_is_under_the_agent_work_directory(tmp_path: Path) -> None:
    assert _nfs("share").root(tmp_path) == tmp_path / "share"
    assert _nfs("/abs").root(tmp_path) == Path("/abs")
    assert mounts.trial_directory(Path("/abs"), "exp1", "t1") == Path("/abs/nni/exp1/trials/t1")


def test_missing_blobfuse_is_one_line_naming_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("blobfuse2") or shutil.which("blobfuse"):
        pytest.skip("blobfuse is installed here")
    with pytest.raises(mounts.MountError) as info:
        mounts.ensure_mounted(_blob(str(tmp_path / "m")), tmp_path / "m")
    assert str(info.value) == (f"AzureBlob shared storage: cannot mount container c1 of account acct on {tmp_path}/m: "
                               "blobfuse2 not found; install blobfuse2 (Microsoft's package repository: "
                               "https://github.com/Azure/azure-storage-fuse) on this worker")
    assert not (tmp_path / "m").exists()  # nothing made before the check


def test_missing_mount_nfs_is_one_line_naming_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.path.exists("/sbin/mount.nfs") or os.path.exists("/usr/sbin/mount.nfs"):
        pytest.skip("nfs-common is installed here (its absence cannot be arranged)")
    with pytest.raises(mounts.MountError, match=r"mount.nfs not found; install nfs-common \(Debian/Ubuntu\)"):
        mounts.ensure_mounted(_nfs(), tmp_path / "m")


def test_nfs_mount_failure_names_the_cause(tmp_path: Path) -> None:
    """The real mount(8) runs; on a kernel without an NFS client it says so in one line."""
    if os.geteuid() != 0:
        pytest.skip("mount needs root")
    if not (os.path.exists("/sbin/mount.nfs") or os.path.exists("/usr/sbin/mount.nfs")):
        pytest.skip("mount.nfs missing: install nfs-common (scripts/test.sh does)")
    if _kernel_has_nfs():
        pytest.skip("this kernel has an NFS client: the failure path below does not arise")
    with pytest.raises(mounts.MountError) as info:
        mounts.ensure_mounted(_nfs(), tmp_path / "m")
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"NFS shared storage: cannot mount 127.0.0.1:/srv/nfs dir on {tmp_path}/m: "
                           f"`mount -t nfs '127.0.0.1:/srv/nfs dir' {tmp_path}/m` failed: ")
    assert text.endswith("; this machine's kernel has no NFS client (nfs is missing from /proc/filesystems)")
    assert not mounts.is_mounted(tmp_path / "m")


def test_an_existing_mount_is_used_as_it_is(bind_mount: tuple[Path, Path]) -> None:
    export, mount_point = bind_mount
    assert mounts.is_mounted(mount_point) and not mounts.is_mounted(export)
    # the user's mount (localMounted / a worker prepared by hand): nothing is run, nothing unmounted later
    assert mounts.ensure_mounted(_nfs(str(mount_point)), mount_point) is False
    assert str(mount_point) not in mounts._mounted


def test_the_mount_program_reads_the_storage_from_stdin(tmp_path: Path, bind_mount: tuple[Path, Path]) -> None:
    """`python -m nni_agent.mounts`, which the manager runs for localMounted: nnimount."""
    _, mount_point = bind_mount
    spec = json.dumps({"storageType": "NFS", "remoteMountPoint": str(mount_point), "nfsServer": "127.0.0.1",
                       "exportedDirectory": "/x"})
    done = subprocess.run([sys.executable, "-m", "nni_agent.mounts", "mount", str(mount_point)], input=spec,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "already mounted")
    bad = subprocess.run([sys.executable, "-m", "nni_agent.mounts", "mount", str(tmp_path / "x")], input="{",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.strip() == "shared storage: the manager sent an unreadable storage description"
