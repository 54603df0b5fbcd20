"""Chaos suite fixtures: a reproducible seed, the `relayed` platform, a paced trial.

Every test prints its seed (`CHAOS_SEED=<n>` in the captured output of a failure); set
CHAOS_SEED to replay a run's choices (timing still varies with the machine's load).
"""
from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from tests.support.manager.helpers import register_backend

# A trial that streams `n` PERIODICAL metrics in chunks with pauses (so link trouble lands
# mid-stream), then a FINAL one; with `hold`, it waits for that file before its last metric.
TRIAL = r'''
import os, time
from pathlib import Path
from nni_agent import get_next_parameter, report_intermediate_result, report_final_result
p = get_next_parameter()
n, chunk, pause = p.get("n", 10), p.get("chunk", 100), p.get("pause", 0.0)
for i in range(n):
    report_intermediate_result(i)
    if pause and i % chunk == chunk - 1:
        time.sleep(pause)
hold = p.get("hold")
while hold and not Path(hold).exists():
    if not Path(hold).parent.exists():
        raise SystemExit(9)  # the test is over: never outlive it
    time.sleep(0.05)
report_final_result(n)
'''


@pytest.fixture
def chaos_seed() -> int:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"CHAOS_SEED={seed}")
    return seed


@pytest.fixture
def code_dir(short_dir: Path) -> Path:
    """The paced TRIAL above (not tests.support.manager.helpers.TRIAL) as trial.py."""
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    return code


@pytest.fixture
def relayed_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Register tests/support/chaos/backend.py as platform `relayed`, as a third-party package would."""
    monkeypatch.syspath_prepend(str(register_backend(tmp_path / "plugin", "chaos-relayed", "relayed",
                                                     "tests.support.chaos.backend:RelayedBackend")))


@pytest.fixture
def make_config(short_dir: Path, code_dir: Path) -> Callable[..., ExperimentConfig]:
    def make(platform: str = "local", reconnect_window: float | None = None, **fields: Any) -> ExperimentConfig:
        fields.setdefault("trial_command", f"{sys.executable} trial.py")
        fields.setdefault("trial_grace_period", 2.0)
        fields.setdefault("experiment_working_directory", short_dir / "exps")
        return ExperimentConfig(
            trial_code_directory=code_dir,
            training_service=TrainingServiceConfig(platform=platform, reconnect_window=reconnect_window),
            **fields,
        )

    return make
