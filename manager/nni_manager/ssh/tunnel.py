"""Remote port forward carried by an SSH connection: worker 127.0.0.1:<port> -> the hub.

The agent on the worker dials 127.0.0.1:<port> on its own loopback; sshd forwards each
connection over the SSH link and we pump it to the hub's TCP address on the manager host.
Workers need no route to the manager. Each forwarded connection is pumped in its own
thread, never in paramiko's transport thread.
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading
from typing import cast

import paramiko

log = logging.getLogger(__name__)

_CHUNK = 65536


class RemoteForward:
    """Forward worker-side 127.0.0.1:`port` to `target` (host, port) through `transport`."""

    def __init__(self, transport: paramiko.Transport, target: tuple[str, int]) -> None:
        self.transport = transport
        self.target = target
        self.port = 0

    def open(self, port: int = 0) -> int:
        """Bind on the worker (port 0: any free one); raises paramiko.SSHException if refused."""
        self.port = self.transport.request_port_forward("127.0.0.1", port, handler=self._on_channel)
        return self.port

    def close(self) -> None:
        if self.port and self.transport.is_active():
            try:
                self.transport.cancel_port_forward("127.0.0.1", self.port)
            except (paramiko.SSHException, EOFError, OSError):
                pass

    def _on_channel(self, channel: paramiko.Channel, origin: tuple[str, int], server: tuple[str, int]) -> None:
        threading.Thread(target=self._pump, args=(channel,), name=f"tunnel-{self.port}", daemon=True).start()

    def _pump(self, channel: paramiko.Channel) -> None:
        try:
            sock = socket.create_connection(self.target, timeout=5)
        except OSError as e:
            log.warning("tunnel %s: cannot reach hub at %s:%s: %s", self.port, *self.target, e)
            channel.close()
            return
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sel = selectors.DefaultSelector()
        sel.register(channel, selectors.EVENT_READ, sock)
        sel.register(sock, selectors.EVENT_READ, channel)
        try:
            while True:
                for key, _ in sel.select():
                    src, dst = cast("paramiko.Channel | socket.socket", key.fileobj), key.data
                    data = src.recv(_CHUNK)
                    if not data:
                        return
                    dst.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            return
        finally:
            sel.close()
            sock.close()
            channel.close()
