"""The blobfuse cache of `sharedStorage: AzureBlob` (it holds the container's blobs) is a fresh
private directory of the agent's user, not a predictable /tmp path another user could make first.

The agent's real mount step (`python -m nni_agent.mounts mount`, as the platforms run it) with a
stand-in `blobfuse2` first on PATH that records the cache it was given: FUSE mounts cannot run on
this project's machines (docs/platforms/shared-storage.md). The other user is uid 65534."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STAND_IN = """#!/bin/sh
for a in "$@"; do case "$a" in --tmp-path=*) echo "${a#--tmp-path=}" > "$RECORD";; esac; done
echo "blobfuse2 stand-in: not mounting" >&2
exit 1
"""


def test_the_blobfuse_cache_is_private_and_never_a_planted_directory(tmp_path: Path) -> None:
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    os.chmod(shared_tmp, 0o1777)
    planted = shared_tmp / "nni-blobfuse" / "acct-c1"  # where the cache went before
    planted.mkdir(parents=True)
    for d in (planted, planted.parent):
        os.chmod(d, 0o777)
        if os.getuid() == 0:
            os.chown(d, 65534, 65534)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "blobfuse2").write_text(STAND_IN)
    os.chmod(bin_dir / "blobfuse2", 0o755)
    record = tmp_path / "record"
    storage = {"storageType": "AzureBlob", "remoteMountPoint": str(tmp_path / "mnt"), "storageAccountName": "acct",
               "storageAccountKey": "a2V5", "containerName": "c1"}
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(shared_tmp), "RECORD": str(record)}
    out = subprocess.run([sys.executable, "-m", "nni_agent.mounts", "mount", str(tmp_path / "mnt")],
                         input=json.dumps(storage), capture_output=True, text=True, env=env, timeout=60)
    if not os.path.exists("/dev/fuse"):
        assert "/dev/fuse is missing" in out.stderr
        return
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    cache = Path(record.read_text().strip())
    assert cache != planted and not cache.is_relative_to(planted.parent), cache
    assert cache.parent == shared_tmp
    assert not cache.exists()  # the mount failed: its cache went with it
    # the stand-in that mounts nothing, then records what the cache was while it ran
    (bin_dir / "blobfuse2").write_text(STAND_IN.replace('echo "${a#--tmp-path=}" > "$RECORD"',
                                                        'stat -c "%F %u %a" "${a#--tmp-path=}" > "$RECORD"'))
    subprocess.run([sys.executable, "-m", "nni_agent.mounts", "mount", str(tmp_path / "mnt")],
                   input=json.dumps(storage), capture_output=True, text=True, env=env, timeout=60)
    assert record.read_text().split() == ["directory", str(os.getuid()), "700"]
    assert list(shared_tmp.iterdir()) == [planted.parent]


MOUNTING_STAND_IN = """#!{python}
# blobfuse2 mount MOUNT_POINT --tmp-path=CACHE -o allow_other: a tmpfs stands for the FUSE mount, and a
# daemon (this command line, as blobfuse's) serves it until it is unmounted
import os, subprocess, sys, time
mount_point = sys.argv[2]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "nni-blobfuse-stand-in", mount_point], check=True)
if os.fork() == 0:  # a daemon, as blobfuse is: its own session, no tie to the caller's output
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for _ in range(600):
        if not os.path.ismount(mount_point):
            break
        time.sleep(0.1)
    os._exit(0)
"""


def test_the_helper_s_unmount_removes_the_cache_its_mount_made(tmp_path: Path) -> None:
    """`python -m nni_agent.mounts unmount` (the manager's localMountPoint, a later process than its
    `mount`) removes the cache the blobfuse serving that mount point was given: the container's
    blobs do not stay in the temp dir after the experiment."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("the stand-in mounts a tmpfs, which needs root")
    private_tmp, bin_dir, mount_point = tmp_path / "tmp", tmp_path / "bin", tmp_path / "mnt"
    for d in (private_tmp, bin_dir):
        d.mkdir()
    (bin_dir / "blobfuse2").write_text(MOUNTING_STAND_IN.format(python=sys.executable))
    os.chmod(bin_dir / "blobfuse2", 0o755)
    storage = {"storageType": "AzureBlob", "remoteMountPoint": str(mount_point), "storageAccountName": "acct",
               "storageAccountKey": "a2V5", "containerName": "c1"}
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(private_tmp)}

    def helper(verb: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nni_agent.mounts", verb, str(mount_point)],
                              input=json.dumps(storage), capture_output=True, text=True, env=env, timeout=60)

    try:
        done = helper("mount")
        assert done.returncode == 0 and done.stdout.strip() == "mounted", done.stdout + done.stderr
        (cache,) = private_tmp.iterdir()  # kept while mounted: blobfuse works in it
        assert cache.name.startswith("nni-blobfuse-acct-c1-") and os.path.ismount(mount_point)
        (cache / "blob").write_text("a copy of a blob")
        done = helper("unmount")
        assert done.returncode == 0, done.stderr
        assert not os.path.ismount(mount_point)
        assert list(private_tmp.iterdir()) == []
    finally:
        if os.path.ismount(mount_point):
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_only_a_private_cache_this_user_made_is_removed(tmp_path: Path) -> None:
    """The cache's path comes from another process's command line: anything but this user's 0700
    nni-blobfuse-* directory stays."""
    from nni_agent.mounts import remove_cache

    ours = tmp_path / "nni-blobfuse-acct-c1-x1"
    ours.mkdir(mode=0o700)
    (ours / "blob").write_text("x")
    open_one = tmp_path / "nni-blobfuse-acct-c1-x2"
    open_one.mkdir()
    os.chmod(open_one, 0o755)
    other_name = tmp_path / "data"
    other_name.mkdir(mode=0o700)
    link = tmp_path / "nni-blobfuse-acct-c1-x3"
    link.symlink_to(other_name)
    assert [remove_cache(p) for p in (open_one, other_name, link, tmp_path / "nni-blobfuse-gone")] == [False] * 4
    assert open_one.is_dir() and other_name.is_dir() and link.is_symlink()
    assert remove_cache(ours) and not ours.exists()
