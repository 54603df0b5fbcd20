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


@pytest.mark.slow
def test_rest_faults_for_a_while_lose_nothing(job_platform: JobPlatform, request: pytest.FixtureRequest,
                                             short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two trials run when the API starts failing: they keep RUNNING (their agents talk to the hub,
    not the platform) and SUCCEED, a third runs after the faults on the same platform, every metric
    arrives once, no environment is given up, the faults were answered and retried (and the log
    says so), and no credential reaches the log."""
    caplog.set_level(logging.WARNING)
    p = job_platform
    emu = p.fault_emulator(request)
    cfg = load_config(p.config(emu, short_dir))
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> tuple[str, dict[str, int]]:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            a = await ts.submit_trial_job(sleeper(short_dir, 0, "a", steps=3))
            b = await ts.submit_trial_job(sleeper(short_dir, 1, "b", steps=2))
            for t in (a, b):
                await wait_status(ts, t.id, "RUNNING", timeout=T)
            await asyncio.to_thread(p.inject_faults, emu)
            for t in (a, b):
                assert (await ts.get_trial_job(t.id)).status == TrialJobStatus.RUNNING
            p.clear_faults(emu)
            release(short_dir, "a")
            release(short_dir, "b")
            for t in (a, b):
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            c = await ts.submit_trial_job(form(2, x=3, steps=2))  # the platform still serves the experiment
            await wait_status(ts, c.id, "SUCCEEDED", timeout=T)
            return p.job_prefix(ts.experiment_id), {a.id: 4, b.id: 3, c.id: 3}  # each: its steps, then FINAL

    prefix, expected = run(main())
    assert {t: len(set(ms)) for t, ms in metrics.items()} == expected, metrics  # every metric ...
    assert all(len(ms) == len(set(ms)) for ms in metrics.values()), metrics  # ... exactly once
    jobs = p.states(emu, prefix)
    assert len(jobs) >= 2 if p.reuse else len(jobs) == 3, jobs  # a pool may add one (AML does); one per trial
    given_up = [r.getMessage() for r in caplog.records if r.name == "nni_manager.service.elastic"]
    assert not given_up, given_up  # no environment failed for a fault
    answered = p.answered_statuses(emu)
    assert p.fault_statuses and set(p.fault_statuses) <= answered, answered
    assert any(w in caplog.text for w in p.fault_words()), caplog.text  # retried, and said so
    assert not any(s in caplog.text for s in p.secrets(emu))
    p.wait_clean(emu, prefix)


# A job creation answered 5xx may or may not have made the job: jobs.py looks it up by name and only
# then submits again (DLTS and DLC used to fail the trial: their creations are not retried, since a
# second POST would make a second job of the name).
def test_a_trial_submitted_while_the_api_fails_gets_its_job_once_it_answers(
        job_platform: JobPlatform, request: pytest.FixtureRequest, short_dir: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The platform answers the first two job creations with a server error (creating nothing): the
    trial waits and runs on a job created once the API answers, no environment is given up, and
    the experiment has exactly one job for it."""
    p = job_platform
    caplog.set_level(logging.WARNING)
    emu = p.fault_emulator(request)
    cfg = load_config(p.trial_config(emu, short_dir))

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            p.fail_submissions(emu, 2)
            t = await ts.submit_trial_job(form(0, x=1, steps=1))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)  # FAILED: at once, not at T
            assert d.status == TrialJobStatus.SUCCEEDED, d.message
            return p.job_prefix(ts.experiment_id)

    prefix = run(main())
    given_up = [r.getMessage() for r in caplog.records if r.name == "nni_manager.service.elastic"]
    assert not given_up, given_up
    assert len(p.states(emu, prefix)) == 1, p.states(emu, prefix)
    p.wait_clean(emu, prefix)
