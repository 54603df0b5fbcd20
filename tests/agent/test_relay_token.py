"""`nni-agent --relay-token-file`: behind a relay the agent opens every connection with an HTTP
CONNECT carrying the experiment's relay token, also where the environment's `no_proxy` names the
relay's address (a cluster's `NO_PROXY=10.0.0.0/8,.svc` (not dialed) would make gRPC skip its proxy and send
its TLS ClientHello straight to a relay that drops it). A real agent process against a stand-in
relay on 127.0.0.1 that records the first bytes of each connection."""
from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.manager.helpers import until


def _recording_relay() -> tuple[socket.socket, list[bytes], threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))
    heads: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 4096:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    pass
                heads.append(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, heads, thread


def test_the_agent_proves_the_relay_token_even_where_no_proxy_names_the_relay(tmp_path: Path) -> None:
    server, heads, thread = _recording_relay()
    port = server.getsockname()[1]
    token_file, relay_file = tmp_path / "agent.token", tmp_path / "relay.token"
    token_file.write_text("agent-token\n")
    relay_file.write_text("the-experiments-relay-token-0123456789\n")
    env = dict(os.environ, no_proxy="127.0.0.1,localhost,.svc", NO_PROXY="127.0.0.1,localhost,.svc")
    env.pop("no_grpc_proxy", None)
    agent = subprocess.Popen([sys.executable, "-m", "nni_agent", "--manager", f"127.0.0.1:{port}", "--agent-id", "a1",
                              "--token-file", str(token_file), "--relay-token-file", str(relay_file),
                              "--work-dir", str(tmp_path / "work"), "--log-file", str(tmp_path / "agent.log")],
                             env=env, stdin=subprocess.DEVNULL)
    try:
        asyncio.run(until(lambda: len(heads) >= 2, 60, "two dials of the agent"))  # a redial proves it again
    finally:
        agent.kill()
        agent.wait(10)
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone leaves it blocked for good on Linux)
        server.close()
        thread.join(10)
    assert not thread.is_alive()  # no thread of this test outlives it
    proof = base64.b64encode(b"nni:the-experiments-relay-token-0123456789")
    for head in heads[:2]:
        assert head.startswith(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n".encode()), head
        assert b"Proxy-Authorization: Basic " + proof + b"\r\n" in head, head
    assert b"the-experiments-relay-token" not in (tmp_path / "agent.log").read_bytes()  # never in its log


def test_a_relay_token_file_that_holds_no_token_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "relay.token").write_text("\n")
    (tmp_path / "agent.token").write_text("t\n")
    out = subprocess.run([sys.executable, "-m", "nni_agent", "--manager", "127.0.0.1:1", "--agent-id", "a1",
                          "--token-file", str(tmp_path / "agent.token"), "--relay-token-file",
                          str(tmp_path / "relay.token"), "--work-dir", str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0 and "--relay-token-file" in out.stderr, out.stderr
