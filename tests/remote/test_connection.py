"""Connecting: host keys, key and password auth, proxyCommand, precise errors."""
from __future__ import annotations

import base64
import dataclasses
import subprocess

import paramiko
import pytest

from nni_manager.backends.remote.config import MachineConfig
from nni_manager.backends.remote.bootstrap import run
from nni_manager.ssh.connection import SshError, connect, fingerprint, proxy_command_line

pytestmark = pytest.mark.ssh


def test_key_auth_and_exec(plain_sshd):
    """The SSH tests log in as their session's own user, never root: its agents stay out of root's
    home, so these tests can run on any xdist worker (tests/support/parallel.py)."""
    assert plain_sshd.machine.user != "root" and not plain_sshd.home.is_relative_to("/root")
    client = connect(plain_sshd.machine)
    try:
        assert run(client, "id -un; echo $HOME") == (0, f"{plain_sshd.machine.user}\n{plain_sshd.home}\n", "")
    finally:
        client.close()


def test_password_auth(plain_sshd, password_user):
    user, password = password_user
    m = dataclasses.replace(plain_sshd.machine, user=user, password=password, ssh_key_file=None)
    client = connect(m)
    try:
        assert run(client, "id -un")[1].strip() == user
    finally:
        client.close()


def test_wrong_password_is_precise_and_secret_free(plain_sshd, password_user):
    user, password = password_user
    wrong = password + "x"
    m = dataclasses.replace(plain_sshd.machine, user=user, password=wrong, ssh_key_file=None)
    with pytest.raises(SshError) as e:
        connect(m)
    msg = str(e.value)
    assert f"{user}@127.0.0.1:{plain_sshd.port}" in msg and "password was rejected" in msg
    assert wrong not in msg


def test_unknown_host_key_shows_fingerprint_and_fix(plain_sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SshError) as e:
        connect(dataclasses.replace(plain_sshd.machine, known_hosts_file=empty))
    msg = str(e.value)
    key = paramiko.Ed25519Key.from_private_key_file(str(_hostkey(plain_sshd)))
    assert "not known" in msg and fingerprint(key) in msg
    assert f"ssh-keyscan -p {plain_sshd.port} 127.0.0.1 >> {empty}" in msg
    assert f"[127.0.0.1]:{plain_sshd.port} ssh-ed25519 {key.get_base64()}" in msg


def test_changed_host_key_is_refused_with_both_fingerprints(plain_sshd, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    other_pub = (tmp_path / "other.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{plain_sshd.port} {' '.join(other_pub)}\n")
    with pytest.raises(SshError) as e:
        connect(dataclasses.replace(plain_sshd.machine, known_hosts_file=kh))
    msg = str(e.value)
    real = paramiko.Ed25519Key.from_private_key_file(str(_hostkey(plain_sshd)))
    expected = paramiko.Ed25519Key(data=base64.b64decode(other_pub[1]))
    assert "HOST KEY CHANGED" in msg and fingerprint(real) in msg and fingerprint(expected) in msg
    assert "ssh-keygen -R" in msg


def test_strict_checking_off_accepts_unknown_key(plain_sshd, tmp_path):
    m = dataclasses.replace(plain_sshd.machine, known_hosts_file=tmp_path / "missing", strict_host_key_checking=False)
    client = connect(m)
    client.close()


def test_connection_refused_names_machine(plain_sshd):
    m = dataclasses.replace(plain_sshd.machine, port=1)
    with pytest.raises(SshError, match=rf"{m.user}@127\.0\.0\.1:1: cannot connect"):
        connect(m)


def test_proxy_command_through_netns(netns_hosts):
    host = netns_hosts[0]
    client = connect(host.machine)
    try:
        # inside the namespace only lo exists
        rc, out, _ = run(client, "ls /sys/class/net")
        assert rc == 0 and out.split() == ["lo"]
    finally:
        client.close()


def test_proxy_command_tokens():
    m = MachineConfig(host="h", port=2222, user="u", proxy_command="ssh -W %h:%p %r@bastion 100%%")
    assert proxy_command_line(m) == "ssh -W h:2222 u@bastion 100%"
    with pytest.raises(SshError, match="unknown token %x"):
        proxy_command_line(dataclasses.replace(m, proxy_command="nc %x"))


def _hostkey(host):
    return host.machine.ssh_key_file.parent / "hostkey"


def test_proxy_command_dies_with_the_manager(tmp_path):
    """A relay must not outlive a SIGKILLed manager: it would hold the SSH session open.
    (It is spawned from a long-lived worker thread, as the backend's connects are.)"""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import threading, time, grpc\n"
         "from nni_manager.ssh.connection import _ProxyCommand\n"
         "channel = grpc.insecure_channel('127.0.0.1:9')\n"  # gRPC running, as in the manager
         "grpc.channel_ready_future(channel)\n"
         "box = []\n"
         "def worker():\n"
         "    box.append(_ProxyCommand('sleep 300'))\n"
         "    time.sleep(300)\n"
         "threading.Thread(target=worker, daemon=True).start()\n"
         "while not box: time.sleep(0.01)\n"
         "print(box[0].process.pid, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True)
    relay = psutil.Process(int(owner.stdout.readline()))
    time.sleep(0.3)
    assert relay.is_running() and relay.status() != psutil.STATUS_ZOMBIE  # alive while the manager lives
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 10
    while relay.is_running() and relay.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the proxy command outlived its manager"
        time.sleep(0.05)
