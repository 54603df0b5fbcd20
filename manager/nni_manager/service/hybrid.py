"""Hybrid mode: several training services feeding one pool of agents (NNI's hybrid mode).

`HybridBackend` is the one Backend the core sees. It holds one backend per listed service,
each built with the experiment config narrowed to its own `trainingService` entry, so each
bootstraps its own agents exactly as it would alone (local: a subprocess; remote: SSH).
Every agent then joins the same hub and the same placement, which spreads trials (and GPU
requests, and `placementConstraint`s) over all machines. Backends still never import each
other: this lives in the core, and finds them through the registry.

Only platforms with a fixed set of machines combine (config_hybrid.py refuses the others):
the elastic core asks one backend for environments of one shape.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from nni_manager.backends.base import AgentSpec, Backend, BackendContext, DryRun, PlacementHints
from nni_manager.backends.registry import backend_class
from nni_manager.config import ExperimentConfig
from nni_manager.config_hybrid import HYBRID, HybridOptions

log = logging.getLogger(__name__)


def make_backend(config: ExperimentConfig) -> Backend:
    """The backend for the config's platform; the hybrid composite for a list of services."""
    platform = config.training_service.platform
    if platform == HYBRID:
        return HybridBackend(config)
    return backend_class(platform)(config)


class _PartContext:
    """What one part sees of the core: everything, with the agents it adds remembered as its own."""

    def __init__(self, ctx: BackendContext, part: Backend, owners: dict[str, Backend]) -> None:
        self._ctx, self._part, self._owners = ctx, part, owners

    def add_agent(self, name: str, hints: PlacementHints = PlacementHints()) -> AgentSpec:
        spec = self._ctx.add_agent(name, hints)
        self._owners[spec.agent_id] = self._part
        return spec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


class HybridBackend(Backend):
    platform = HYBRID

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        options: HybridOptions = config.training_service.options
        self.parts: list[Backend] = [
            backend_class(ts.platform)(dataclasses.replace(config, training_service=ts)) for ts in options.services
        ]
        self._owners: dict[str, Backend] = {}
        self._started: list[Backend] = []
        # Unix-socket agents need nothing more; tunnels need the loopback TCP listener.
        self.hub = "loopback" if any(p.hub != "unix" for p in self.parts) else "unix"  # type: ignore[misc]
        self.ships_code = any(p.ships_code for p in self.parts)  # type: ignore[misc]

    @property
    def reconnect_window(self) -> float:
        """The hub's window: the longest of the parts' (each agent still waits its own)."""
        return max(p.reconnect_window for p in self.parts)

    def part_of(self, agent_id: str) -> Backend | None:
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

    def ships_code_to(self, agent_id: str) -> bool:
        part = self._owners.get(agent_id)
        return part.ships_code_to(agent_id) if part is not None else self.ships_code

    async def start(self, ctx: BackendContext) -> None:
        """Start every part; one that cannot start at all fails the experiment, as it would alone
        (its machines that merely fail to bootstrap are reported per agent, as usual)."""
        for part in self.parts:
            self._started.append(part)
            await part.start(_PartContext(ctx, part, self._owners))  # type: ignore[arg-type]

    async def stop(self) -> None:
        results = await asyncio.gather(*(p.stop() for p in self._started), return_exceptions=True)
        for part, result in zip(self._started, results):
            if isinstance(result, BaseException):
                log.error("stopping the %s part of the hybrid training service failed: %s", part.platform, result)

    async def agent_lost(self, agent_id: str) -> None:
        part = self._owners.get(agent_id)
        if part is not None:
            await part.agent_lost(agent_id)

    def render(self) -> DryRun:
        rendered = [p.render() for p in self.parts]
        text = "\n\n".join(f"[{r.platform}]\n{r.text}" for r in rendered)
        return DryRun(self.platform, [req for r in rendered for req in r.requests],
                      f"hybrid: {len(rendered)} training services, one pool of agents\n\n{text}")
