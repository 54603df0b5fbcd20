"""Run commands and place files on a machine over an open SSH connection (blocking; call from
worker threads). Secrets travel on stdin or through SFTP, never in a command line."""
from __future__ import annotations

import shlex
import threading

import paramiko

EXEC_TIMEOUT = 120.0


def run(client: paramiko.SSHClient, command: str, stdin: bytes | None = None,
        timeout: float = EXEC_TIMEOUT) -> tuple[int, str, str]:
    """Run `command` (a shell line) there; `stdin` (a script, a token) never goes to argv."""
    chan = client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
    chan.settimeout(timeout)
    chan.exec_command(command)
    if stdin is not None:
        chan.sendall(stdin)
    chan.shutdown_write()
    out, err = bytearray(), bytearray()
    stdout, stderr = chan.makefile("rb"), chan.makefile_stderr("rb")
    out += stdout.read()
    err += stderr.read()
    rc = chan.recv_exit_status()
    chan.close()
    return rc, out.decode(errors="replace"), err.decode(errors="replace")


def home_path(rel: str) -> str:
    """A shell word for ~/<rel> that survives any characters in rel."""
    return '"$HOME"/' + shlex.quote(rel)


class Sftp:
    """One SFTP session per connection, opened on first use and shared by threads (a lock:
    paramiko's SFTPClient is not safe for concurrent requests)."""

    def __init__(self, client: paramiko.SSHClient) -> None:
        self.client = client
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def _session(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    def put_private(self, path: str, data: bytes) -> None:
        """Write `data` to `path` as a file only its owner can read: the file is made 0600
        before the first byte is written, and replaced atomically."""
        with self._lock:
            sftp = self._session()
            tmp = f"{path}.part"
            with sftp.open(tmp, "wb") as f:
                f.chmod(0o600)
                f.write(data)
            sftp.posix_rename(tmp, path)

    def put_file(self, local: str, path: str, mode: int = 0o600) -> None:
        with self._lock:
            sftp = self._session()
            sftp.put(local, f"{path}.part")
            sftp.chmod(f"{path}.part", mode)
            sftp.posix_rename(f"{path}.part", path)

    def remove(self, path: str) -> bool:
        with self._lock:
            try:
                self._session().remove(path)
                return True
            except OSError:
                return False

    def close(self) -> None:
        with self._lock:
            if self._sftp is not None:
                self._sftp.close()
                self._sftp = None
