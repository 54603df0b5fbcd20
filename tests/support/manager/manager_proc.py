"""A manager in its own process, so a test can SIGKILL it and start another on the same dir.

    python -m tests.support.manager.manager_proc EXPERIMENT_ID new|resume N_TRIALS
        (--local WORKDIR CODE_DIR | --config YAML) [--reconnect-window S] [--steps N] [--step-sleep S]

`--local` runs the local platform on WORKDIR with CODE_DIR's trial.py; `--config` any YAML
config (e.g. a Kubernetes one). Prints `METRIC <trial> <type> <sequence>` for every metric its
listener gets and exits (after clean_up) once every trial has ended.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobMetric
from tests.support.manager.helpers import form


async def main(config: Any, experiment_id: str, mode: str, n: int, steps: int, step_sleep: float) -> None:
    def on_metric(m: TrialJobMetric) -> None:
        d = json.loads(m.data)
        print("METRIC", m.id, d["type"], d["sequence"], flush=True)

    ts = create_training_service(config, experiment_id=experiment_id)
    ts.add_trial_job_metric_listener(on_metric)  # before start: agents that redial at once flush what they kept
    async with ts:
        if mode == "new":
            for i in range(n):
                await ts.submit_trial_job(form(i, steps=steps, step_sleep=step_sleep))
        while not all(t.status.is_terminal for t in await ts.list_trial_jobs()):
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("experiment_id", "mode"):
        parser.add_argument(name)
    parser.add_argument("n", type=int)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", nargs=2, metavar=("WORKDIR", "CODE_DIR"))
    where.add_argument("--config")
    parser.add_argument("--reconnect-window", type=float)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-sleep", type=float, default=0.15)
    a = parser.parse_args()
    if a.config:
        cfg: Any = a.config
    else:
        cfg = ExperimentConfig(
            trial_command=f"{sys.executable} trial.py", trial_code_directory=Path(a.local[1]),
            training_service=TrainingServiceConfig(platform="local", reconnect_window=a.reconnect_window),
            experiment_working_directory=Path(a.local[0]), trial_grace_period=2.0,
        )
    asyncio.run(main(cfg, a.experiment_id, a.mode, a.n, a.steps, a.step_sleep))
