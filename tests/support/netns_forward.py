"""A "laptop": a network namespace of the test's own holding only `lo`, from which one TCP port on
the root namespace's loopback is reachable, as kind publishes its API server on the host's
127.0.0.1 (test-infrastructure.md §1 and §3: loopback only, deleted at the end).

    with Laptop("laptop-<id>") as lap:
        port = lap.forward(api_port)   # 127.0.0.1:port inside -> 127.0.0.1:api_port in the root namespace
        subprocess.run(lap.exec(["nni-manager", "run", "config.yml"]))

The listening socket is made inside the namespace by a thread that enters it and comes back
(tests/support/kube/emulator/podnet.py, `NetnsSockets`); each accepted connection is copied to the
target dialled from the root namespace, so nothing else of the root namespace is in reach.
"""
from __future__ import annotations

import asyncio
import subprocess
import threading
from typing import Sequence

from tests.support.kube.emulator.podnet import NetnsSockets, serve_forward


class Laptop:
    def __init__(self, name: str) -> None:
        self.name = name
        self.path = f"/run/netns/{name}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sockets = NetnsSockets()
        self._servers: list[asyncio.AbstractServer] = []
        self.connections = 0  # connections forwarded so far

    def __enter__(self) -> "Laptop":
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        try:
            subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, capture_output=True)
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name=f"forward-{self.name}", daemon=True)
            self._thread.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exec(self, argv: Sequence[str]) -> list[str]:
        """argv run inside the namespace (a process started there stays there, with its children)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def interfaces(self) -> list[str]:
        out = subprocess.run(["ip", "-n", self.name, "-o", "link"], capture_output=True, text=True, check=True).stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.strip()]

    def forward(self, target_port: int, host: str = "127.0.0.1") -> int:
        """Listen on `host` (a loopback address) inside the namespace; copy each connection to
        127.0.0.1:target_port in the root namespace. Returns the port inside."""
        assert self._loop is not None and host.startswith("127.")
        return asyncio.run_coroutine_threadsafe(self._forward(target_port, host), self._loop).result(10)

    async def _forward(self, target_port: int, host: str) -> int:
        sock = await self._sockets.socket(self.path)
        sock.bind((host, 0))
        sock.listen(128)
        sock.setblocking(False)

        def counted() -> None:
            self.connections += 1

        self._servers.append(await serve_forward(sock, target_port, counted))
        return sock.getsockname()[1]

    def close(self) -> None:
        if self._loop is not None:
            async def stop() -> None:
                for s in self._servers:
                    s.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            assert self._thread is not None
            self._thread.join(10)
            self._loop.close()
            self._loop = None
        self._sockets.close()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
