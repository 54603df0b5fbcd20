"""NNI experiment configs (v2 YAML, v1 field names accepted) -> typed, validated objects.

Every mistake raises `ConfigError` naming the field (as a dotted path, e.g.
`trainingService.machineList[1].host`) and the fix. Layers, lowest first:

- `section`: `ConfigError`, `ConfigSection` and the value parsers backends use;
- `redaction`: the secret rule (`is_secret`, `redacted`, `SecretFormatter`);
- `model`: the dataclasses (`ExperimentConfig`, `TrainingServiceConfig`, `TunerConfig`);
- `hybrid`, `shared_storage`: the `trainingService` list (hybrid mode) and `sharedStorage`.

The names of the first three are importable from here. The loader, `load_config` in
`nni_manager.loader`, sits above the backends (each parses its own platform's fields with
these), so this package never imports it: a backend imports the package without closing an
import circle (tests/test_import_cycles.py).
"""
from __future__ import annotations

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

__all__ = [
    "LOG_LEVELS", "MISSING", "REDACTED", "AlgorithmConfig", "ConfigError", "ConfigSection", "ExperimentConfig",
    "SecretFormatter", "TrainingServiceConfig", "TunerConfig", "canonical_key", "check_per_gpu", "is_secret",
    "is_secret_entry", "is_secret_value",
    "parse_duration", "parse_size_mb", "redacted", "redacted_repr", "secret_values", "yaml_file",
]
