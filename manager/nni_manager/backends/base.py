"""The whole contract between the manager core and a backend.

A backend only *bootstraps* agents: it starts `nni-agent` processes somewhere with a way
to reach the hub, and it cleans up. Trials, metrics, logs, GPUs and code all travel
through the agent protocol, so a new backend is one file implementing `start` and `stop`.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from nni_manager.config import ExperimentConfig


@dataclass(frozen=True)
class PlacementHints:
    """Per-agent GPU knobs (NNI's `gpuIndices`, `maxTrialNumberPerGpu`, `useActiveGpu`)."""

    gpu_indices: tuple[int, ...] | None = None
    max_trial_number_per_gpu: int = 1
    use_active_gpu: bool = False


@dataclass(frozen=True)
class AgentSpec:
    """One agent a backend must start.

    `token` is a secret: hand it to the agent through the NNI_AGENT_TOKEN environment
    variable or a 0600 file (`nni-agent --token-file`), never on a command line.
    """

    agent_id: str
    token: str
    hub_address: str  # TCP gRPC target on the manager host, e.g. "127.0.0.1:40123" ("" if not needs_tcp_hub)
    hub_unix_socket: Path  # the same hub on a Unix socket (local agents use this)

    def __repr__(self) -> str:  # keep the token out of logs and tracebacks
        return f"AgentSpec(agent_id={self.agent_id!r}, hub_address={self.hub_address!r})"


class BackendContext(Protocol):
    """What the manager core offers a backend."""

    experiment_id: str
    experiment_dir: Path

    def add_agent(self, name: str, hints: PlacementHints) -> AgentSpec:
        """Register an agent the backend is about to start (same name after a manager
        restart gives back the same agent id and token, so running agents re-attach)."""
        ...

    def agent_failed(self, agent_id: str, reason: str) -> None:
        """The backend gave up on an agent (bootstrap failed, machine gone for good):
        its trials end SYS_CANCELED with `reason`, placement stops using it, others go on."""
        ...

    def agent_connected(self, agent_id: str) -> bool:
        """Whether the agent currently holds an open stream to the hub."""
        ...


class Backend(abc.ABC):
    """Base class of every platform backend. Subclasses set `platform` and implement
    `start` and `stop`; everything else has a sensible default."""

    platform: ClassVar[str]
    # How long a silent agent's trials stay alive by default (`trainingService.reconnectWindow`
    # overrides it): the hub waits this long for the agent, and the agent for its manager.
    default_reconnect_window: ClassVar[float] = 60.0
    # Whether agents reach the hub over TCP (127.0.0.1, e.g. through tunnels). Backends whose
    # agents use the Unix socket say False, and the hub then listens on no port at all.
    needs_tcp_hub: ClassVar[bool] = True

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config

    @property
    def reconnect_window(self) -> float:
        configured = self.config.training_service.reconnect_window
        return configured if configured is not None else self.default_reconnect_window

    @property
    def agent_env(self) -> dict[str, str]:
        """Extra environment for every agent (`trainingService.agentEnv`)."""
        return dict(self.config.training_service.agent_env)

    @abc.abstractmethod
    async def start(self, ctx: BackendContext) -> None:
        """Start (or re-attach to) this backend's agents. May return before they connect;
        report machines that cannot be bootstrapped with `ctx.agent_failed`."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop the agents and release everything this backend created. The hub has
        already asked each agent to stop its trials; make sure nothing stays running."""

    async def agent_lost(self, agent_id: str) -> None:
        """The agent's stream broke. Backends with their own transport (SSH tunnels)
        repair it here; the default does nothing and the agent simply redials."""

    def render(self) -> str:
        """Dry run: describe, without side effects, what `start` would launch."""
        return f"{self.platform}: (no dry-run rendering)"
