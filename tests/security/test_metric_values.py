"""A metric value NNI's tuner or a reader cannot take is refused where it enters, never stored.

Trial code is not trusted: a FINAL value nested 100,000 deep killed NNI's tuner (RecursionError in
its JSON decoder), a lone UTF-16 surrogate made every `nni-manager trials` crash, a 12 MiB metric and
480,000 metrics in 5 s were taken. The agent checks each metric first (one line in the trial's log,
counted, said in the trial's message); the manager checks again (an agent is not trusted either).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nni_agent import metric_check
from nni_agent.metrics import LOGGED_REFUSALS
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.manager.helpers import form, until
from tests.support.security.agentkit import fleet, metric_json

FLOOD = 480_000

# Writes NNI's metrics file by hand (as any trial code can): good metrics, hostile ones, then a flood
HOSTILE_TRIAL = r'''
import json, os
tid = os.environ["NNI_TRIAL_JOB_ID"]

def msg(kind, value, seq=0):
    return json.dumps({"parameter_id": 0, "trial_job_id": tid, "type": kind, "sequence": seq, "value": value})

def rec(payload):
    payload += b"\n"
    return b"ME%06d" % len(payload) + payload

deep = 100_000
records = [
    rec(msg("PERIODICAL", json.dumps(0.5)).encode()),
    rec(msg("FINAL", "[" * deep + "]" * deep).encode()),                      # its value nested 100,000 deep
    rec(msg("FINAL", "0", 0)[:-1].encode() + b', "x": ' + b"[" * deep + b"]" * deep + b"}"),  # the message itself
    rec(msg("FINAL", json.dumps("\ud800")).encode()),                         # a lone surrogate, escaped
    rec(msg("FINAL", '"caf\\u00e9 MARK"').encode().replace(b"MARK", b"\xff\xfe")),  # not UTF-8
    rec(msg("FINAL", json.dumps(0.75)).encode()),
]
with open(os.path.join(os.environ["NNI_SYS_DIR"], ".nni", "metrics"), "ab") as f:
    f.write(b"".join(records))
    f.flush()
    flood = [rec(msg("PERIODICAL", "1", i).encode()) for i in range(FLOOD)]
    f.write(b"".join(flood))
'''.replace("FLOOD", str(FLOOD))


def _config(short_dir: Path) -> ExperimentConfig:
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(HOSTILE_TRIAL)
    return ExperimentConfig(trial_code_directory=code, trial_command=f"mkdir -p \"$NNI_SYS_DIR/.nni\" && "
                            f"{sys.executable} trial.py", experiment_working_directory=short_dir / "exps",
                            training_service=TrainingServiceConfig(platform="local"))


def _trials_cli(experiment_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nni_manager", "trials", str(experiment_dir)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})


def _values(data: list[str]) -> list[object]:
    return [json.loads(json.loads(d)["value"]) for d in data]


def _flood_record(trial_id: str, seq: int) -> str:
    """What HOSTILE_TRIAL's msg("PERIODICAL", "1", seq) wrote."""
    return json.dumps({"parameter_id": 0, "trial_job_id": trial_id, "type": "PERIODICAL", "sequence": seq, "value": "1"})


@pytest.mark.slow
def test_the_agent_refuses_hostile_values_and_a_flood(short_dir: Path) -> None:
    """Count-based, whatever the machine's speed: every metric sent is stored once, in order, or
    counted as refused; the burst is stored whole; past it, no more than the refill rate for the
    time the agent had (a slower machine only gives the refill more time, never a wrong count)."""
    async def body() -> tuple[Path, str, list[str], list[str], str, float]:
        async with create_training_service(_config(short_dir)) as ts:
            heard: list[str] = []  # what NNI's dispatcher (its tuner) is handed
            ts.add_trial_job_metric_listener(lambda m: heard.append(m.data))
            began = time.monotonic()  # before the agent's budget exists
            trial = await ts.submit_trial_job(form(0))
            await until(lambda: ts.trials.get(trial.id).status.is_terminal, 300, "the trial to end")
            await asyncio.sleep(0.5)
            detail = ts.trials.get(trial.id)
            assert detail.status == TrialJobStatus.SUCCEEDED, detail.message
            stored = [m["data"] for m in ts.trials.store.metrics(trial.id)]
            return ts.experiment_dir, trial.id, stored, heard, detail.message, time.monotonic() - began

    experiment_dir, trial_id, stored, heard, message, budget_s = asyncio.run(body())
    finals = [d for d in stored if json.loads(d)["type"] == "FINAL"]
    assert _values(finals) == [0.75], [f[:200] for f in finals]  # the hostile FINALs are nowhere
    assert heard == stored
    assert [json.loads(d)["type"] for d in stored[:2]] == ["PERIODICAL", "FINAL"]  # in the order sent
    assert _values(stored[:2]) == [0.5, 0.75]
    flood = stored[2:]
    seqs = [json.loads(d)["sequence"] for d in flood]
    assert all(a < b for a, b in zip(seqs, seqs[1:])), "the flood's metrics are stored once each, in order"
    assert flood == [_flood_record(trial_id, s) for s in seqs]  # byte for byte as the trial wrote them
    burst = int(metric_check.BURST_METRICS) - 6  # the 6 records before the flood took a token each
    assert seqs[:burst] == list(range(burst)), "the burst is stored whole"
    refill = metric_check.METRICS_PER_S * budget_s
    assert len(flood) <= burst + refill + 1, (len(flood), budget_s)  # past the burst: the refill rate only
    refused = FLOOD + 6 - len(stored)  # what the agent counts: every metric sent and not stored
    assert f"{refused:,} metrics refused" in message and "see the trial's log" in message, message
    log = (experiment_dir / "trials" / trial_id / "trial.stderr").read_text()
    refusals = [line for line in log.splitlines() if line.startswith("nni-agent: metric refused")]
    assert len(refusals) == min(refused, LOGGED_REFUSALS), log[-2000:]  # one line each, then only counted
    assert "its value is nested 100000 levels deep" in refusals[0], refusals
    assert "the metric is nested 100001 levels deep" in refusals[1], refusals
    assert "lone UTF-16 surrogate" in refusals[2] and "not valid UTF-8" in refusals[3], refusals
    assert all("metrics a second" in line for line in refusals[4:]), refusals  # the flood's: its rate, no other
    if refused >= LOGGED_REFUSALS:
        assert "counted, not logged" in refusals[-1], refusals
    view = _trials_cli(experiment_dir)
    assert view.returncode == 0 and trial_id in view.stdout, view.stderr[-2000:]


