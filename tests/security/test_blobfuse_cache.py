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
