"""Shared-storage test beds: a real bind mount standing for a mounted share, and Azurite
(Microsoft's Azure Storage emulator, npm `azurite`) on loopback for the AzureBlob client."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

# Azurite's documented development account (public, fixed: not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def azurite(tmp_path: Path) -> Iterator[str]:
    """A running Azurite blob service on 127.0.0.1; yields its endpoint URL for the dev account."""
    exe = shutil.which("azurite-blob")
    if exe is None:
        pytest.skip("azurite-blob not installed (scripts/test.sh installs it with npm)")
    port = _free_port()
    data = tmp_path / "azurite"
    data.mkdir()
    proc = subprocess.Popen([exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data),
                             "--silent", "--skipApiVersionCheck"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"azurite did not start: {proc.stderr.read().decode(errors='replace')[-500:]}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def bind_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(export, mount point): a real directory mounted (mount --bind) at another path, as a share the
    user mounted on a worker. Needs root (CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a bind mount needs root and mount(8)")
    export, mount_point = tmp_path / "export", tmp_path / "mnt"
    export.mkdir()
    mount_point.mkdir()
    result = subprocess.run(["mount", "--bind", str(export), str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {result.stderr.strip()}")
    try:
        yield export, mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
