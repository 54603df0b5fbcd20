"""Slurm experiment configs, a run-to-completion driver and the no-leftovers check."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nni_manager.loader import load_config
from tests.support.manager.helpers import TRIAL
from tests.support.bounded import run_bounded


T = 90.0  # generous polling timeout: two cores shared with other test runs


SEEN = r'''
import json, os, socket
import nni_agent
from nni_agent import get_next_parameter, report_final_result
get_next_parameter()
keys = ("SLURM_PROCID", "SLURM_NODEID", "SLURMD_NODENAME", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_JOB_ID")
print("SEEN " + json.dumps({**{k: os.environ.get(k) for k in keys}, "agent": nni_agent.__file__}), flush=True)
report_final_result(int(os.environ["SLURM_PROCID"]))
'''


def run(coro: Any) -> Any:
    return run_bounded(coro, 240)


def config(base: Path, training_service: dict[str, Any] | None = None, **top: Any):  # -> ExperimentConfig
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    (code / "seen.py").write_text(SEEN)
    ts = {"platform": "slurm", "nniManagerIp": "127.0.0.1", "trialCpuNumber": 1, "trialMemorySize": "200mb",
          "pollInterval": "0.3s", **(training_service or {})}
    data: dict[str, Any] = {"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                            "trialConcurrency": 1, "experimentWorkingDirectory": str(base / "exps"),
                            "trialGracePeriod": 2, "trainingService": ts}
    data.update(top)
    return load_config(data)


def assert_clean(slurm: Any, experiment_id: str) -> None:
    prefix = f"nni_exp_{experiment_id}_"
    slurm.wait_for(lambda: not slurm.live_jobs(prefix), 60, "no live job of the experiment")
    slurm.wait_for(lambda: not slurm.job_processes(), 60, "no process left by a job")
    slurm.wait_for(lambda: len(slurm.idle_nodes()) == 2, 60, "both nodes idle again")
