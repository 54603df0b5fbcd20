"""A job that waits for room, on every job platform whose emulator queues (tests/support/job_platforms.py):
its trial is WAITING and says why in the platform's words, naming its job, then runs once there is
room. OpenPAI and Slurm had their own copies inside their status-path tests."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.job_platforms import T, JobPlatform, run
from tests.support.manager.helpers import message_with, release, sleeper, wait_status


def test_a_trial_whose_job_waits_for_room_says_so_in_the_platforms_words_then_runs(
        job_platform: JobPlatform, request: pytest.FixtureRequest, short_dir: Path) -> None:
    p = job_platform
    emu, data, blockers, words = p.waiting(request, short_dir)
    data["trialConcurrency"] = blockers + 1
    cfg = load_config(data)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            prefix = p.job_prefix(ts.experiment_id)
            running = [await ts.submit_trial_job(sleeper(short_dir, i, f"r{i}")) for i in range(blockers)]
            theirs = set()
            for t in running:
                d = await wait_status(ts, t.id, "RUNNING", timeout=T)
                theirs.add(p.job_of(prefix, t.id, d.environment_id))
            waiter = await ts.submit_trial_job(sleeper(short_dir, blockers, "w"))
            msg = await message_with(ts, waiter.id, *words, timeout=T)
            d = await ts.get_trial_job(waiter.id)
            assert d.status == TrialJobStatus.WAITING and "\n" not in msg, (d.status, msg)
            (mine,) = set(p.states(emu, prefix)) - theirs
            assert mine in msg, (mine, msg)  # the message names the job that waits
            for i, t in enumerate(running):  # room again: the running trials end ...
                release(short_dir, f"r{i}")
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            await asyncio.to_thread(p.let_waiting_run, emu)  # ... and what else held the job back lets go
            await wait_status(ts, waiter.id, "RUNNING", timeout=T)
            release(short_dir, "w")
            await wait_status(ts, waiter.id, "SUCCEEDED", timeout=T)
            return prefix

    prefix = run(main())
    p.wait_clean(emu, prefix)
