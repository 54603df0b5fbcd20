"""A platform's refusal and a bug of ours are told apart: a backend's own error (any
`BackendError`) is the platform's one line on the trial; anything else a backend raises is an
internal error, named so on the trial, with its traceback in nnimanager.log."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, register_backend, wait_status
from tests.support.bounded import run_bounded

PLUGIN = '''
from nni_manager.backends.base import BackendError, ElasticBackend


class FlakyBackend(ElasticBackend):
    """Elastic: every environment it is asked for fails the way `fails` says."""
    platform = "flaky"
    options_type = dict
    hub = "unix"

    @classmethod
    def parse_options(cls, section, config):
        return {"fails": section.str_("fails", required=True)}

    async def start(self, ctx):
        pass

    async def stop(self):
        pass

    async def provision(self, env):
        if self.opts["fails"] == "refused":
            raise BackendError("quota exceeded for GPUs in namespace ml (used 8 of 8)")
        return {}["job-template"]  # a bug: a KeyError deep in building the request

    async def release(self, env_id):
        pass
'''


@pytest.fixture
def flaky_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(register_backend(tmp_path, "flaky-platform", "flaky",
                                                     "flaky_platform:FlakyBackend", PLUGIN)))


@pytest.mark.parametrize("fails", ["refused", "bug"])
def test_refusal_is_the_platforms_words_and_a_bug_is_an_internal_error(
        fails: str, flaky_platform: None, short_dir: Path, code_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config({"trialCommand": "python3 trial.py", "trialCodeDirectory": str(code_dir),
                          "trialConcurrency": 1, "experimentWorkingDirectory": str(short_dir / "exps"),
                          "trainingService": {"platform": "flaky", "fails": fails}})
    caplog.set_level(logging.WARNING, logger="nni_manager")

    async def body() -> str:
        async with create_training_service(config) as ts:
            job = await ts.submit_trial_job(form(0))
            return (await wait_status(ts, job.id, "FAILED", timeout=30)).message

    message = run_bounded(body(), 60)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    if fails == "refused":
        assert "quota exceeded for GPUs in namespace ml" in message and "internal error" not in message
        assert not errors  # the platform's word: a warning, no traceback
    else:
        assert "internal error in the flaky backend (KeyError: 'job-template')" in message, message
        assert "nnimanager.log" in message
        assert any(r.exc_info and r.exc_info[0] is KeyError for r in errors)  # the traceback is logged
