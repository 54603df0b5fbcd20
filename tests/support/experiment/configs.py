"""NNI v2 experiment configs as dicts, built with overrides, for the config-loading tests."""
from __future__ import annotations

from typing import Any


SPACE = {"lr": {"_type": "loguniform", "_value": [0.001, 0.1]}}


def v2(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "trialCommand": "python train.py",
        "trialConcurrency": 2,
        "searchSpace": SPACE,
        "tuner": {"name": "Random"},
        "trainingService": {"platform": "local"},
    }
    for key, value in overrides.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config
