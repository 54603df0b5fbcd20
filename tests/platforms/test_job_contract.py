"""What every job platform built on backends/jobs.py does, end to end through the real manager and
the platform's emulator (OpenPAI, DLTS, AML, Kubernetes and its operators) or the real Slurm
cluster: one scenario, parametrized over tests/support/job_platforms.py, where each platform had
its own copy. The platform's own words come from its adapter; what only one platform does stays
in that platform's folder."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.job_platforms import JobPlatform
from tests.support.manager.helpers import check_resumed, form, message_with, release, sigkill_after_metrics, sleeper, \
    start_manager, wait_status
from tests.support.bounded import run_bounded

T = 90.0  # generous polling timeout: two cores shared with other test runs


def run(coro: Any) -> Any:
    return run_bounded(coro, 240)


def test_manager_sigkill_and_restart_reattaches_running_jobs(job_platform: JobPlatform, request: pytest.FixtureRequest,
                                                             tmp_path: Path) -> None:
    """The manager is SIGKILLed mid-trial: the jobs run on without it. A manager restarted on the
    same directory finds them by name, their agents redial the same hub, the trials are re-attached
    (not restarted, no new job), every metric is stored and heard exactly once, and clean_up ends
    every job of the experiment and leaves no process behind; no credential in its output."""
    p = job_platform
    emu = p.emulator(request)
    exp = f"{p.tag}Restart1"
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(p.config(emu, tmp_path)))
    config.chmod(0o600)
    exp_dir = tmp_path / "exps" / exp
    prefix = p.job_prefix(exp)
    first = start_manager(exp, "new", 2, "--config", str(config), "--step-sleep", "0.3")
    _, before = sigkill_after_metrics(first, exp_dir, trials=2, timeout=90)
    running = p.running(emu, prefix)
    assert len(running) == 2 and running == sorted(p.states(emu, prefix)), p.states(emu, prefix)  # without a manager

    second = start_manager(exp, "resume", 2, "--config", str(config), "--step-sleep", "0.3")
    out2, err2 = second.communicate(timeout=150)
    assert second.returncode == 0, err2[-3000:]
    trials = check_resumed(exp_dir, out2, before)
    if p.reuse:
        assert {t.environment_id for t in trials} == {"env1", "env2"}
        expected = [p.job_of(prefix, "", "env1"), p.job_of(prefix, "", "env2")]
    else:
        expected = sorted(p.job_of(prefix, t.id, t.environment_id or "") for t in trials)
    assert sorted(p.states(emu, prefix)) == expected  # re-attached: the same jobs, no new one
    p.wait_clean(emu, prefix)
    for secret in p.secrets(emu):
        assert secret not in out2 + err2


def test_agent_that_never_dials_fails_its_trial_and_its_job_is_stopped(job_platform: JobPlatform,
                                                                       request: pytest.FixtureRequest,
                                                                       short_dir: Path) -> None:
    """The platform runs the job, but its agent never dials the hub (`agentConnectTimeout`): while it
    waits the trial says so and what to check, then the trial FAILS naming the job, and the backend
    stops the job itself, before the experiment ends."""
    p = job_platform
    emu, data = p.stuck(request, short_dir, "4s")
    cfg = load_config(data)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            prefix = p.job_prefix(ts.experiment_id)
            t = await ts.submit_trial_job(form(0))
            msg = await message_with(ts, t.id, "has not dialled 127.0.0.1:", *p.not_dialled_words, timeout=T)
            assert "nniManagerIp" in msg and "Python" in msg, msg
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "ran for 4 s but its agent never dialled 127.0.0.1:" in d.message, d.message
            assert "the job was stopped" in d.message and "gave up" not in d.message, d.message
            named = [n for n in p.states(emu, prefix) if n in d.message]
            assert len(named) == 1, (d.message, p.states(emu, prefix))
            if not p.stuck_pool:
                assert named == [p.job_of(prefix, t.id, d.environment_id or "")], named
            # stopped by the backend now, not by the experiment's stop (a pool's every environment)
            await asyncio.to_thread(p.wait_for, emu, lambda: not p.live(emu, prefix), 60, "the job stopped")
            states = p.states(emu, prefix)
            assert set(states.values()) == {p.stopped_state} and (p.stuck_pool or len(states) == 1), states
            return prefix

    prefix = run(main())
    p.wait_clean(emu, prefix)


def test_a_job_stopped_outside_the_experiment_ends_its_trial_sys_canceled_in_the_platforms_words(
        job_platform: JobPlatform, request: pytest.FixtureRequest, short_dir: Path) -> None:
    """Someone stops a running trial's job with the platform's own tools (PAI's STOP, DLTS' kill, the
    studio's cancel, `scancel`, `kubectl delete`): the trial ends SYS_CANCELED saying so in the platform's words, the
    experiment goes on (the next trial runs to SUCCEEDED on a job of its own), and clean_up leaves
    nothing behind."""
    p = job_platform
    emu = p.emulator(request)
    cfg = load_config(p.config(emu, short_dir))

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            prefix = p.job_prefix(ts.experiment_id)
            theirs = await ts.submit_trial_job(sleeper(short_dir, 0, "theirs"))
            d = await wait_status(ts, theirs.id, "RUNNING", timeout=T)
            name = p.job_of(prefix, theirs.id, d.environment_id)
            assert p.states(emu, prefix)[name] == p.running_state, p.states(emu, prefix)
            words = await asyncio.to_thread(p.cancel_outside, emu, name)
            await wait_status(ts, theirs.id, "SYS_CANCELED", timeout=T)
            await message_with(ts, theirs.id, *words, timeout=T)
            assert (await ts.get_trial_job(theirs.id)).status.value == "SYS_CANCELED"
            release(short_dir, "theirs")
            after = await ts.submit_trial_job(form(1, x=1, steps=1))
            d2 = await wait_status(ts, after.id, "SUCCEEDED", timeout=T)
            assert p.job_of(prefix, after.id, d2.environment_id) != name  # not on the stopped job
            return prefix

    prefix = run(main())
    p.wait_clean(emu, prefix)


def test_the_job_the_platform_holds_is_the_dry_runs_request(job_platform: JobPlatform, request: pytest.FixtureRequest,
                                                             short_dir: Path) -> None:
    """What `nni-manager run --dry-run` shows is what gets submitted (issue 21): both come from
    `build_request`, so the job the platform holds for a running trial, read back with the
    platform's own API or tools, is the dry run's request but for what only `start` knows (the
    agent's credential and the CA, shown as placeholders; Slurm's hub port)."""
    p = job_platform
    emu = p.emulator(request)
    cfg = load_config(p.trial_config(emu, short_dir))

    async def main() -> tuple[Any, Any]:
        async with create_training_service(cfg) as ts:
            backend = ts.core.backend
            shown, built = p.dry_run_built(backend)
            assert shown == built, _diff(shown, built)  # the dry run goes through build_request
            trial = await ts.submit_trial_job(sleeper(short_dir, 0, "held"))
            d = await wait_status(ts, trial.id, "RUNNING", timeout=T)
            (env,) = [e for e in ts.environments()  # the trial's own job's, or its pool job's
                      if e.trial_id == trial.id or (d.environment_id and e.env_id == d.environment_id)]
            held = await asyncio.to_thread(p.held_request, emu, backend, env)
            release(short_dir, "held")
            await wait_status(ts, trial.id, "SUCCEEDED", timeout=T)
            return held

    held, built = run(main())
    assert held == built, _diff(held, built)


def _diff(held: Any, built: Any) -> str:
    """Where the platform's copy differs from the builder's, line by line."""
    import difflib
    import json

    def lines(x: Any) -> list[str]:
        return json.dumps(x, indent=1, sort_keys=True, default=str).splitlines()

    return "\n".join(difflib.unified_diff(lines(built), lines(held), "build_request", "held", n=2, lineterm=""))
