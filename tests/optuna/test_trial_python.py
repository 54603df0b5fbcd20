"""Which Python runs an Optuna study's trials (nni_manager.optuna.study.trial_python): the worker's,
as a trial's own Python is on each platform, never the manager's on a worker elsewhere."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("optuna")

from nni_manager.optuna.study import StudySpec, study_config  # noqa: E402

SPEC = StudySpec("objectives.py:quadratic", "s", "sqlite:///unused.db", 3, sampler="TPESampler")
REMOTE = {"platform": "remote", "machineList": [
    {"host": "worker.example", "user": "alice", "password": "unused", "pythonPath": "/opt/env/bin"}]}  # not dialed


def command(tmp_path: Path, training_service: dict[str, Any]) -> list[str]:
    (tmp_path / "objectives.py").write_text("def quadratic(trial):\n    return 0\n")
    config = study_config({"trialCodeDirectory": str(tmp_path), "trialConcurrency": 1,
                           "trainingService": training_service}, SPEC)
    return shlex.split(config.trial_command)


RUNNER = ["-m", "nni_agent.study_runner", "objectives.py:quadratic", "--study-name", "s", "--sampler", "TPESampler"]


@pytest.mark.parametrize("training_service, python", [
    ({"platform": "local"}, sys.executable),
    (REMOTE, "python3"),  # pythonPath comes first on the trial's PATH, as for NNI's remote trials
    ({"platform": "slurm", "nniManagerIp": "127.0.0.1", "pythonPath": "/opt/conda/bin/python"},  # not dialed
     "/opt/conda/bin/python"),
    ({"platform": "slurm", "nniManagerIp": "127.0.0.1"}, sys.executable),  # not dialed
    ({"platform": "slurm", "nniManagerIp": "127.0.0.1",  # not dialed
      "loginNode": {"host": "login.example", "user": "alice", "password": "unused"}}, "python3"),  # not dialed
])
def test_the_runner_runs_under_the_workers_python(tmp_path: Path, training_service: dict[str, Any],
                                                  python: str) -> None:
    assert command(tmp_path, training_service) == [python, *RUNNER]
