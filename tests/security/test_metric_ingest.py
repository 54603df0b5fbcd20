"""One malformed metric never breaks the WebUI, `nni-manager trials` or the NNI export.

At ingest (a real agent over real gRPC): a FINAL metric with `"sequence": "x"` is refused with
a warning naming agent and trial, while the same agent's good metrics are taken. On read (a store
written before the check, or copied from elsewhere): bad rows are skipped with a warning and
every endpoint answers with the good ones.
"""
from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.store import Store
from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail, TrialJobStatus
from tests.support.security.agentkit import fleet, get, metric_json, stored_webui

ENDPOINTS = ("/trial-jobs", "/metric-data", "/metric-data-latest", "/metric-data-range/0/5", "/export-data",
             "/experiment", "/job-statistics")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nni_manager", *args], capture_output=True, text=True, timeout=120)


async def _all_answer(experiment_dir: Path) -> dict[str, object]:
    """Every polled endpoint's JSON; each must answer 200."""
    out: dict[str, object] = {}
    async with stored_webui(experiment_dir) as api:
        for path in ENDPOINTS:
            status, body = await get(api + path)
            assert status == 200, (path, status, body[:300])
            out[path] = json.loads(body)
    return out


def test_a_malformed_metric_is_refused_at_ingest(short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)

    async def body() -> tuple[Path, str]:
        async with fleet(short_dir) as f:
            heard: list[tuple[str, str]] = []
            f.ts.add_trial_job_metric_listener(lambda m: heard.append((m.id, m.data)))
            own = await f.submit()  # placed on evil: its own trial
            assert (await f.evil.started()).trial_id == own.id
            bad = json.dumps({"parameter_id": 0, "trial_job_id": own.id, "type": "FINAL", "sequence": "x",
                              "value": "999"})
            await f.evil.send(
                {"status": pb.TrialStatus(trial_id=own.id, state=pb.TRIAL_STATE_RUNNING, start_time_ms=1)},
                {"metric": pb.Metric(trial_id=own.id, trial_seq=1, data=metric_json(own.id, "PERIODICAL", 0, 0.5))},
                {"metric": pb.Metric(trial_id=own.id, trial_seq=2, data=bad)},
                {"metric": pb.Metric(trial_id=own.id, trial_seq=3, data="[not an object]")},
                {"metric": pb.Metric(trial_id=own.id, trial_seq=4, data=metric_json(own.id, "FINAL", 0, 0.75))},
                {"status": pb.TrialStatus(trial_id=own.id, state=pb.TRIAL_STATE_SUCCEEDED, end_time_ms=2)},
            )
            await asyncio.sleep(0.2)  # listeners run on the loop
            stored = [m["data"] for m in f.ts.trials.store.metrics(own.id)]
            assert stored == [metric_json(own.id, "PERIODICAL", 0, 0.5), metric_json(own.id, "FINAL", 0, 0.75)]
            assert [d for trial_id, d in heard if trial_id == own.id] == stored
            warned = [r.getMessage() for r in caplog.records if "malformed metric" in r.getMessage()]
            assert warned and "evil" in warned[0] and own.id in warned[0], warned
            return f.experiment_dir, own.id

    experiment_dir, own = asyncio.run(body())
    answers = asyncio.run(_all_answer(experiment_dir))
    jobs = {j["trialJobId"]: j for j in answers["/trial-jobs"]}
    assert json.loads(jobs[own]["finalMetricData"][0]["data"]) == "0.75"
    view = _cli("trials", str(experiment_dir))
    assert view.returncode == 0, view.stderr


def _stored_with_bad_rows(directory: Path) -> Path:
    """A store holding malformed metric rows, as a manager before the ingest check wrote them."""
    store = Store.open(directory)
    try:
        store.init_experiment("old00001", {"trial_command": "python t.py", "trial_code_directory": str(directory),
                                           "training_service": {"platform": "local"}}, 1_700_000_000_000)
        record = json.dumps({"parameter_id": 0, "parameter_source": "algorithm", "parameters": {"x": 1},
                             "parameter_index": 0})
        with store.transaction():
            store.save_trial(TrialJobDetail(
                id="Good1", status=TrialJobStatus.SUCCEEDED, submit_time=1_700_000_000_000, sequence_id=0,
                form=TrialJobApplicationForm(0, HyperParameters(record, 0)), start_time=1_700_000_000_001,
                end_time=1_700_000_000_002, agents=["local"], agent_id="local"))
            store.add_parameter("Good1", 0, record)
            rows = [
                metric_json("Good1", "PERIODICAL", 0, 0.5),
                json.dumps({"parameter_id": 0, "type": "FINAL", "sequence": "x", "value": "999"}),
                json.dumps({"parameter_id": 0, "type": "FINAL", "sequence": [1], "value": "998"}),
                json.dumps({"parameter_id": 0, "type": ["FINAL"], "sequence": 0, "value": "997"}),
                json.dumps({"parameter_id": 0, "type": "FINAL", "sequence": 0, "value": "not json {"}),
                metric_json("Good1", "FINAL", 0, 0.75),
            ]
            for i, data in enumerate(rows, 1):
                store.add_metric("Good1", "local", "boot", i, i, data, 1_700_000_000_000 + i)
    finally:
        store.close()
    return directory


def test_a_bad_stored_metric_row_is_skipped_wherever_it_is_read(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    experiment_dir = _stored_with_bad_rows(tmp_path / "old00001")
    answers = asyncio.run(_all_answer(experiment_dir))
    data = [json.loads(m["data"]) for m in answers["/metric-data"]]
    assert "999" not in data and "998" not in data and "997" not in data
    assert "0.5" in data and "0.75" in data
    (job,) = answers["/trial-jobs"]
    assert job["finalMetricData"][0]["sequence"] == 0
    assert any("Good1" in r.getMessage() and "malformed" in r.getMessage() for r in caplog.records)

    view = _cli("trials", str(experiment_dir))
    assert view.returncode == 0 and "Good1" in view.stdout, view.stderr
    export = _cli("export", "--nni-db", str(experiment_dir), "--out", str(tmp_path / "nni"), "--no-register")
    assert export.returncode == 0, export.stderr
