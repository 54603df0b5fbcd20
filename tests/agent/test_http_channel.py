"""NNI v3 HTTP trial command channel: PUT commands, long-poll GET, 408 when idle, 410 when gone."""
from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nni_agent.http_channel import HttpChannelServer
from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import Recorder, make_spec, new_trial, python_command, run, wait_until

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with _NO_PROXY.open(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, None


class Handler:
    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    def on_command(self, command: dict[str, Any]) -> None:
        self.commands.append(command)


class ParkedGets(threading.Condition):
    """The channel's condition, counting the GETs parked in it waiting for a command: a test
    acts once a GET is really waiting, instead of sleeping and hoping it is."""

    def __init__(self) -> None:
        super().__init__()
        self.parked = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.parked += 1  # under the lock: a send() cannot slip in before the wait
        try:
            return super().wait(timeout)
        finally:
            self.parked -= 1


@pytest.fixture
def server() -> Any:
    srv = HttpChannelServer()
    srv._cond = ParkedGets()  # before any request uses it
    srv.start()
    yield srv
    srv.close()


def test_put_reaches_handler_on_the_loop_and_get_is_fifo(server: HttpChannelServer) -> None:
    handler = Handler()
    url = server.url("env1", "trX")

    async def body() -> None:
        server.register("trX", handler)
        status, _ = await asyncio.to_thread(_request, "PUT", url, {"type": "metric", "metric": "{}"})
        assert status == 200
        await wait_until(lambda: handler.commands, 10, "the command to reach the handler on the loop")
        assert handler.commands == [{"type": "metric", "metric": "{}"}]
        server.send("trX", {"n": 1})
        server.send("trX", {"n": 2})
        assert await asyncio.to_thread(_request, "GET", url) == (200, {"n": 1})
        assert await asyncio.to_thread(_request, "GET", url) == (200, {"n": 2})
        assert (await asyncio.to_thread(_request, "GET", url))[0] == 408  # idle for ~1 s
        assert (await asyncio.to_thread(_request, "PUT", url, [1]))[0] == 400
        assert (await asyncio.to_thread(_request, "GET", server.url("env1", "nobody")))[0] == 410
        assert (await asyncio.to_thread(_request, "GET", f"http://127.0.0.1:{server.port}/other"))[0] == 404
        server.unregister("trX")
        assert (await asyncio.to_thread(_request, "PUT", url, {"type": "metric", "metric": "{}"}))[0] == 410
        assert (await asyncio.to_thread(_request, "GET", url))[0] == 410

    run(body)


def test_waiting_get_answers_when_a_command_arrives_and_410_on_close(server: HttpChannelServer) -> None:
    url = server.url("env1", "trY")

    async def body() -> None:
        server.register("trY", Handler())
        parked = server._cond
        get = asyncio.create_task(asyncio.to_thread(_request, "GET", url))
        await wait_until(lambda: parked.parked == 1, 10, "the GET to wait for a command")
        server.send("trY", {"type": "parameter", "parameter": "{}"})
        assert await get == (200, {"type": "parameter", "parameter": "{}"})
        assert parked.parked == 0
        get = asyncio.create_task(asyncio.to_thread(_request, "GET", url))
        await wait_until(lambda: parked.parked == 1, 10, "the second GET to wait")
        server.close()
        assert (await get)[0] == 410

    run(body)


TRIAL_CLIENT = """
import json, os, urllib.request
url = os.environ["NNI_TRIAL_COMMAND_CHANNEL"]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def put(cmd):
    opener.open(urllib.request.Request(url, data=json.dumps(cmd).encode(), method="PUT")).read()
def get():
    while True:
        try:
            return json.loads(opener.open(url).read())
        except urllib.error.HTTPError as e:
            if e.code != 408:
                raise
for index in range(3):
    put({"type": "request_parameter"})
    record = json.loads(get()["parameter"])
    metric = {"parameter_id": record["parameter_id"], "trial_job_id": os.environ["NNI_TRIAL_JOB_ID"],
              "type": "FINAL", "sequence": 0, "value": json.dumps(record["parameters"]["lr"])}
    put({"type": "metric", "metric": json.dumps(metric)})
"""


def test_trial_multi_phase_over_http(tmp_path: Path, server: HttpChannelServer) -> None:
    rec = Recorder()
    spec = make_spec(tmp_path, python_command(TRIAL_CLIENT))

    async def body() -> None:
        trial = new_trial(spec, tmp_path, rec, http=server)

        def answer(index: int) -> None:
            trial.send_parameter(index, json.dumps({"parameter_id": 10 + index, "parameter_index": index,
                                                    "parameters": {"lr": index / 10}}))

        rec.on_parameter_request = answer
        await trial.start()
        await trial.wait()

    run(body)
    assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, rec.stderr
    assert rec.parameter_requests == [1, 2]
    assert rec.metric_values() == [0.1, 0.1, 0.2]
    assert [json.loads(m)["parameter_id"] for m in rec.metrics] == [3, 11, 12]
    assert (tmp_path / "work/expABCDE/trials/trA01/parameter_2.cfg").is_file()
    status, _ = _request("GET", server.url("x", "trA01"))
    assert status == 410  # unregistered once the trial ended
