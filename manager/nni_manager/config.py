"""NNI experiment configs (v2 YAML, v1 field names accepted) -> typed, validated objects.

Every mistake raises `ConfigError` naming the field (as a dotted path, e.g.
`trainingService.machineList[1].host`) and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A wrong experiment config: names the field and says how to fix it."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"config field `{field}`: {problem}"
        super().__init__(f"{text}. Fix: {fix}" if fix else text)


@dataclass
class MachineConfig:
    """One `trainingService.machineList` entry (platform: remote)."""

    host: str
    user: str
    port: int = 22
    password: str | None = field(default=None, repr=False)
    ssh_key_file: Path | None = None
    ssh_passphrase: str | None = field(default=None, repr=False)
    use_active_gpu: bool = False
    max_trial_number_per_gpu: int = 1
    gpu_indices: list[int] | None = None
    python_path: str | None = None
    proxy_command: str | None = None  # like OpenSSH's ProxyCommand (%h, %p substituted)
    known_hosts_file: Path | None = None  # default ~/.ssh/known_hosts
    strict_host_key_checking: bool = True


@dataclass
class TrainingServiceConfig:
    """The `trainingService` section. Platform-specific fields not modelled here stay in `extra`."""

    platform: str
    use_active_gpu: bool | None = None
    max_trial_number_per_gpu: int = 1
    gpu_indices: list[int] | None = None
    machine_list: list[MachineConfig] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TunerConfig:
    name: str  # built in: "Random", "GridSearch"
    class_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExperimentConfig:
    trial_command: str
    trial_code_directory: Path
    training_service: TrainingServiceConfig
    trial_concurrency: int = 1
    trial_gpu_number: int | None = None
    max_trial_number: int | None = None
    max_experiment_duration: float | None = None  # seconds
    max_trial_duration: float | None = None  # seconds
    experiment_working_directory: Path = field(default_factory=lambda: Path("~/nni-experiments").expanduser())
    experiment_name: str | None = None
    search_space: dict[str, Any] | None = None
    tuner: TunerConfig | None = None
    # Our extensions for stopping trials (NNI has none): signal name and grace seconds.
    trial_kill_signal: str = "SIGTERM"
    trial_grace_period: float = 5.0
    debug: bool = False
