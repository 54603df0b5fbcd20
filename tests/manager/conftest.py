"""Fixtures for the manager core: short experiment dirs (Unix socket paths are limited to
107 bytes), configs, trial scripts and polling helpers live in helpers.py. Tests drive asyncio with
`asyncio.run` (no plugin needed)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ExperimentConfig, TrainingServiceConfig


@pytest.fixture
def make_config(short_dir: Path, code_dir: Path) -> Callable[..., ExperimentConfig]:
    def make(*, platform_fields: dict[str, Any] | None = None, **fields: Any) -> ExperimentConfig:
        fields.setdefault("trial_command", f"{sys.executable} trial.py")
        fields.setdefault("trial_grace_period", 2.0)
        return ExperimentConfig(
            trial_code_directory=code_dir,
            training_service=TrainingServiceConfig(platform="local", **(platform_fields or {})),
            experiment_working_directory=short_dir / "exps",
            **fields,
        )

    return make
