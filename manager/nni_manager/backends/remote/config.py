"""The remote platform's own config: `trainingService.machineList` (NNI §9, v1 spellings too)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nni_manager.config import ConfigError, ConfigSection, ExperimentConfig, check_per_gpu


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
    host = m.str_("host", "ip", required=True)
    user = m.str_("user", "username", required=True)
    assert host is not None and user is not None
    machine = MachineConfig(host=host, user=user)
    port = m.int_("port", minimum=1)
    if port is not None:
        if port > 65535:
            raise ConfigError(m.at("port"), f"must be a TCP port (1-65535), got {port}", "use the SSH port, usually 22")
        machine.port = port
    machine.password = m.str_("password", "passwd")
    machine.ssh_key_file = m.path_("sshKeyFile", "sshKeyPath")
    if machine.ssh_key_file is not None and not machine.ssh_key_file.is_file():
        raise ConfigError(m.at("sshKeyFile"), f"{machine.ssh_key_file} does not exist",
                          "point it at your private key file, e.g. ~/.ssh/id_ed25519")
    machine.ssh_passphrase = m.str_("sshPassphrase", "passphrase")
    machine.use_active_gpu = bool(m.bool_("useActiveGpu"))
    per_gpu = m.int_("maxTrialNumberPerGpu", "maxTrialNumPerGpu", minimum=1)
    if per_gpu is not None:
        check_per_gpu(per_gpu, gpu_number, m.at("maxTrialNumberPerGpu"))
        machine.max_trial_number_per_gpu = per_gpu
    machine.gpu_indices = m.gpu_indices()
    machine.python_path = m.str_("pythonPath")
    machine.proxy_command = m.str_("proxyCommand")
    machine.known_hosts_file = m.path_("knownHostsFile")
    strict = m.bool_("strictHostKeyChecking")
    if strict is not None:
        machine.strict_host_key_checking = strict
    m.finish()
    return machine