@pytest.mark.slow
def test_the_manager_refuses_what_an_agent_did_not(short_dir: Path) -> None:
    """An agent that skips the check (here one speaking the protocol by hand, with its own valid
    token) gets the same refusals at the manager, and a trial's metric volume is bounded there too."""
    huge = "x" * (990_000 - 100)

    async def body() -> tuple[Path, str, list[str], list[str], str]:
        async with fleet(short_dir) as f:
            heard: list[tuple[str, str]] = []
            f.ts.add_trial_job_metric_listener(lambda m: heard.append((m.id, m.data)))
            own = await f.submit()
            assert (await f.evil.started()).trial_id == own.id
            deep = 100_000
            bad = [
                json.dumps({"parameter_id": 0, "trial_job_id": own.id, "type": "FINAL", "sequence": 0,
                            "value": "[" * deep + "]" * deep}),
                metric_json(own.id, "FINAL", 0, 1)[:-1] + ', "x": ' + "[" * deep + "]" * deep + "}",
                metric_json(own.id, "FINAL", 0, "\ud800"),  # json.dumps escapes it: "\\ud800"
                metric_json(own.id, "FINAL", 0, "y" * (12 << 20)),
            ]
            seq = 0

            def metric(data: str) -> dict[str, pb.Record]:
                nonlocal seq
                seq += 1
                return {"metric": pb.Metric(trial_id=own.id, trial_seq=seq, data=data)}

            await f.evil.send({"status": pb.TrialStatus(trial_id=own.id, state=pb.TRIAL_STATE_RUNNING,
                                                        start_time_ms=1)},
                              metric(metric_json(own.id, "PERIODICAL", 0, 0.5)))
            for data in bad:
                await f.evil.send(metric(data))
            for i in range(150):  # 148 MB of metrics at once: more than a trial's volume budget
                await f.evil.send(metric(metric_json(own.id, "PERIODICAL", i + 1, huge)))
            await asyncio.sleep(0.2)
            message_while_running = f.detail(own.id).message
            await f.evil.send(metric(metric_json(own.id, "FINAL", 0, 0.75)),
                              {"status": pb.TrialStatus(trial_id=own.id, state=pb.TRIAL_STATE_SUCCEEDED,
                                                        end_time_ms=2)})
            await asyncio.sleep(0.2)
            stored = [m["data"] for m in f.ts.trials.store.metrics(own.id)]
            assert f.detail(own.id).status == TrialJobStatus.SUCCEEDED, f.detail(own.id).message
            return (f.experiment_dir, own.id, stored, [d for t, d in heard if t == own.id],
                    message_while_running + " | " + f.detail(own.id).message)

    experiment_dir, own, stored, heard, messages = asyncio.run(body())
    assert heard == stored
    assert _values([d for d in stored if json.loads(d)["type"] == "FINAL"]) == [0.75]
    assert all(len(d) < 1_000_000 and "ud800" not in d and "[[[" not in d for d in stored)
    big = sum(1 for d in stored if len(d) > 900_000)
    assert 0 < big < 150, big  # the volume budget took some, refused the rest
    assert "refused by the manager (first: its value is nested 100000 levels deep" in messages, messages
    view = _trials_cli(experiment_dir)
    # the victim may end on its own as the fleet releases it (2 succeeded) or be cancelled (1)
    assert view.returncode == 0 and " succeeded" in view.stdout, view.stderr[-2000:]
