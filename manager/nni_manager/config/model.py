"""The typed experiment config the loader builds (`ExperimentConfig` and its sections)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nni_manager.types import SearchSpace
from nni_manager.config.redaction import redacted_repr
from nni_manager.config.shared_storage import SharedStorageConfig


@dataclass
class TrainingServiceConfig:
    """The `trainingService` section: the fields every platform shares. A platform's own
    fields are parsed by its backend (`Backend.parse_options`) into `options`."""

    platform: str
    use_active_gpu: bool | None = None
    max_trial_number_per_gpu: int = 1
    gpu_indices: list[int] | None = None
    options: object = None  # the backend's own options (`Backend.options_type`; e.g. the remote machine list)
    nni_manager_ip: str | None = None
    # The hub agents dial on network platforms (clusters): a fixed port for firewalls
    # (`hubPort`; default: any free one, kept across manager restarts), TLS on unless
    # `hubTls: false`, and optionally the user's own certificate.
    hub_port: int | None = None
    hub_tls: bool = True
    hub_cert_file: Path | None = None
    hub_key_file: Path | None = None
    hub_ca_file: Path | None = None
    # `hubBindAddress`: where the hub listens (default: every interface when agents come from the
    # network, the address itself when `nniManagerIp` is loopback); `nniManagerIp` is only what
    # agents are told to dial, so a public IP, a NAT port-forward or a DNS name can be advertised.
    hub_bind_address: str | None = None
    # `hubTunnel` (Kubernetes family): agents reach the hub through a relay pod and the API
    # server's port-forward; None: on when `nniManagerIp` is not given.
    hub_tunnel: bool | None = None
    # `hubTunnelImage`: the relay pod's image (any image with `python3`; a mirror in private clusters).
    hub_tunnel_image: str | None = None
    # Our extensions. `reconnectWindow`: how long a silent agent's trials are kept alive (and
    # how long an orphaned agent waits for its manager); None = the backend's default.
    reconnect_window: float | None = None
    # `agentEnv`: extra environment for every agent (and so its trials), e.g. CUDA paths.
    agent_env: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # by the secret rule: agentEnv's secret variables show as ***
        return redacted_repr(self)


@dataclass
class TunerConfig:
    """A tuner, assessor or advisor: NNI's built-in `name`, or a customised `className` found in
    `codeDirectory`; either with its `classArgs`."""

    name: str = ""  # built in: NNI's names (TPE, Medianstop, Hyperband, ...); Random, GridSearch without nni
    class_args: dict[str, Any] = field(default_factory=dict)
    class_name: str | None = None  # a customised algorithm: "module.Class" importable from code_directory
    code_directory: Path | None = None
    kind: str = "tuner"  # "tuner", "assessor" or "advisor" (an advisor is run as NNI runs it: as the tuner)
    include_intermediate_results: bool = False  # NNI_INCLUDE_INTERMEDIATE_RESULTS for the dispatcher

    def __repr__(self) -> str:  # by the secret rule: secret classArgs show as ***
        return redacted_repr(self)


AlgorithmConfig = TunerConfig
LOG_LEVELS = ("fatal", "error", "warning", "info", "debug", "trace")


@dataclass
class ExperimentConfig:
    trial_command: str  # "" when the platform's roles carry their own commands (kubeflow, ...)
    trial_code_directory: Path
    training_service: TrainingServiceConfig
    trial_concurrency: int = 1
    trial_gpu_number: int | None = None
    max_trial_number: int | None = None
    max_experiment_duration: float | None = None  # seconds
    max_trial_duration: float | None = None  # seconds
    experiment_working_directory: Path = field(default_factory=lambda: Path("~/nni-experiments").expanduser())
    experiment_name: str | None = None
    search_space: SearchSpace | None = None
    tuner: TunerConfig | None = None  # the tuner, or the advisor (NNI's canonical form moves it here)
    assessor: TunerConfig | None = None
    tuner_gpu_indices: list[int] | None = None
    # How trials are stopped: NNI 3's trial keeper sends SIGINT (a Python trial sees
    # KeyboardInterrupt and can clean up and report) and SIGKILL 5 s later; ours are configurable.
    trial_kill_signal: str = "SIGINT"
    trial_grace_period: float = 5.0
    debug: bool = False
    log_level: str = "info"  # NNI's logLevel: the manager's log file and the dispatcher's
    config_file: Path | None = None  # the YAML it was loaded from: `nni-manager resume ID` loads it again
    # NNI annotations: the search space came from the trial code, and the run expands the code
    # into the experiment's directory first (then this is false, as NNI 2's nnictl left it)
    use_annotation: bool = False
    # wheels of the agent's dependencies for workers whose Python lacks them and has no index
    # (`agentWheelhouse`: fill it with `pip download`); the manager's cache and pip come first/last
    agent_wheelhouse: Path | None = None
    # NNI's `sharedStorage`: NFS or an Azure blob container every worker mounts, where trials work
    # and write their outputs
    shared_storage: SharedStorageConfig | None = None

    def __repr__(self) -> str:  # by the secret rule (each section's repr hides its own)
        return redacted_repr(self)
