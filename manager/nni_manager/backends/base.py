"""The whole contract between the manager core and a backend.

A backend only *bootstraps* agents: it starts `nni-agent` processes somewhere with a way
to reach the hub, and it cleans up. Trials, metrics, logs, GPUs and code all travel
through the agent protocol. Two kinds of backend share this contract:

- **fixed** (local, remote; `FixedBackend`): a known set of machines; `start` adds one agent
  per machine and the core places any number of trials on each (GPU-aware).
- **elastic** (clusters; `ElasticBackend`): the core asks for capacity. When trials wait, it calls
  `provision(env)` for an *environment*: a group of agents with roles (one TFJob, one
  Framework, one pod) that runs one trial at a time, every member starting its role's
  command. When an environment is no longer needed, `release(env_id)`. The backend says
  why an agent is not there yet with `ctx.agent_status`, which becomes the WAITING
  trial's message.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from nni_manager.config import ConfigSection, ExperimentConfig
    from nni_manager.types import TrialJobDetail

HubKind = Literal["unix", "loopback", "network"]
# a platform's own options (its `trainingService` fields, parsed); covariant: a backend whose options
# the caller does not know is a Backend[object]
OptionsT = TypeVar("OptionsT", covariant=True)
T = TypeVar("T")
RequestT = TypeVar("RequestT")  # what an elastic platform submits for one environment

# placeholders of the dry run, where `provision` has the real secrets
DRY_RUN_TOKEN = "<agent token>"
DRY_RUN_CA = b"<experiment CA certificate>"


ORPHAN_MARGIN_S = 60.0  # an agent outlives the manager's reconnect window by this much
STOP_MARGIN_S = 60.0  # stop-all waits this much beyond trialGracePeriod for the platform


class BackendError(RuntimeError):
    """The platform refused something, or cannot be reached: the message is one line for the
    user, in the platform's words. Every backend's own error derives from this; anything else a
    backend raises is a bug of ours, reported as an internal error with its traceback."""


@dataclass(frozen=True)
class PlacementHints:
    """Per-agent GPU knobs (NNI's `gpuIndices`, `maxTrialNumberPerGpu`, `useActiveGpu`)."""

    gpu_indices: tuple[int, ...] | None = None
    max_trial_number_per_gpu: int = 1
    use_active_gpu: bool = False
    host: str = ""  # the machine as the config names it (a placementConstraint Device may use this name)


@dataclass(frozen=True)
class AgentSpec:
    """One agent a backend must start.

    `token` is a secret: hand it to the agent through the NNI_AGENT_TOKEN environment
    variable or a 0600 file (`nni-agent --token-file`; on clusters a mounted Secret),
    never on a command line or in a pod spec.
    """

    agent_id: str
    token: str
    hub_address: str  # "host:port" agents dial ("" for a hub that listens on the Unix socket only)
    hub_unix_socket: Path  # the same hub on a Unix socket (local agents use this)
    ca_certificate: bytes = b""  # PEM the agent must trust (`nni-agent --ca-file`); empty: no TLS
    role: str = ""  # in an environment: the member's role ("worker", "ps", a task role name)
    index: int = 0  # ... and its index within the role

    def __repr__(self) -> str:  # keep the token out of logs and tracebacks
        return f"AgentSpec(agent_id={self.agent_id!r}, hub_address={self.hub_address!r}, role={self.role!r})"


@dataclass(frozen=True)
class Role:
    """One role of an environment: `replicas` agents running `command` (None: trialCommand)."""

    name: str
    replicas: int = 1
    command: str | None = None


@dataclass(frozen=True)
class Completion:
    """When a trial that runs on several agents ends: FrameworkController's rule, of which
    the training operators' rules are instances.

    - `decisive` (role, index): that member's end is the trial's end and outcome (TFJob's
      chief or worker 0, PyTorchJob's master); the other members are then stopped.
    - `min_failed[role]` failed members of a role fail the trial (default 1; -1: never);
    - `min_succeeded[role]` succeeded members of a role end it SUCCEEDED (-1, the default: never);
    - otherwise the trial ends when every member has: SUCCEEDED unless a member failed.
    """

    decisive: tuple[str, int] | None = None
    min_failed: dict[str, int] = field(default_factory=dict)
    min_succeeded: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Shape:
    """What one environment of an elastic backend is made of."""

    roles: tuple[Role, ...] = (Role(""),)
    completion: Completion = Completion()

    @property
    def size(self) -> int:
        return sum(r.replicas for r in self.roles)


@dataclass(frozen=True)
class EnvironmentRequest:
    """Capacity the core asks an elastic backend for. Start every member with its spec
    (`members[i].role`, `.index`); `trial_id` is set when the environment exists for one trial
    only (reuseMode false): the agents then run with `--single-trial`."""

    env_id: str
    members: tuple[AgentSpec, ...]
    trial_id: str | None = None


@dataclass
class DryRun:
    """What `start` would submit: the request objects themselves (for tests and tools), and
    their rendering for people (YAML for clusters, shell for SSH)."""

    platform: str
    requests: Sequence[object]
    text: str

    def __str__(self) -> str:
        return self.text


class BackendContext(Protocol):
    """What the manager core offers a backend."""

    experiment_id: str
    experiment_dir: Path

    def add_agent(self, name: str, hints: PlacementHints = PlacementHints()) -> AgentSpec:
        """Fixed backends: register an agent the backend is about to start (the same name
        after a manager restart gives back the same agent id and token, so running agents
        re-attach)."""
        ...

    def agent_failed(self, agent_id: str, reason: str, *, failed: bool = False) -> None:
        """The backend gave up on an agent (bootstrap failed, machine gone, pod deleted):
        its trials end SYS_CANCELED with `reason` (FAILED when `failed`: the trial's own doing,
        e.g. OOMKilled), placement stops using it, others go on. For an environment member,
        the whole environment is gone."""
        ...

    def agent_status(self, agent_id: str, message: str) -> None:
        """Why the agent is not there yet, in the platform's words ("FailedScheduling: 0/3
        nodes are available ..."); shown as the message of trials waiting for it."""
        ...

    def agent_url(self, agent_id: str, url: str) -> None:
        """Where people can look at the agent's job in the platform's own UI (a portal's job
        page, a studio URL); trials placed on that agent get it as their `url`."""
        ...

    def agent_connected(self, agent_id: str) -> bool:
        """Whether the agent currently holds an open stream to the hub."""
        ...

    def hub_listen_address(self) -> str:
        """Where the hub listens on TCP ("host:port"), for a relay of the backend's own to dial."""
        ...

    def environments(self) -> list[EnvironmentRequest]:
        """Elastic backends: the environments the core knows (after a restart: to re-attach
        to, or to release what the store no longer wants)."""
        ...


@dataclass(frozen=True)
class HubRoute:
    """A hub behind a backend's relay: it listens on `bind` ("host:port", port 0: any) and agents
    dial `advertise` ("host:port", the relay's); the certificate also carries `names`."""

    bind: str
    advertise: str
    names: tuple[str, ...] = ()


class Backend(abc.ABC, Generic[OptionsT]):
    """Base of every platform backend, generic in the platform's options (`opts`). A platform
    derives from `FixedBackend` (`start`, `stop`) or `ElasticBackend` (`provision`, `release` too),
    sets `platform`, and reads its own `trainingService` fields: `parse_options`, whose result is
    `opts`, of the class's `options_type`."""

    platform: ClassVar[str]
    # The class of this platform's options: what `parse_options` returns (`type(None)` where the
    # platform takes no field of its own); `opts` checks the config holds one.
    options_type: type[OptionsT]
    # How long a silent agent's trials stay alive by default (`trainingService.reconnectWindow`
    # overrides it): the hub waits this long for the agent, and the agent for its manager.
    default_reconnect_window: ClassVar[float] = 60.0
    # How agents reach the hub: "unix" (the socket in the experiment directory: local),
    # "loopback" (127.0.0.1 TCP: tunnels), "network" (nniManagerIp:hubPort, TLS: clusters).
    hub: ClassVar[HubKind] = "loopback"
    # Elastic backends (`ElasticBackend`) get capacity requests (`provision` / `release`).
    elastic: ClassVar[bool] = False
    # Whether trials get the code over the agent stream (False: agents read trialCodeDirectory).
    ships_code: ClassVar[bool] = True
    # Where trialCodeDirectory is a folder inside the job's image, not on this machine (NNI's adl:
    # the code is built into the image): it is neither checked here nor shipped.
    code_in_image: ClassVar[bool] = False
    # False where roles carry their own commands (kubeflow, frameworkcontroller).
    trial_command_required: ClassVar[bool] = True

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.elastic and not any(c.__name__ == "ElasticBackend" and c.__module__ == __name__ for c in cls.__mro__):
            raise TypeError(f"{cls.__qualname__} sets elastic = True: derive it from "
                            "nni_manager.backends.base.ElasticBackend instead (provision, release, shape, reuse)")
        if "parse_options" in vars(cls) and not hasattr(cls, "options_type"):
            raise TypeError(f"{cls.__qualname__} has parse_options but no options_type: set it to the class "
                            "parse_options returns (type(None) for none)")

    # ------------------------------------------------------------------ config
    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> OptionsT:
        """Read this platform's own `trainingService` fields (everything the core did not take) into
        its options, an `options_type`, raising `ConfigError` naming the field and the fix. The
        loader keeps them in `config.training_service.options`; the backend reads them as `opts`."""
        raise NotImplementedError(f"platform {cls.platform} does not say how its trainingService fields are read "
                                  "(parse_options)")

    @property
    def opts(self) -> OptionsT:
        """The platform's options, as `parse_options` made them (checked: a config whose options are
        another platform's is a bug of ours, not a silent wrong read)."""
        return options_of(self.config, self.options_type)

    @property
    def reconnect_window(self) -> float:
        configured = self.config.training_service.reconnect_window
        return configured if configured is not None else self.default_reconnect_window

    @property
    def orphan_timeout(self) -> float:
        """How long an agent keeps its trials once the manager is gone: the reconnect window plus
        a margin, so the manager always gives up first and its trials end with its reason."""
        return self.reconnect_window + ORPHAN_MARGIN_S

    @property
    def stop_deadline(self) -> float:
        """How long stop-all waits for the platform to end the jobs: the trials' grace period
        plus a margin for the platform's own teardown."""
        return self.config.trial_grace_period + STOP_MARGIN_S

    @property
    def agent_env(self) -> dict[str, str]:
        """`trainingService.agentEnv` as it may be written into a script, a pod spec, a job's
        command or an SSH command line: without its secrets (`config.is_secret`), which reach
        the trials over the agent's authenticated stream instead (`trial_secret_env`)."""
        from nni_manager.config import is_secret_entry

        return {k: v for k, v in self.config.training_service.agent_env.items() if not is_secret_entry(k, v)}

    def trial_secret_env(self, agent_id: str) -> dict[str, str]:
        """agentEnv's secret entries (`WANDB_API_KEY`, `HF_TOKEN`, ...), added to the environment of
        each trial this agent starts. They travel in StartTrial over the stream the agent
        authenticated, kept in memory on both sides: never in a file, argv or job definition.
        `PIP_INDEX_URL` with a password is one too (`config.is_secret_value`)."""
        from nni_manager.config import is_secret_entry

        return {k: v for k, v in self.config.training_service.agent_env.items() if is_secret_entry(k, v)}

    def agent_platform(self, agent_id: str) -> str:
        """NNI_PLATFORM for trials on this agent (hybrid mode: the platform of the agent's part)."""
        return self.platform

    def trial_output_directory(self, agent_id: str, trial_id: str, role: str = "", index: int = 0) -> str:
        """Where the trial's NNI_OUTPUT_DIR goes on this agent, or "" for the agent's default (the
        trial's directory). Platforms that mount storage put it there, so outputs outlive the machine."""
        return ""

    def enrolment_open(self, agent_id: str) -> bool | None:
        """Whether the platform says this agent's job runs now (True / False), or None when it
        cannot tell. With single-use credentials the hub accepts enrolment only when not False."""
        return None

    def ships_code_to(self, agent_id: str) -> bool:
        """Whether this agent gets the code over the stream (it is not on this machine)."""
        return self.ships_code

    # ------------------------------------------------------------------ lifecycle
    def preflight(self) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """Checks on this machine that need no network (a credentials file, a client SDK), run by
        `run`, `--detach` and `--dry-run` before anything is created: raise ConfigError."""

    @abc.abstractmethod
    async def start(self, ctx: BackendContext) -> None:
        """Check credentials and start (or re-attach to) the agents. May return before they
        connect; report machines that cannot be bootstrapped with `ctx.agent_failed`. Raise
        (a one-line error) when nothing can work, e.g. the cluster refuses the credentials."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop the agents and release everything this backend created. The hub has
        already asked each agent to stop its trials; make sure nothing stays running."""

    def mixed_pool(self) -> MixedPool | None:
        """A backend made of fixed machines and cluster platforms in one pool (hybrid mode): the
        core places on the machines first and leaves the rest to environments. None: one kind."""
        return None

    async def trial_concurrency_changed(self) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """`config.trial_concurrency` changed while the experiment runs (the WebUI). The core reads
        it for every decision; a backend that sized something by it at start resizes it here."""

    async def agent_lost(self, agent_id: str) -> None:  # noqa: B027 - a hook whose default is to do nothing
        """The agent's stream broke. Backends with their own transport (SSH tunnels)
        repair it here; the default does nothing and the agent simply redials."""

    async def manager_address(self) -> str | None:
        """Network hubs: the address agents reach this manager at when `nniManagerIp` is not
        set (clusters: the one this machine uses to reach the API server); None: must be set."""
        return None

    async def hub_route(self, experiment_id: str, experiment_dir: Path) -> HubRoute | None:
        """Network hubs reached through a relay of the backend's own (Kubernetes' tunnel through
        the API server): where the hub listens and what agents dial; None: `nniManagerIp`. The relay
        lets through only agents that prove `hub.relay_token.relay_token(experiment_dir)`."""
        return None

    def hub_names(self) -> list[str]:
        """Network hubs: further names the hub's certificate must carry, for agents that dial it
        through a relay elsewhere (Slurm's `loginNode`); none by default."""
        return []

    # ------------------------------------------------------------------ dry run
    def render(self) -> DryRun:
        """Dry run: without side effects, the requests `start` (and a first `provision`)
        would submit."""
        return DryRun(self.platform, [], f"{self.platform}: (no dry-run rendering)")


class FixedBackend(Backend[OptionsT]):
    """A known set of machines (local, remote): `start` adds one agent per machine
    (`ctx.add_agent`) and the core places any number of trials on each."""

    elastic: ClassVar[bool] = False


class ElasticBackend(Backend[OptionsT], Generic[OptionsT, RequestT]):
    """A cluster: the core asks for environments (`provision`, `release`).

    What one environment submits is built once, by `build_request`: `provision` submits what it
    returns for the real environment, and the dry run (`render`) shows what it returns for
    `dry_run_env()`, whose tokens and CA are placeholders. The two cannot drift (TorchX:
    `submit()` is `schedule(submit_dryrun())`)."""

    elastic: ClassVar[bool] = True
    # Platforms with no secret store a job can mount (DLTS, AML): an elastic agent's token is a
    # single-use enrolment credential; the hub accepts it once and gives that agent a session token.
    single_use_credentials: ClassVar[bool] = False
    # Whether cancelling a trial of a one-trial environment (reuseMode false) stops its job through
    # the platform at once, so the platform shows it stopped, not completed (REST-job platforms).
    stop_job_on_cancel: ClassVar[bool] = False

    # ------------------------------------------------------------------ elastic capacity
    def shape(self) -> Shape:
        """Elastic backends: what one environment is made of."""
        return Shape()

    def member_names(self, env_id: str) -> list[tuple[str, str, int]]:
        """Elastic backends: (agent name, role, index) of each member of environment `env_id`.
        Names must be what the member can tell on its own (its pod's name, say)."""
        return [(f"{env_id}-{r.name}-{i}" if r.name else (f"{env_id}-{i}" if r.replicas > 1 else env_id), r.name, i)
                for r in self.shape().roles for i in range(r.replicas)]

    def environment_backend(self, env_id: str, trial: TrialJobDetail | None = None) -> ElasticBackend[Any, Any]:
        """Elastic capacity: the backend that makes (and is asked about) environment `env_id`;
        `trial` is the waiting trial it is made for, when the core knows one. A backend is its
        own; hybrid mode answers with one of its parts (service/hybrid.py)."""
        return self

    def environment_fits(self, env_id: str, trial: TrialJobDetail) -> bool:
        """Whether a waiting trial may run on that environment (hybrid mode: its part is the one
        the trial's placementConstraint names, if it names one)."""
        return True

    @property
    def reuse(self) -> bool:
        """Elastic backends: whether an environment runs trial after trial (reuseMode)."""
        return True

    @abc.abstractmethod
    async def provision(self, env: EnvironmentRequest) -> None:
        """Create the environment (return once submitted, not once running): submit what
        `build_request(env)` makes; raise a one-line error if the platform refuses it."""

    @abc.abstractmethod
    async def release(self, env_id: str) -> None:
        """Delete the environment and everything created for it."""

    # ------------------------------------------------------------------ one request, two uses
    def build_request(self, env: EnvironmentRequest, hub: str | None = None) -> RequestT:
        """What `provision(env)` submits (the objects, the job, the batch script), secrets included;
        `hub`: the address the agents dial where it is not the members' own (a relay's)."""
        raise NotImplementedError(f"platform {self.platform} has no request builder")

    def dry_run_hub(self) -> str:
        """The address agents dial, as the dry run shows it (placeholders for what start decides)."""
        ts = self.config.training_service
        return f"{ts.nni_manager_ip or '<nniManagerIp>'}:{ts.hub_port or '<hubPort>'}"

    def dry_run_env(self, env_id: str | None = None) -> EnvironmentRequest:
        """The first environment `provision` would get, with placeholder tokens and CA."""
        hub = self.dry_run_hub()
        tls = self.config.training_service.hub_tls
        env_id = env_id or ("env1" if self.reuse else "trial-dryrun")
        members = tuple(AgentSpec(agent_id=n, token=DRY_RUN_TOKEN, hub_address=hub, hub_unix_socket=Path("/dev/null"),
                                  ca_certificate=DRY_RUN_CA if tls else b"", role=r, index=i)
                        for n, r, i in self.member_names(env_id))
        return EnvironmentRequest(env_id, members, None if self.reuse else "dryrun")


class MixedPool(Protocol):
    """What the core asks of a pool of fixed machines and cluster platforms (`Backend.mixed_pool`)."""

    def pinned_part(self, trial: TrialJobDetail) -> ElasticBackend[object, object] | None:
        """The cluster platform the trial's placementConstraint names, if any (no machine takes it)."""


def options_of(config: ExperimentConfig, kind: type[T]) -> T:
    """`config.training_service.options`, checked to be a `kind` (what a platform's `parse_options`
    made, or the hybrid list)."""
    options = config.training_service.options
    if not isinstance(options, kind):
        raise TypeError(f"the {config.training_service.platform} options are a {type(options).__name__}, "
                        f"not a {kind.__name__}")
    return options


def as_elastic(backend: Backend[object]) -> ElasticBackend[object, object]:
    """The backend as the elastic core uses it: only an elastic backend gets there."""
    if not isinstance(backend, ElasticBackend):
        raise TypeError(f"{type(backend).__name__} is not an ElasticBackend")
    return backend
