"""Where the manager cannot ship the agent's dependencies (no package index, no agentWheelhouse),
the console of `nni-manager run` says so once, with the fix, and the trial's message points there:
not only log/nnimanager.log. On the Kubernetes emulator with the bare `python:3.11-slim` image
(the system Python alone), downloads off as in every test."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from nni_manager import cli, notices
from nni_manager.backends import agent_deps
from nni_manager.service import create_training_service
from tests.support.kube.fixtures import kube, kube_factory  # noqa: F401 (fixtures)
from tests.support.kube.harness import SLIM_IMAGE, config, pods_service
from tests.support.manager.helpers import form, wait_status


def test_unshippable_dependencies_are_said_on_the_console_once_and_the_trial_points_there(
        kube: Any, short_dir: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short_dir / "wheel-cache"))  # no wheels cached: none at all
    cfg = config(kube, short_dir, pods_service(dockerImage=SLIM_IMAGE), trialConcurrency=2)
    cli._console_notices(cfg)  # as `nni-manager run` does
    try:
        async def body() -> list[str]:
            async with create_training_service(cfg) as ts:
                trials = [await ts.submit_trial_job(form(i)) for i in range(2)]
                return [(await wait_status(ts, t.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)).message
                        for t in trials]

        messages = asyncio.run(asyncio.wait_for(body(), 240))
    finally:
        for h in [h for h in notices.log.handlers if getattr(h, "nni_console", False)]:
            notices.log.removeHandler(h)
    said = [line for line in capsys.readouterr().err.splitlines() if "cannot ship the agent's dependencies" in line]
    assert len(said) == 1, said
    assert SLIM_IMAGE in said[0] and "Fix: fill agentWheelhouse" in said[0], said
    assert all(notices.DEPS_POINTER in m for m in messages), messages


@pytest.fixture(autouse=True)
def _fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notices, "_said", set())
    logging.getLogger("nni_manager.console").setLevel(logging.NOTSET)
