"""Hybrid mode: several training services feeding one pool of agents (NNI's hybrid mode).

`HybridBackend` is the one Backend[object] the core sees. It holds one backend per listed service,
each built with the experiment config narrowed to its own `trainingService` entry, so each
bootstraps its own agents exactly as it would alone (local: a subprocess; remote: SSH).
Every agent then joins the same hub and the same placement, which spreads trials (and GPU
requests, and `placementConstraint`s) over all machines. Backends still never import each
other: this lives in the core, and finds them through the registry.

Cluster platforms (elastic: environments made on demand) combine too. Placement weighs both:
a waiting trial goes to a fixed machine that can take it now (one unscheduled trial per machine
at a time, as an environment runs one); what no machine takes is left to environments, which
the elastic core asks of the cluster parts. A `placementConstraint` of type Device naming a
machine (host, agent name or hostname) pins the trial there; one naming a cluster platform of
the experiment (`[[aml, 0]]`) pins it to that platform's environments.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging

from nni_manager.service import constraints
from nni_manager.backends.base import (AgentSpec, Backend, BackendContext, ElasticBackend, DryRun, EnvironmentRequest, as_elastic,
                                       HubKind, PlacementHints, Shape, options_of)
from nni_manager.backends.registry import backend_class
from nni_manager.config import ExperimentConfig
from nni_manager.config.hybrid import HYBRID, HybridOptions
from nni_manager.types import TrialJobDetail

log = logging.getLogger(__name__)


def make_backend(config: ExperimentConfig) -> Backend[object]:
    """The backend for the config's platform; the hybrid composite for a list of services."""
    platform = config.training_service.platform
    if platform == HYBRID:
        return HybridBackend.composed(config)
    return backend_class(platform)(config)


class _PartContext:
    """What one part sees of the core: everything, with the agents it adds remembered as its own,
    and only its own environments."""

    def __init__(self, ctx: BackendContext, part: Backend[object], hybrid: HybridBackend) -> None:
        self._ctx, self._part, self._owners, self._hybrid = ctx, part, hybrid._owners, hybrid
        self.experiment_id, self.experiment_dir = ctx.experiment_id, ctx.experiment_dir

    def environments(self) -> list[EnvironmentRequest]:
        return [e for e in self._ctx.environments() if self._hybrid.environment_backend(e.env_id) is self._part]

    def add_agent(self, name: str, hints: PlacementHints = PlacementHints()) -> AgentSpec:
        spec = self._ctx.add_agent(name, hints)
        self._owners[spec.agent_id] = self._part
        return spec

    def agent_failed(self, agent_id: str, reason: str, *, failed: bool = False) -> None:
        self._ctx.agent_failed(agent_id, reason, failed=failed)

    def agent_status(self, agent_id: str, message: str) -> None:
        self._ctx.agent_status(agent_id, message)

    def agent_url(self, agent_id: str, url: str) -> None:
        self._ctx.agent_url(agent_id, url)

    def agent_connected(self, agent_id: str) -> bool:
        return self._ctx.agent_connected(agent_id)

    def hub_listen_address(self) -> str:
        return self._ctx.hub_listen_address()


