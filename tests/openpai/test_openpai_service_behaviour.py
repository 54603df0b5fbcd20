"""`platform: openpai` where OpenPAI is stricter than a kind test bed: its per-user submission
rate limit (429 with `Retry-After` the whole window: a trial waits, never fails), and an image
without the agent (the boot's own line, not PAI's `PAIRuntimeUnknownFailed`, reaches the trial).
Emulator: tests/support/openpai/fixtures.py (`rate_limits` / `rate_windows` shrink PAI's 60 an hour)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.manager.helpers import form, until, wait_status
from tests.support.openpai.experiments import assert_clean, config, ours, run

T = 90.0


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


def test_submission_rate_limit_keeps_the_trial_waiting_until_pai_takes_it(pai_factory, base: Path) -> None:
    """PAI takes 2 submissions per window here (60 an hour on a real cluster) and answers the third
    429 with Retry-After the window: that trial waits saying so and when, then runs."""
    window = 12
    pai = pai_factory(rate_limits={"list": 0, "submit": 2}, rate_windows={"submit": window})
    cfg = config(pai, base, {"reuseMode": False}, trialConcurrency=3)
    seen: dict[str, Any] = {}

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(3)]

            async def limited() -> Any:
                for t in trials:
                    d = await ts.get_trial_job(t.id)
                    if "rate limit" in d.message:
                        return d
                return None

            d = await until(limited, T, "a trial waiting for PAI's submission rate limit")
            seen["waiting"] = d
            for t in trials:
                assert (await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)).status == \
                    TrialJobStatus.SUCCEEDED
            return ts.experiment_id

    exp = run(main())
    d = seen["waiting"]
    assert d.status == TrialJobStatus.WAITING, d
    assert "Too many requests" in d.message and f"Retry-After {window} s" in d.message and "UTC" in d.message, \
        d.message
    submits = [r for r in pai.requests() if r["method"] == "POST"]
    assert [r["status"] for r in submits].count(429) == 1, submits  # asked again only once the window passed
    assert len(ours(pai, exp)) == 3
    assert_clean(pai, exp)


OLD_PYTHON = next(iter(sorted(Path("/root/.pyenv/versions").glob("3.7.*/bin/python3"))), None)


@pytest.mark.parametrize("python,words", [
    ("/usr/bin/python3", "of the image python:3.11-slim cannot run the agent: grpcio is missing; protobuf is missing; "
                         "psutil is missing; the nni-agent package is missing (pip install nni-agent); fix: "),
    pytest.param(str(OLD_PYTHON), "of the image python:3.11-slim is older than 3.8, the oldest the agent runs on",
                 marks=pytest.mark.skipif(OLD_PYTHON is None, reason="no Python 3.7 on this machine")),
], ids=["bare-python", "python-3.7"])
def test_image_without_the_agent_fails_the_trial_with_the_boots_line(pai_factory, base: Path, python: str,
                                                                     words: str) -> None:
    """An image whose Python lacks nni-agent and its dependencies, or is too old: PAI reports
    `PAIRuntimeUnknownFailed`; the trial says what is wrong, from the boot step's own line in PAI's
    runtime error log."""
    bare = base / "bare-image-bin"  # the image's python3: a Python without nni-agent or its dependencies
    bare.mkdir()
    os.symlink(python, bare / "python3")
    pai = pai_factory(rate_limits={"list": 0}, images={"python:3.11-slim": str(bare)})
    cfg = config(pai, base, {"reuseMode": False, "dockerImage": "python:3.11-slim"})

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "FAILED: nni-agent: Python " in d.message and words in d.message, d.message
            assert "\n" not in d.message, d.message
            return ts.experiment_id

    exp = run(main())
    job = ours(pai, exp)[0]
    assert job["detail"]["jobStatus"]["appExitSpec"]["phrase"] == "PAIRuntimeUnknownFailed"
