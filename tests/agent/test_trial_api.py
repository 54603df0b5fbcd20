"""nni_agent's tiny trial API: standalone behaviour and a real trial with multi-phase parameters."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import PY, REPO_AGENT_DIR, Recorder, make_spec, new_trial, python_command, run

API_TRIAL = """
from nni_agent import (get_experiment_id, get_next_parameter, get_sequence_id, get_trial_id,
                       report_final_result, report_intermediate_result)
first = get_next_parameter()
report_intermediate_result({"default": first.get("lr"), "loss": 1.5})
second = get_next_parameter()
report_final_result(second.get("lr"))
print(get_experiment_id(), get_trial_id(), get_sequence_id())
"""


def test_standalone_outside_a_trial(tmp_path: Path) -> None:
    out = subprocess.run(
        [PY, "-c", API_TRIAL], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": REPO_AGENT_DIR, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "Intermediate result: {'default': None, 'loss': 1.5}",
        "Final result: None",
        "STANDALONE STANDALONE 0",
    ]


def test_trial_with_multi_phase_over_the_file_channel(tmp_path: Path) -> None:
    rec = Recorder()
    spec = make_spec(tmp_path, python_command(API_TRIAL))

    async def body() -> None:
        trial = new_trial(spec, tmp_path, rec)
        rec.on_parameter_request = lambda index: trial.send_parameter(
            index, json.dumps({"parameter_id": 4, "parameter_index": index, "parameters": {"lr": 0.2}}))
        await trial.start()
        await trial.wait()

    run(body)
    assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED, rec.stderr
    assert rec.parameter_requests == [1]
    assert [json.loads(m) for m in rec.metrics] == [
        {"parameter_id": 3, "trial_job_id": "trA01", "type": "PERIODICAL", "sequence": 0,
         "value": json.dumps({"default": 0.1, "loss": 1.5})},
        {"parameter_id": 4, "trial_job_id": "trA01", "type": "FINAL", "sequence": 0, "value": "0.2"},
    ]
    assert rec.stdout == b"expABCDE trA01 7\n"
