"""Ids and names from less trusted places (issue 20): the agent's HTTP trial channel serves only
the URL handed to the trial (a per-trial secret as its env segment), trial ids from agents are
single safe file names, and an unreadable `~/nni-experiments/.experiment` is never rewritten.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nni_agent.http_channel import HttpChannelServer
from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import AGENT_KEY, python_command, run_trial
from tests.support.security.rest_server import stored  # noqa: F401  (the fixture)
from tests.support.webui.fixtures import ServerThread as Served
from tests.support.bounded import run_bounded

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(method: str, url: str, body: Any = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with _NO_PROXY.open(req, timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _metric(value: float) -> dict[str, str]:
    metric = {"parameter_id": 3, "trial_job_id": "trA01", "type": "FINAL", "sequence": 0, "value": json.dumps(value)}
    return {"type": "metric", "metric": json.dumps(metric)}


class Handler:
    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    def on_command(self, command: dict[str, Any]) -> None:
        self.commands.append(command)


# ---------------------------------------------------------------------------- the HTTP channel
def test_channel_serves_only_the_url_given_to_the_trial() -> None:
    server = HttpChannelServer()
    server.start()
    try:
        handler = Handler()

        async def body() -> None:
            url = server.url("s3cret-env-segment", "abcde")
            server.register("abcde", handler)
            base = f"http://127.0.0.1:{server.port}"
            server.send("abcde", {"type": "parameter", "parameter": "mine"})
            for env in ("local", AGENT_KEY, "s3cret-env-segmenT", ".."):  # guesses at the env segment
                assert await asyncio.to_thread(_request, "PUT", f"{base}/env/{env}/abcde", _metric(666)) == 404
                assert await asyncio.to_thread(_request, "GET", f"{base}/env/{env}/abcde") == 404
            assert await asyncio.to_thread(_request, "PUT", url, _metric(0.5)) == 200
            assert await asyncio.to_thread(_request, "GET", url) == 200  # the queued reply was not taken
            await asyncio.sleep(0)  # the PUT's call_soon_threadsafe hop
            while not handler.commands:
                await asyncio.sleep(0.01)

        run_bounded(body(), 30)
        assert handler.commands == [_metric(0.5)]
    finally:
        server.close()


_TRIAL = """
import json, os, pathlib, time, urllib.request
d = pathlib.Path(os.environ['NNI_SYS_DIR'])
(d / 'ready').write_text('')
while not (d / 'go').exists():
    time.sleep(0.02)
metric = json.dumps({'parameter_id': 3, 'trial_job_id': 'trA01', 'type': 'FINAL', 'sequence': 0, 'value': '0.25'})
req = urllib.request.Request(os.environ['NNI_TRIAL_COMMAND_CHANNEL'], method='PUT',
                             data=json.dumps({'type': 'metric', 'metric': metric}).encode())
urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req).read()
"""


def test_a_running_trial_cannot_be_spoken_for(tmp_path: Path) -> None:
    """A real trial under the agent's Trial; an intruder knows the port and the trial id."""
    server = HttpChannelServer()
    server.start()
    sys_dir = tmp_path / "work" / "expABCDE" / "trials" / "trA01"
    intruder: dict[str, Any] = {}

    def intrude() -> None:
        deadline = time.monotonic() + 60
        while not (sys_dir / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{server.port}"
        intruder["statuses"] = [_request("PUT", f"{base}/env/{env}/trA01", _metric(666))
                                for env in (AGENT_KEY, "local", "x")]
        (sys_dir / "go").write_text("")

    thread = threading.Thread(target=intrude, daemon=True)
    thread.start()
    try:
        rec, _ = run_trial(tmp_path, python_command(_TRIAL), http=server)
    finally:
        thread.join(10)
        server.close()
    assert rec.terminal is not None and rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, (rec.terminal, rec.stderr)
    assert intruder["statuses"] == [404, 404, 404]
    assert rec.metric_values() == [0.25]  # the trial's own metric only


# ---------------------------------------------------------------------------- ids from agents
def test_trial_ids_from_agents_are_single_safe_names() -> None:
    from nni_manager.hub.server import safe_id

    for good in ("trA01", "a.b", "x-y_z", "..a", "A" * 255):
        assert safe_id(good), good
    for bad in ("", ".", "..", "...", "abc\n", "a/b", "../x", "a b", "A" * 256, "tr\x00"):
        assert not safe_id(bad), repr(bad)


# ---------------------------------------------------------------------------- the manifest
def test_unreadable_manifest_is_left_alone(stored: Path, tmp_path: Path,  # noqa: F811
                                           monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    path = home / "nni-experiments" / ".experiment"
    path.parent.mkdir(parents=True)
    others = {"other001": {"id": "other001", "status": "RUNNING", "port": 8080, "pid": 1}}
    damaged = (json.dumps(others) + "\n\x00 a second writer's half line").encode()
    path.write_bytes(damaged)
    caplog.set_level(logging.WARNING)
    with Served(stored, register=True) as srv:  # a real server registering itself
        status = _request("GET", f"http://127.0.0.1:{srv.port}/api/v1/nni/experiment-metadata")
        assert status == 200  # serving goes on without its entry
    assert path.read_bytes() == damaged  # the other experiments' entries are still there to repair
    assert "not updating" in caplog.text and str(path) in caplog.text

    path.unlink()  # a missing file is simply created, as before
    with Served(stored, register=True):
        assert "synth001" in json.loads(path.read_text())
