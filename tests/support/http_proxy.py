"""A real HTTP CONNECT proxy for tests: Debian's tinyproxy (`apt-get install tinyproxy`, scripts/test.sh),
listening on the root namespace's 127.0.0.1 only, with a config and log of its own. A corporate
proxy as users meet it: CONNECT is all it offers the manager (tests put the manager in a network
namespace whose only way out is this proxy, tests/support/netns_forward.py).

    with TinyProxy(tmp_dir) as proxy:
        proxy.port, proxy.connects()   # CONNECT requests it received, as "host:port" strings
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.stopping import terminate

BINARY = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"


def available() -> bool:
    return Path(BINARY).is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TinyProxy:
    def __init__(self, base: Path, auth: tuple[str, str] | None = None) -> None:
        self.auth = auth  # (user, password): Proxy-Authorization Basic required, as most corporate proxies do
        self.dir = base / "tinyproxy"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "tinyproxy.log"
        self.port = 0
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "TinyProxy":
        for _ in range(5):  # the port is picked free, then bound by tinyproxy: retry a lost race
            self.port = _free_port()
            conf = self.dir / "tinyproxy.conf"
            # no ConnectPort line: CONNECT to any port (the API server's is not 443 here); no Allow
            # line: any client (it listens on loopback only); LogLevel Connect logs each CONNECT
            conf.write_text(f"Port {self.port}\nListen 127.0.0.1\nBind 127.0.0.1\nTimeout 600\n"
                            f"LogFile \"{self.log}\"\nLogLevel Connect\nMaxClients 200\n"
                            f"PidFile \"{self.dir / 'tinyproxy.pid'}\"\n"
                            + ("User root\nGroup root\n" if os.geteuid() == 0 else "")  # as root it wants one named
                            + (f"BasicAuth {self.auth[0]} {self.auth[1]}\n" if self.auth else ""))
            conf.chmod(0o600)  # it may hold the password
            self.log.write_text("")
            self._proc = subprocess.Popen([BINARY, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                    return self
                except OSError:
                    time.sleep(0.05)
            self.close()
        raise RuntimeError(f"tinyproxy did not start: {self.log.read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc is not None:
            terminate(self._proc)
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            self._proc = None

    def connects(self) -> list[str]:
        """The CONNECT requests it received ("host:port"), from its log, authorized or not."""
        return re.findall(r'CONNECT ([^ ]+) HTTP', self.log.read_text(errors="replace"))

    def established(self) -> int:
        """Tunnels it opened (CONNECT accepted: authorized, and the target answered)."""
        return self.log.read_text(errors="replace").count("Established connection to host")
