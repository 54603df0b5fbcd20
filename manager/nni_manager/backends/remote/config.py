"""The remote platform's own config: `trainingService.machineList` (NNI §9, v1 spellings too)."""
from __future__ import annotations

from dataclasses import dataclass, field

from nni_manager.config import ConfigError, ConfigSection, ExperimentConfig, check_per_gpu
from nni_manager.ssh.machine import SshMachine, parse_machine


@dataclass
class MachineConfig(SshMachine):
    """One `trainingService.machineList` entry (platform: remote): how to reach it, plus its GPU knobs."""

    use_active_gpu: bool = False
    max_trial_number_per_gpu: int = 1
    gpu_indices: list[int] | None = None
    python_path: str | None = None


@dataclass
class RemoteConfig:
    machine_list: list[MachineConfig] = field(default_factory=list)
    reuse_mode: bool | None = None  # accepted for NNI compatibility; agents always stay up


def parse(ts: ConfigSection, config: ExperimentConfig) -> RemoteConfig:
    machines = ts.items("machineList", required=True, fix="add `machineList: [{host: ..., user: ...}]`")
    assert machines is not None
    return RemoteConfig([_machine(m, config.trial_gpu_number) for m in machines], ts.bool_("reuseMode"))


def _machine(m: ConfigSection, gpu_number: int | None) -> MachineConfig:
    if "preCommand" in m.data:
        raise ConfigError(m.at("preCommand"), "is not supported",
                          "use pythonPath to pick the Python environment, or put the command in trialCommand")
    machine = parse_machine(m, MachineConfig)
    machine.use_active_gpu = bool(m.bool_("useActiveGpu"))
    per_gpu = m.int_("maxTrialNumberPerGpu", "maxTrialNumPerGpu", minimum=1)
    if per_gpu is not None:
        check_per_gpu(per_gpu, gpu_number, m.at("maxTrialNumberPerGpu"))
        machine.max_trial_number_per_gpu = per_gpu
    machine.gpu_indices = m.gpu_indices()
    machine.python_path = m.str_("pythonPath")
    if machine.python_path is not None and any(c < " " for c in machine.python_path):
        raise ConfigError(m.at("pythonPath"), f"{machine.python_path!r} holds a control character (a newline?)",
                          "write the directory of the worker's Python on one line, e.g. /usr/bin")
    m.finish()
    return machine
