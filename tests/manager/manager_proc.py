"""A manager in its own process, so a test can SIGKILL it and start another on the same dir.

    python -m tests.manager.manager_proc WORKDIR CODE_DIR EXPERIMENT_ID new|resume N_TRIALS

Prints `METRIC <trial> <type> <sequence>` for every metric its listener gets and exits
(after clean_up) once every trial has ended.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobMetric
from tests.manager.helpers import form


async def main(work: str, code: str, experiment_id: str, mode: str, n: int) -> None:
    cfg = ExperimentConfig(
        trial_command=f"{sys.executable} trial.py", trial_code_directory=Path(code),
        training_service=TrainingServiceConfig(platform="local"), experiment_working_directory=Path(work),
        trial_grace_period=2.0,
    )

    def on_metric(m: TrialJobMetric) -> None:
        d = json.loads(m.data)
        print("METRIC", m.id, d["type"], d["sequence"], flush=True)

    async with create_training_service(cfg, experiment_id=experiment_id) as ts:
        ts.add_trial_job_metric_listener(on_metric)
        if mode == "new":
            for i in range(n):
                await ts.submit_trial_job(form(i, steps=12, step_sleep=0.15))
        while not all(t.status.is_terminal for t in await ts.list_trial_jobs()):
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
