"""`agentConnectTimeout` on the real 2-node Slurm cluster (tests/support/slurm/fixtures.py): Slurm runs the
job, but its agent never dials the hub (the batch script's prologue never ends). The job pattern
shared with the REST platforms (backends/jobs.py) says so while it waits, then fails the trial
and cancels the job itself, before the experiment stops."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.manager.helpers import TRIAL, form, message_with, wait_status

T = 90.0  # generous polling timeout: two cores shared with other test runs


def test_job_whose_agent_never_dials_fails_and_is_cancelled(slurm: Any, base: Path) -> None:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    cfg = load_config({
        "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 1,
        "experimentWorkingDirectory": str(base / "exps"), "trialGracePeriod": 2,
        "trainingService": {"platform": "slurm", "nniManagerIp": "127.0.0.1", "trialCpuNumber": 1,
                            "trialMemorySize": "200mb", "pollInterval": "0.3s", "reuseMode": False,
                            "agentConnectTimeout": "4s", "prologue": ["sleep 600"]}})

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            prefix = f"nni_exp_{ts.experiment_id}_"
            t = await ts.submit_trial_job(form(0))
            msg = await message_with(ts, t.id, "is RUNNING", "has not dialled", timeout=T)
            assert "Slurm job" in msg and "nniManagerIp" in msg and "agent-*.log" in msg, msg
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "ran for 4 s but its agent never dialled 127.0.0.1:" in d.message, d.message
            assert prefix + "trial_" + t.id in d.message and "the job was stopped" in d.message, d.message
            # cancelled by the backend now, not by the experiment's stop
            await asyncio.to_thread(slurm.wait_for, lambda: not slurm.live_jobs(prefix), 60, "the job cancelled")
            assert [j["state"] for j in slurm.jobs(prefix)] == ["CANCELLED"]
            return prefix

    prefix = asyncio.run(asyncio.wait_for(main(), 240))
    slurm.wait_for(lambda: not slurm.live_jobs(prefix), 60, "no live job of the experiment")
    slurm.wait_for(lambda: not slurm.job_processes(), 60, "no process left by a job")
