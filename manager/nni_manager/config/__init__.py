"""NNI experiment configs (v2 YAML, v1 field names accepted) -> typed, validated objects.

Every mistake raises `ConfigError` naming the field (as a dotted path, e.g.
`trainingService.machineList[1].host`) and the fix. Layers, lowest first:

- `section`: `ConfigError`, `ConfigSection` and the value parsers backends use;
- `redaction`: the secret rule (`is_secret`, `redacted`, `SecretFormatter`);
- `model`: the dataclasses (`ExperimentConfig`, `TrainingServiceConfig`, `TunerConfig`);
- `load`: `load_config`, which needs the backends, hybrid mode, shared storage and the
  search-space checks, all of which use only the layers above.

Every name is importable from here. The loader's are re-exported lazily (module `__getattr__`),
so importing a primitive from `nni_manager.config` does not pull in the loader, and a backend
may do so without closing an import circle (tests/test_import_cycles.py).
"""
from __future__ import annotations

import importlib
from typing import Any

from nni_manager.config.model import (
    LOG_LEVELS,
    AlgorithmConfig,
    ExperimentConfig,
    TrainingServiceConfig,
    TunerConfig,
)
from nni_manager.config.redaction import (
    REDACTED,
    SecretFormatter,
    is_secret,
    is_secret_entry,
    is_secret_value,
    redacted,
    redacted_repr,
    secret_values,
)
from nni_manager.config.section import (
    MISSING,
    ConfigError,
    ConfigSection,
    canonical_key,
    check_per_gpu,
    parse_duration,
    parse_size_mb,
    yaml_file,
)

_LOADER = frozenset({"load_config", "supported_platforms"})


def __getattr__(name: str) -> Any:
    if name in _LOADER:  # through importlib: the loader is imported when first used, not with the package
        return getattr(importlib.import_module("nni_manager.config.load"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LOG_LEVELS", "MISSING", "REDACTED", "AlgorithmConfig", "ConfigError", "ConfigSection", "ExperimentConfig",
    "SecretFormatter", "TrainingServiceConfig", "TunerConfig", "canonical_key", "check_per_gpu", "is_secret",
    "is_secret_entry", "is_secret_value",
    "load_config", "parse_duration", "parse_size_mb", "redacted", "redacted_repr", "secret_values",
    "supported_platforms", "yaml_file",
]
