"""The platform's REST API failing for a while (5xx, throttling, hangs, reset connections), on
every job platform with one (tests/support/job_platforms.py): nothing is lost. Each platform's
folder had its own copy."""
from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.job_platforms import T, JobPlatform, run
from tests.support.manager.helpers import form, release, sleeper, wait_status


def test_rest_faults_for_a_while_lose_nothing(job_platform: JobPlatform, request: pytest.FixtureRequest,
                                             short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A trial runs when the API starts failing and a second one is submitted meanwhile: the running
    trial keeps RUNNING (its agent talks to the hub, not the platform), the second gets its job
    once the API answers again, both SUCCEED, a third runs after them, every metric arrives once,
    the faults were answered and retried, and no credential reaches the log."""
    caplog.set_level(logging.WARNING)
    p = job_platform
    emu = p.fault_emulator(request)
    cfg = load_config(p.config(emu, short_dir))
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> tuple[str, dict[str, int]]:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            a = await ts.submit_trial_job(sleeper(short_dir, 0, "a", steps=3))
            await wait_status(ts, a.id, "RUNNING", timeout=T)
            faults = asyncio.create_task(asyncio.to_thread(p.inject_faults, emu))
            b = await ts.submit_trial_job(form(1, x=2, steps=2))  # its job is created through the faults
            await faults
            assert (await ts.get_trial_job(a.id)).status == TrialJobStatus.RUNNING
            p.clear_faults(emu)
            release(short_dir, "a")
            for t in (a, b):
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            c = await ts.submit_trial_job(form(2, x=3, steps=2))  # the platform still serves the experiment
            await wait_status(ts, c.id, "SUCCEEDED", timeout=T)
            return f"nni_exp_{ts.experiment_id}_", {a.id: 4, b.id: 3, c.id: 3}  # each: its steps, then FINAL

    prefix, expected = run(main())
    assert {t: len(set(ms)) for t, ms in metrics.items()} == expected, metrics  # every metric ...
    assert all(len(ms) == len(set(ms)) for ms in metrics.values()), metrics  # ... exactly once
    answered = p.answered_statuses(emu)
    assert p.fault_statuses and set(p.fault_statuses) <= answered, answered
    assert any(str(s) in caplog.text for s in p.fault_statuses), caplog.text  # retried, and said so
    assert not any(s in caplog.text for s in p.secrets(emu))
    p.wait_clean(emu, prefix)
