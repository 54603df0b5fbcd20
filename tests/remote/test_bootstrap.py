"""Bootstrap over real SSH: Python discovery, install from the manager's wheel, reuse."""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nni_manager.backends.remote import bootstrap
from nni_manager.backends.remote.bootstrap import BootstrapError
from nni_manager.ssh.connection import connect
from nni_manager.backends.agent_wheel import build_agent_wheel

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_agent_wheel(tmp_path_factory.mktemp("wheel"))


def test_no_usable_python_is_precise(plain_sshd, worker_dir, wheel):
    fake = worker_dir / "fakepy"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 3.7.16 /opt/old/python3\n")
    (fake / "python").write_text("#!/bin/sh\necho 'Python 2.7.18' >&2\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    client = connect(plain_sshd.machine)
    try:
        with pytest.raises(BootstrapError) as e:
            bootstrap.probe(client, str(fake), wheel.tag, None)
    finally:
        client.close()
    msg = str(e.value)
    assert f"no Python >= 3.8 found in pythonPath {fake}" in msg
    assert f"{fake}/python3: Python 3.7.16 is older than 3.8" in msg
    assert f"{fake}/python: Python 2.7.18" in msg


def test_missing_python_path_dir(plain_sshd, wheel):
    client = connect(plain_sshd.machine)
    try:
        with pytest.raises(BootstrapError, match=r"/nonexistent/bin/python3: \(not found\)"):
            bootstrap.probe(client, "/nonexistent/bin", wheel.tag, None)
    finally:
        client.close()


def test_install_from_wheel_then_reuse(plain_sshd, wheel):
    target = plain_sshd.home / ".nni-agent" / wheel.tag
    shutil.rmtree(target, ignore_errors=True)  # prove a fresh install (the tag is content-addressed)
    client = connect(plain_sshd.machine)
    try:
        found = bootstrap.probe(client, plain_sshd.machine.python_path, wheel.tag, None)
        assert not found.installed and found.python.startswith(plain_sshd.machine.python_path)
        bootstrap.install(client, found, wheel)
        assert (target / "lib" / "nni_agent" / "v1" / "agent_pb2.py").is_file()
        assert oct(target.stat().st_mode & 0o777) == "0o700"
        assert not list(target.glob(".upload-*"))  # the uploaded wheel is removed
        again = bootstrap.probe(client, plain_sshd.machine.python_path, wheel.tag, None)
        assert again.installed  # fast path: no upload next time
        rc, out, err = bootstrap.run(
            client, f'PYTHONPATH="$HOME/.nni-agent/{wheel.tag}/lib" {found.python} -m nni_agent --version')
        assert (rc, out.strip()) == (0, f"nni-agent {wheel.version}"), err
    finally:
        client.close()


def test_missing_dependencies_named_exactly(netns_hosts, password_user, wheel):
    """A system Python without grpc etc. inside a host with no index access."""
    if not Path("/usr/bin/python3").exists():
        pytest.skip("needs /usr/bin/python3")
    user, password = password_user
    m = dataclasses.replace(netns_hosts[1].machine, user=user, password=password, ssh_key_file=None,
                            python_path="/usr/bin")
    client = connect(m)
    try:
        found = bootstrap.probe(client, m.python_path, wheel.tag, None)
        if found.installed:
            pytest.skip("the user's Python already has the agent's dependencies")
        with pytest.raises(BootstrapError) as e:
            bootstrap.install(client, found, wheel)
    finally:
        client.close()
    msg = str(e.value)
    assert "/usr/bin/python3 cannot import the agent's dependencies" in msg
    assert "grpc (ModuleNotFoundError" in msg
    assert "pip install` could not add them" in msg
    assert re.search(r"'grpcio[<>=,.0-9]*>=[0-9.]+[^']*'", msg)  # the exact fix names the required range


def test_dependency_of_an_unsupported_version_is_one_line(netns_hosts, password_user, wheel):
    """A worker Python whose grpcio imports but is too old (its metadata says 1.30.0), on a host that
    reaches no index (and a fresh user: no pip cache either): the install names the version and the
    range (the agent's boot step checks them), in one line, instead of an agent that dies later."""
    user, password = password_user
    venv = Path(tempfile.mkdtemp(prefix="nni-old-grpcio-")) / "venv"
    venv.parent.chmod(0o755)  # the worker's user reads it
    if not Path("/usr/bin/python3").exists() or sys.version_info[:2] != (3, 11):
        pytest.skip("needs /usr/bin/python3 of this Python's minor (it borrows this venv's grpcio)")
    # the system's Python: a worker's user can run it (this venv's interpreter lives under /root)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3.*/site-packages")
    real = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "grpc").is_dir())
    (site / "real.pth").write_text(real + "\n")  # the real grpcio, protobuf, psutil ...
    info = site / "grpcio-1.30.0.dist-info"  # ... but the first metadata found says 1.30.0
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: grpcio\nVersion: 1.30.0\n")
    m = dataclasses.replace(netns_hosts[1].machine, user=user, password=password, ssh_key_file=None,
                            python_path=str(venv / "bin"))
    client = connect(m)
    try:
        found = bootstrap.probe(client, m.python_path, wheel.tag, None)
        with pytest.raises(BootstrapError) as e:
            bootstrap.install(client, found, wheel)
    finally:
        client.close()
        shutil.rmtree(venv.parent, ignore_errors=True)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"{venv}/bin/python3 has versions of the agent's dependencies it does not support: grpcio 1.30.0 is " \
           "older than 1.49.1; `pip install` could not add them: " in msg, msg
    assert "-m pip install --user 'grpcio<2,>=1.49.1'" in msg, msg  # the fix, with the range