class HybridBackend(ElasticBackend[HybridOptions, object]):
    """Several platforms as one (NNI's hybrid mode): elastic when any part is (`elastic` is set per
    experiment), the fixed parts' agents placed with the clusters' environments. Its options, the
    list of services, are the loader's (`config.hybrid.parse`: each entry by its platform's
    `parse_options`), not a section's."""

    platform = HYBRID
    options_type = HybridOptions

    @classmethod
    def composed(cls, config: ExperimentConfig) -> HybridBackend:
        """The backend for this list of services. What the list implies of the class's ClassVars
        (which hub its agents reach, whether code ships, whether it is elastic, single-use
        credentials) is set on a class made for it, never on an instance."""
        options = options_of(config, HybridOptions)
        kinds: list[type[Backend[object]]] = [backend_class(ts.platform) for ts in options.services]
        hubs = {k.hub for k in kinds}
        # Unix-socket agents need nothing more; tunnels need the loopback TCP listener; cluster
        # agents the network one (the tunnels then reach it on loopback: see hub_names).
        hub: HubKind = "network" if "network" in hubs else "loopback" if "loopback" in hubs else "unix"
        composite: type[HybridBackend] = type(cls.__name__, (cls,), {
            "hub": hub, "ships_code": any(k.ships_code for k in kinds), "elastic": any(k.elastic for k in kinds),
            "single_use_credentials": any(k.single_use_credentials for k in kinds if issubclass(k, ElasticBackend)),
            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        return composite(config, kinds)

    def __init__(self, config: ExperimentConfig, kinds: list[type[Backend[object]]]) -> None:
        if type(self) is HybridBackend:
            raise TypeError("HybridBackend.composed(config) makes a hybrid backend (its class says what the list implies)")
        super().__init__(config)
        self.parts: list[Backend[object]] = [
            kind(dataclasses.replace(config, training_service=ts)) for kind, ts in zip(kinds, self.opts.services)
        ]
        self._owners: dict[str, Backend[object]] = {}
        self._started: list[Backend[object]] = []
        self._env_part: dict[str, ElasticBackend[object, object]] = {}
        self._turn = 0
        self.fixed_parts = [p for p in self.parts if not p.elastic]
        self.elastic_parts = [as_elastic(p) for p in self.parts if p.elastic]

    @property
    def mixed(self) -> bool:
        """Fixed machines and cluster environments in one pool."""
        return bool(self.fixed_parts) and bool(self.elastic_parts)

    def mixed_pool(self) -> HybridBackend | None:
        return self if self.mixed else None

    # ------------------------------------------------------------------ elastic capacity
    def pinned_part(self, trial: TrialJobDetail) -> ElasticBackend[object, object] | None:
        """The cluster part a trial's placementConstraint Device names by its platform, if any."""
        c = constraints.parse(trial.form.placement_constraint, None)
        if c.device is None:
            return None
        return next((p for p in self.elastic_parts if p.platform == c.device[0]), None)

    def environment_backend(self, env_id: str, trial: TrialJobDetail | None = None) -> ElasticBackend[object, object]:
        part = self._env_part.get(env_id)
        if part is None:
            if not self.elastic_parts:
                return self
            part = self.pinned_part(trial) if trial is not None else None
            if part is None:  # round robin over the cluster parts
                self._turn += 1
                part = self.elastic_parts[self._turn % len(self.elastic_parts)]
            self._env_part[env_id] = part
        return part

    def environment_fits(self, env_id: str, trial: TrialJobDetail) -> bool:
        pinned = self.pinned_part(trial)
        return pinned is None or self._env_part.get(env_id) is pinned

    def shape(self) -> Shape:
        return self.elastic_parts[0].shape() if self.elastic_parts else Shape()

    def member_names(self, env_id: str) -> list[tuple[str, str, int]]:
        part = self.environment_backend(env_id)
        names = part.member_names(env_id)
        for name, _, _ in names:
            self._owners[name] = part
        return names

    @property
    def reuse(self) -> bool:
        return all(p.reuse for p in self.elastic_parts)

    async def provision(self, env: EnvironmentRequest) -> None:
        part = self.environment_backend(env.env_id)
        for m in env.members:
            self._owners[m.agent_id] = part
        await part.provision(env)

    async def release(self, env_id: str) -> None:
        await self.environment_backend(env_id).release(env_id)

    async def manager_address(self) -> str | None:
        for part in self.elastic_parts:
            address = await part.manager_address()
            if address:
                return address
        return None

    def hub_names(self) -> list[str]:
        """The network hub's certificate also names 127.0.0.1, where SSH tunnels deliver."""
        names = [n for p in self.parts for n in p.hub_names()]
        return names + (["127.0.0.1"] if any(p.hub == "loopback" for p in self.parts) else [])

    @property
    def reconnect_window(self) -> float:
        """The hub's window: the longest of the parts' (each agent still waits its own)."""
        return max(p.reconnect_window for p in self.parts)

    def part_of(self, agent_id: str) -> Backend[object] | None:
        return self._owners.get(agent_id)

    def agent_platform(self, agent_id: str) -> str:
        part = self._owners.get(agent_id)
        return part.agent_platform(agent_id) if part is not None else self.platform

    def enrolment_open(self, agent_id: str) -> bool | None:
        part = self._owners.get(agent_id)
        return part.enrolment_open(agent_id) if part is not None else None

    def trial_secret_env(self, agent_id: str) -> dict[str, str]:
        part = self._owners.get(agent_id)
        return part.trial_secret_env(agent_id) if part is not None else {}

    def trial_output_directory(self, agent_id: str, trial_id: str, role: str = "", index: int = 0) -> str:
        part = self._owners.get(agent_id)
        return part.trial_output_directory(agent_id, trial_id, role, index) if part is not None else ""

    def ships_code_to(self, agent_id: str) -> bool:
        part = self._owners.get(agent_id)
        return part.ships_code_to(agent_id) if part is not None else self.ships_code

    async def start(self, ctx: BackendContext) -> None:
        """Start every part; one that cannot start at all fails the experiment, as it would alone
        (its machines that merely fail to bootstrap are reported per agent, as usual)."""
        for part in self.parts:
            self._started.append(part)
            await part.start(_PartContext(ctx, part, self))

    async def stop(self) -> None:
        results = await asyncio.gather(*(p.stop() for p in self._started), return_exceptions=True)
        for part, result in zip(self._started, results):
            if isinstance(result, BaseException):
                log.error("stopping the %s part of the hybrid training service failed: %s", part.platform, result)

    async def trial_concurrency_changed(self) -> None:
        """Each part holds a copy of the config (narrowed to its service): the new value goes into
        every copy, then to the part."""
        for part in self.parts:
            part.config.trial_concurrency = self.config.trial_concurrency
        for part in self._started:
            await part.trial_concurrency_changed()

    async def agent_lost(self, agent_id: str) -> None:
        part = self._owners.get(agent_id)
        if part is not None:
            await part.agent_lost(agent_id)

    def preflight(self) -> None:
        for part in self.parts:
            part.preflight()

    def render(self) -> DryRun:
        rendered = [p.render() for p in self.parts]
        text = "\n\n".join(f"[{r.platform}]\n{r.text}" for r in rendered)
        return DryRun(self.platform, [req for r in rendered for req in r.requests],
                      f"hybrid: {len(rendered)} training services, one pool of agents\n\n{text}")
