"""The port search, loopback binding, and the `.experiment` manifest with NNI's lock protocol."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nni_manager.webui import manifest
from nni_manager.webui.server import _listen

from tests.support.webui.fixtures import needs_nni


def test_taken_port_moves_to_the_next_free_one_on_loopback() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        sock = _listen("127.0.0.1", port)
    finally:
        taken.close()
    try:
        assert sock.getsockname() == ("127.0.0.1", sock.getsockname()[1]) and sock.getsockname()[1] > port
    finally:
        sock.close()


def test_manifest_waits_for_a_fresh_lock_and_ignores_a_stale_one(tmp_path: Path) -> None:
    path = tmp_path / ".experiment"
    other = tmp_path / ".experiment.lock.999999"
    other.write_text("")
    started = time.monotonic()
    holder = subprocess.Popen([sys.executable, "-c", f"import time, os; time.sleep(0.6); os.remove({str(other)!r})"])
    manifest.register({"id": "abc", "status": "RUNNING", "pid": os.getpid()}, path)
    holder.wait()
    assert time.monotonic() - started >= 0.5  # it waited for the other writer's lock to go
    assert manifest.read(path)["abc"]["status"] == "RUNNING"
    other.write_text("")
    old = time.time() - 10
    os.utime(other, (old, old))  # a lock left by a crash: older than 2 s, not waited for
    manifest.set_fields("abc", path, status="DONE", port=None)
    assert manifest.read(path)["abc"] == {"id": "abc", "status": "DONE", "pid": os.getpid()}
    assert not list(tmp_path.glob(f".experiment.lock.{os.getpid()}"))


def test_experiments_info_marks_dead_managers_stopped(tmp_path: Path) -> None:
    path = tmp_path / ".experiment"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    manifest.register({"id": "gone", "status": "RUNNING", "pid": dead.pid, "port": 8080}, path)
    manifest.register({"id": "here", "status": "RUNNING", "pid": os.getpid(), "port": 8081}, path)
    info = {e["id"]: e for e in manifest.experiments_info(path)}
    assert info["gone"]["status"] == "STOPPED" and "port" not in info["gone"]
    assert info["here"]["status"] == "RUNNING" and info["here"]["port"] == 8081
    assert manifest.read(path)["gone"]["status"] == "STOPPED"  # written back, as NNI does


@needs_nni
def test_nnictl_reads_our_manifest(tmp_path: Path, home: Path) -> None:
    from tests.support.webui.experiments import nnictl

    manifest.register({"id": "mine0001", "port": 1, "startTime": 1795000000000, "endTime": "N/A",
                       "status": "RUNNING", "platform": "local", "experimentName": "x", "tag": [],
                       "pid": os.getpid(), "webuiUrl": [], "logDir": str(tmp_path), "prefixUrl": None})
    listed = nnictl(home, "experiment", "list")
    assert "mine0001" in listed.stdout and "RUNNING" in listed.stdout, listed


@pytest.mark.parametrize("prefix,expected", [("", ""), ("/nni/", "nni"), ("a/b", "a/b")])
def test_url_prefix_normalised_as_nni(prefix: str, expected: str) -> None:
    from nni_manager.webui.server import normalise_prefix

    assert normalise_prefix(prefix) == expected
