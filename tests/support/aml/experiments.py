"""AML experiment configs and a run-to-completion driver shared by the AML platform tests."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.manager.helpers import TRIAL
from tests.support.bounded import run_bounded


def run(coro: Any) -> Any:
    return run_bounded(coro, 240)


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


def config_dict(aml: Any, base: Path, **ts: Any) -> dict[str, Any]:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return {"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 2,
            "experimentWorkingDirectory": str(base / "exps"), "trialGracePeriod": 2,
            "trainingService": {**aml.aml_config(), "nniManagerIp": "127.0.0.1", "pollInterval": "0.3s", **ts}}


def ours(aml: Any, experiment_id: str) -> list[dict[str, Any]]:
    return [j for j in aml.jobs() if j["name"].startswith(f"nni_exp_{experiment_id}_")]
