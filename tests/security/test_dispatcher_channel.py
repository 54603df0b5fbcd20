"""The tuner command channel (issue 20): NNI's real dispatcher process (`python -m nni`) on our
WebSocket, and a real WebSocket client as an intruder that found the port in /proc/net/tcp.

The intruder must be refused for its path (not merely because the dispatcher came first), a
second connection on the right URL must be refused too, and the URL's secret must stay out of
the dispatcher's argv and our logs.
"""
from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import secrets
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

NNI_MISSING = "" if importlib.util.find_spec("nni") else "the real nni package is not installed; pip install nni==3.0"
pytestmark = pytest.mark.skipif(bool(NNI_MISSING), reason=NNI_MISSING or "-")

SPACE = {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}}


class Events:
    def __init__(self) -> None:
        self.trials: list[str] = []
        self.more = asyncio.Event()

    def new_trial(self, record: str) -> None:
        self.trials.append(record)
        self.more.set()

    def no_more_trials(self) -> None:
        pass

    def kill_trial(self, trial_id: str) -> None:
        raise AssertionError(f"nobody asked to kill {trial_id}")


def _loopback_listeners() -> set[int]:
    """Ports of this process's sockets listening on 127.0.0.1, as an intruder reads them from
    /proc/net/tcp (it would probe them all; the test keeps to its own process's sockets)."""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[8:-1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        addr, port = local.split(":")
        if state == "0A" and inode in ours and socket.inet_ntoa(struct.pack("=I", int(addr, 16))) == "127.0.0.1":
            ports.add(int(port, 16))
    return ports


async def _handshake_status(url: str) -> int:
    """101 when the WebSocket opened (then closed at once), else the refusal's HTTP status."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(url)
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        await ws.close()
        return 101


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def _scenario(tmp_path: Path) -> dict[str, Any]:
    from nni_manager.dispatcher.nni_process import NniDispatcher

    before = _loopback_listeners()
    params = {"experimentType": "hpo", "trialConcurrency": 1,
              "tuner": {"name": "Random", "classArgs": {"optimize_mode": "maximize"}}}
    dispatcher = NniDispatcher("Random", "maximize", params, log_dir=tmp_path / "log",
                               checkpoint_dir=tmp_path / "checkpoint")
    events = Events()
    starting = asyncio.create_task(dispatcher.start(events, SPACE, []))
    out: dict[str, Any] = {}
    try:
        new: set[int] = set()
        while not new:  # the channel's port, as soon as it listens (the dispatcher is still importing nni)
            assert not starting.done(), starting
            new = _loopback_listeners() - before
            await asyncio.sleep(0.01)
        (port,) = new
        out["first"] = await _handshake_status(f"ws://127.0.0.1:{port}/tuner")  # NNI's well-known path
        out["guess"] = await _handshake_status(f"ws://127.0.0.1:{port}/tuner/{secrets.token_urlsafe(32)}")
        await starting  # the real dispatcher still connects and initializes
        dispatcher.request_trials(2)
        while len(events.trials) < 2:
            events.more.clear()
            await asyncio.wait_for(events.more.wait(), 120)
        out["trials"] = list(events.trials)

        assert dispatcher.proc is not None
        url = _environ(dispatcher.proc.pid)["NNI_TUNER_COMMAND_CHANNEL"]
        out["url"] = url
        out["argv"] = Path(f"/proc/{dispatcher.proc.pid}/cmdline").read_bytes().decode()
        out["second"] = await _handshake_status(url)  # the right URL, but the dispatcher holds it
        out["error"] = dispatcher.error
    finally:
        if not starting.done():
            starting.cancel()
        await dispatcher.stop()
    return out


def test_intruder_is_refused_and_the_real_dispatcher_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    out = asyncio.run(_scenario(tmp_path))
    assert out["first"] == 404, out  # refused for its path: not obeyed, not merely second (409)
    assert out["guess"] == 404, out
    assert len(out["trials"]) == 2 and all('"x"' in t for t in out["trials"])
    assert out["second"] == 409 and out["error"] is None, out

    secret = out["url"].rsplit("/", 1)[1]
    assert out["url"].startswith("ws://127.0.0.1:") and "/tuner/" in out["url"] and len(secret) >= 40
    assert secret not in out["argv"]  # the URL travels in the environment, never argv
    assert "refused a tuner channel connection" in caplog.text and secret not in caplog.text


async def _one_trial(tmp_path: Path) -> list[str]:
    from nni_manager.dispatcher.nni_process import NniDispatcher

    params = {"experimentType": "hpo", "trialConcurrency": 1, "tuner": {"name": "Random"}}
    dispatcher = NniDispatcher("Random", "maximize", params, log_dir=tmp_path / "log",
                               checkpoint_dir=tmp_path / "checkpoint")
    events = Events()
    try:
        await asyncio.wait_for(dispatcher.start(events, SPACE, []), 120)
        dispatcher.request_trials(1)
        await asyncio.wait_for(events.more.wait(), 120)
    finally:
        await dispatcher.stop()
    return events.trials


def test_the_channel_never_goes_through_the_users_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a corporate proxy (HTTPS_PROXY set, NO_PROXY not naming 127.0.0.1) the dispatcher's
    websockets client would ask the proxy for our loopback channel, which it cannot reach."""
    with socket.socket() as s:  # a port where no proxy listens: any use of it fails
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    for var in ("NO_PROXY", "no_proxy", "http_proxy", "https_proxy", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("NO_PROXY", "localhost,.svc")
    trials = asyncio.run(_one_trial(tmp_path))
    assert len(trials) == 1 and '"x"' in trials[0], trials
