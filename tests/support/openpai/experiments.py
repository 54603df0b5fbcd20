"""OpenPAI experiment configs, a run-to-completion driver and the no-leftovers check."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from nni_manager.loader import load_config
from tests.support.manager.helpers import TRIAL
from tests.support.bounded import run_bounded


PEERS = r'''
import json, os
from nni_agent import get_next_parameter, report_final_result
get_next_parameter()
keys = ("PAI_CURRENT_TASK_ROLE_NAME", "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX", "PAI_TASK_ROLE_TASK_COUNT_worker",
        "PAI_HOST_IP_worker_0", "PAI_HOST_IP_worker_1", "PAI_JOB_NAME", "NNI_TRIAL_ROLE", "NNI_TRIAL_ROLE_INDEX")
print("SEEN " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
report_final_result(int(os.environ["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"]))
'''


def run(coro: Any) -> Any:
    return run_bounded(coro, 240)


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


def config_dict(pai: Any, base: Path, training_service: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    (code / "peers.py").write_text(PEERS)
    ts = {"platform": "openpai", "host": pai.url, "username": pai.username, "token": pai.token,
          "nniManagerIp": "127.0.0.1", "trialCpuNumber": 1, "trialMemorySize": "1gb", "dockerImage": "python:3.11",
          "virtualCluster": "default", "pollInterval": "0.5s", **(training_service or {})}
    data: dict[str, Any] = {"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                            "trialConcurrency": 1, "experimentWorkingDirectory": str(base / "exps"),
                            "trialGracePeriod": 2, "trainingService": ts}
    data.update(top)
    return data


def config(pai: Any, base: Path, training_service: dict[str, Any] | None = None, **top: Any):
    return load_config(config_dict(pai, base, training_service, **top))


def ours(pai: Any, experiment_id: str) -> list[dict[str, Any]]:
    return [j for j in pai.jobs() if j["name"].startswith(f"nni_exp_{experiment_id}_")]


def assert_clean(pai: Any, experiment_id: str) -> None:
    pai.wait_for(lambda: all(j["state"] in ("STOPPED", "SUCCEEDED", "FAILED") for j in ours(pai, experiment_id)),
                 60, what="every job of the experiment ended")
    pai.wait_for(lambda: not pai.live_pids(), 60, what="no task process left")
