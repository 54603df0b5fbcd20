"""What the core's helpers may use of it: narrow ports the core (`service.core.Core`) satisfies.

`Elastic` (environments on demand) and `TrialFiles` (trial files through the agents) are
built by, and called from, the core; depending on these Protocols instead of `Core` keeps the
imports one way (core -> helpers) and says exactly which of the core's parts each one touches.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, Protocol

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import Backend
from nni_manager.config.model import ExperimentConfig
from nni_manager.service.agents import Agents
from nni_manager.service.trials import Trials
from nni_manager.types import TrialJobDetail


class FileFetcher(Protocol):
    """The hub's part TrialFiles uses: a trial's files, streamed from its agent."""

    def fetch_files(self, agent_id: str, request: pb.FileRequest,
                    idle_timeout: float = 30.0) -> AsyncIterator[pb.FileChunk]: ...


class ElasticCore(Protocol):
    """The core as `Elastic` sees it: the experiment's agents, trials and backend, and the
    core's ways to command an agent, start a trial, run background work and place again."""

    config: ExperimentConfig
    backend: Backend[object]
    agents: Agents
    trials: Trials

    def send(self, agent_id: str, **body: Any) -> None: ...

    def send_start(self, t: TrialJobDetail, agent_id: str) -> None: ...

    def spawn(self, awaitable: Awaitable[object]) -> None: ...

    def wake(self) -> None: ...


class TrialFilesCore(Protocol):
    """The core as `TrialFiles` sees it: where trials are, and the hub that fetches their files."""

    experiment_id: str
    experiment_dir: Path
    agents: Agents
    trials: Trials
    @property
    def hub(self) -> FileFetcher: ...
