"""Unmodified NNI trial code (the real `nni` 3.0 package) through each of its three channels.

The trials of one test run concurrently: importing nni takes seconds.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

from nni_agent.http_channel import HttpChannelServer
from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import Recorder, make_spec, new_trial, python_command, run

# find_spec, not import: importing nni takes seconds, and the trials import it anyway
NNI_MISSING = "" if importlib.util.find_spec("nni") else "the real nni package is not installed; pip install nni==3.0"

pytestmark = [pytest.mark.nni_sdk, pytest.mark.skipif(bool(NNI_MISSING), reason=NNI_MISSING or "-")]

NNI_TRIAL = """
import nni
params = nni.get_next_parameter()
for i in range(3):
    nni.report_intermediate_result(params["lr"] * i)
nni.report_final_result({"default": params["lr"], "note": "it's done"})
"""

NNI_MULTI_PHASE_TRIAL = """
import nni
first = nni.get_next_parameter()
nni.report_intermediate_result(first["lr"])
second = nni.get_next_parameter()
nni.report_final_result(second["lr"])
"""

# channel name -> (StartTrial fields, whether the agent's HTTP channel is offered)
CHANNELS = {
    "file": ({"platform": "local"}, False),
    "stdout": ({"platform": "remote"}, False),
    "http": ({"platform": "local"}, True),
}


def _run_channels(tmp_path: Path, script: str, channels: list[str]) -> dict[str, Recorder]:
    recs = {name: Recorder() for name in channels}
    server = HttpChannelServer()
    server.start()

    async def one(name: str) -> None:
        fields, use_http = CHANNELS[name]
        spec = make_spec(tmp_path / name, python_command(script), trial_id=f"t{name}", **fields)
        (tmp_path / name).mkdir()
        trial = new_trial(spec, tmp_path / name, recs[name], http=server if use_http else None)
        recs[name].on_parameter_request = lambda index: trial.send_parameter(
            index, json.dumps({"parameter_id": 20 + index, "parameter_source": "algorithm",
                               "parameters": {"lr": 0.5}, "parameter_index": index}))
        await trial.start()
        await trial.wait()

    async def body() -> None:
        await asyncio.gather(*(one(name) for name in channels))

    try:
        run(body, timeout=120)
    finally:
        server.close()
    return recs


def test_unmodified_nni_trial_through_each_channel(tmp_path: Path) -> None:
    recs = _run_channels(tmp_path, NNI_TRIAL, list(CHANNELS))
    for name, rec in recs.items():
        assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, (name, rec.terminal.reason, rec.stderr[-2000:])
        metrics = [json.loads(m) for m in rec.metrics]
        assert [(m["type"], m["sequence"], m["parameter_id"], m["trial_job_id"]) for m in metrics] == [
            ("PERIODICAL", 0, 3, f"t{name}"), ("PERIODICAL", 1, 3, f"t{name}"), ("PERIODICAL", 2, 3, f"t{name}"),
            ("FINAL", 0, 3, f"t{name}")], name
        assert rec.metric_values() == [0.0, 0.1, 0.2, {"default": 0.1, "note": "it's done"}], name
        assert rec.parameter_requests == [], name
    # each trial really used its channel
    def metrics_file(name: str) -> Path:
        return tmp_path / name / "work" / "expABCDE" / "trials" / f"t{name}" / ".nni" / "metrics"

    assert b"NNISDK_MEb'" in recs["stdout"].stdout
    assert b"NNISDK_MEb'" not in recs["file"].stdout + recs["http"].stdout
    assert metrics_file("file").stat().st_size > 0
    assert not metrics_file("http").exists()


def test_nni_multi_phase_over_file_and_http_channels(tmp_path: Path) -> None:
    recs = _run_channels(tmp_path, NNI_MULTI_PHASE_TRIAL, ["file", "http"])
    for name, rec in recs.items():
        assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, (name, rec.terminal.reason, rec.stderr[-2000:])
        assert rec.parameter_requests == [1], name
        assert rec.metric_values() == [0.1, 0.5], name
        assert [json.loads(m)["parameter_id"] for m in rec.metrics] == [3, 21], name
