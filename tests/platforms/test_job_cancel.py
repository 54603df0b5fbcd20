"""A trial the user cancels, on every job platform (tests/support/job_platforms.py): it ends
USER_CANCELED and its job is stopped, or, on a pool, its job serves the next trial. Each platform's
folder had its own copy inside its status-path test."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.job_platforms import T, JobPlatform, run
from tests.support.manager.helpers import form, sleeper, wait_status


def test_a_trial_the_user_cancels_ends_user_canceled_and_its_job_is_stopped(
        job_platform: JobPlatform, request: pytest.FixtureRequest, short_dir: Path) -> None:
    """Cancelled while RUNNING: the trial ends USER_CANCELED; a job of its own goes to the
    platform's stopped state with no process left, while a pool's job stays running and runs the
    next trial (one at a time: the cancelled trial's slot was given back). clean_up leaves nothing."""
    p = job_platform
    emu = p.emulator(request)
    cfg = load_config(p.trial_config(emu, short_dir))

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            prefix = p.job_prefix(ts.experiment_id)
            mine = await ts.submit_trial_job(sleeper(short_dir, 0, "mine"))
            d = await wait_status(ts, mine.id, "RUNNING", timeout=T)
            name = p.job_of(prefix, mine.id, d.environment_id)
            assert p.states(emu, prefix) == {name: p.running_state}, p.states(emu, prefix)
            await ts.cancel_trial_job(mine.id)
            await wait_status(ts, mine.id, "USER_CANCELED", timeout=T)
            if p.pool_only:
                assert p.states(emu, prefix) == {name: p.running_state}, p.states(emu, prefix)
                after = await ts.submit_trial_job(form(1, x=1, steps=1))
                d2 = await wait_status(ts, after.id, "SUCCEEDED", timeout=T)
                assert p.job_of(prefix, after.id, d2.environment_id) == name  # the same job, given back
            else:
                await asyncio.to_thread(p.wait_for, emu, lambda: not p.live(emu, prefix), 60, "the job stopped")
                (state,) = p.states(emu, prefix).values()
                assert p.states(emu, prefix) == {name: state} and state in p.canceled_states(), state
                await asyncio.to_thread(p.wait_for, emu, lambda: not p.processes(emu), 60, "no job process left")
            assert (await ts.get_trial_job(mine.id)).status.value == "USER_CANCELED"  # still, once its job ended
            return prefix

    prefix = run(main())
    p.wait_clean(emu, prefix)
