"""Shared-storage test beds: a real bind mount standing for a mounted share, and Azurite
(Microsoft's Azure Storage emulator, npm `azurite`) on loopback for the AzureBlob client."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
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


def _azurite(data: Path, extra: list[str], scheme: str) -> Iterator[str]:
    exe = shutil.which("azurite-blob")
    if exe is None:
        pytest.skip("azurite-blob not installed (scripts/test.sh installs it with npm)")
    port = _free_port()
    data.mkdir()
    proc = subprocess.Popen([exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data),
                             "--silent", "--skipApiVersionCheck", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90  # node starts in seconds, far slower beside the suite's parallel workers
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    if proc.poll() is None:
                        proc.kill()  # its stderr ends only with it: reading a live one's waited for pytest-timeout
                    pytest.fail(f"azurite did not start: {proc.communicate()[1].decode(errors='replace')[-500:]}")
                time.sleep(0.1)
        yield f"{scheme}://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def azurite(tmp_path: Path) -> Iterator[str]:
    """A running Azurite blob service on 127.0.0.1; yields its endpoint URL for the dev account."""
    yield from _azurite(tmp_path / "azurite", [], "http")


@dataclass(frozen=True)
class AzuriteTls:
    endpoint: str  # https://127.0.0.1:PORT/devstoreaccount1
    ca_file: str  # the CA that signed its certificate


@pytest.fixture
def azurite_oauth(tmp_path: Path) -> Iterator[AzuriteTls]:
    """Azurite over HTTPS with `--oauth basic`: it accepts Azure AD bearer tokens (issuer, audience
    https://storage.azure.com and expiry checked; signature and permission not: see
    tests/support/aml/emulator/storage_front.py) besides the account key."""
    from tests.support.emulator_serving import make_tls

    tls = tmp_path / "azurite-tls"
    tls.mkdir()
    make_tls(tls, ca_name="aml-emulator-ca", server_name="management.azure.emulator")
    for endpoint in _azurite(tmp_path / "azurite", ["--cert", str(tls / "server.crt"), "--key",
                                                    str(tls / "server.key"), "--oauth", "basic"], "https"):
        yield AzuriteTls(endpoint, str(tls / "ca.crt"))


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
