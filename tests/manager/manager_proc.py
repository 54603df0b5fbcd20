"""A manager in its own process, so a test can SIGKILL it and start another on the same dir.

    python -m tests.manager.manager_proc WORKDIR CODE_DIR EXPERIMENT_ID new|resume N_TRIALS
        [--reconnect-window S] [--step-sleep S]

Prints `METRIC <trial> <type> <sequence>` for every metric its listener gets and exits
(after clean_up) once every trial has ended.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobMetric
from tests.manager.helpers import form


async def main(work: str, code: str, experiment_id: str, mode: str, n: int, window: float | None,
               step_sleep: float) -> None:
    cfg = ExperimentConfig(
        trial_command=f"{sys.executable} trial.py", trial_code_directory=Path(code),
        training_service=TrainingServiceConfig(platform="local", reconnect_window=window),
        experiment_working_directory=Path(work),
        trial_grace_period=2.0,
    )

    def on_metric(m: TrialJobMetric) -> None:
        d = json.loads(m.data)
        print("METRIC", m.id, d["type"], d["sequence"], flush=True)

    async with create_training_service(cfg, experiment_id=experiment_id) as ts:
        ts.add_trial_job_metric_listener(on_metric)
        if mode == "new":
            for i in range(n):
                await ts.submit_trial_job(form(i, steps=12, step_sleep=step_sleep))
        while not all(t.status.is_terminal for t in await ts.list_trial_jobs()):
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("work", "code", "experiment_id", "mode"):
        parser.add_argument(name)
    parser.add_argument("n", type=int)
    parser.add_argument("--reconnect-window", type=float)
    parser.add_argument("--step-sleep", type=float, default=0.15)
    a = parser.parse_args()
    asyncio.run(main(a.work, a.code, a.experiment_id, a.mode, a.n, a.reconnect_window, a.step_sleep))
