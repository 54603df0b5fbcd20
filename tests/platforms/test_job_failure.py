"""A job that fails on its own, on every job platform (tests/support/job_platforms.py): its trial
FAILS saying why, the metrics it reported first are kept once, and the experiment goes on. Each
platform's folder had its own copy inside its status-path test."""
from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.job_platforms import T, JobPlatform, run
from tests.support.manager.helpers import form, wait_status


def test_a_trial_that_fails_on_its_own_fails_saying_why_and_the_experiment_goes_on(
        job_platform: JobPlatform, request: pytest.FixtureRequest, short_dir: Path) -> None:
    """The trial reports one metric, then exits 3: it ends FAILED with the exit code in its message,
    the metric heard exactly once; a job of its own ends in the platform's failed state, a pool's
    job runs the next trial; the next trial SUCCEEDS, and clean_up leaves nothing."""
    p = job_platform
    emu = p.emulator(request)
    cfg = load_config(p.trial_config(emu, short_dir))
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> tuple[str, str, str]:
        async with create_training_service(cfg) as ts:
            prefix = p.job_prefix(ts.experiment_id)
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            bad = await ts.submit_trial_job(form(0, action="fail", steps=1))
            d = await wait_status(ts, bad.id, "FAILED", timeout=T)
            assert "exit code 3" in d.message and "\n" not in d.message, d.message
            name = p.job_of(prefix, bad.id, d.environment_id)
            if p.pool_only:
                assert p.states(emu, prefix) == {name: p.running_state}, p.states(emu, prefix)
            else:
                # a job of its own may first complete as its agent exits, before the manager's stop lands
                try:
                    await asyncio.to_thread(p.wait_for, emu, lambda: not p.live(emu, prefix) and p.states(
                        emu, prefix).get(name) == p.failed_state, 60, f"the job to end {p.failed_state}")
                except AssertionError:
                    raise AssertionError(f"the job did not end {p.failed_state}: {p.states(emu, prefix)}") from None
                assert p.states(emu, prefix) == {name: p.failed_state}, p.states(emu, prefix)
            ok = await ts.submit_trial_job(form(1, x=7, steps=1))
            d2 = await wait_status(ts, ok.id, "SUCCEEDED", timeout=T)
            assert (p.job_of(prefix, ok.id, d2.environment_id) == name) == p.pool_only
            return prefix, bad.id, name

    prefix, bad_id, name = run(main())
    assert [json.loads(m)["type"] for m in metrics[bad_id]] == ["PERIODICAL"], metrics  # once, then exit 3
    if p.pool_only:
        p.wait_clean(emu, prefix)
    else:  # the failed job stays failed; clean_up ends the rest as it ends jobs
        p.wait_for(emu, lambda: not p.live(emu, prefix), 60, "every job of the experiment ended")
        states = p.states(emu, prefix)
        assert states.pop(name) == p.failed_state and len(states) == 1, states
        assert set(states.values()) <= set(p.clean_states), states
        p.wait_for(emu, lambda: not p.processes(emu), 60, "no job process left")
