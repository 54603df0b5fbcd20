"""Agents and environments: who may connect, what each one is, and what it is waiting for.

Every agent has a per-agent token (minted here, kept in the store so a restarted manager
gives running agents the same one). Agents of elastic platforms belong to an environment:
a group started together (one TFJob, one pod) whose members run each trial together.
"""
from __future__ import annotations

import dataclasses
import re
import secrets
import time
from collections.abc import Iterable
from typing import Any

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import AgentSpec, PlacementHints
from nni_manager.hub import Hub
from nni_manager.service.trials import Member
from nni_manager.store import Store

_NAME = re.compile(r"[A-Za-z0-9_.-]+")

# Environment states, as stored.
PROVISIONING, READY, RELEASED, FAILED = "provisioning", "ready", "released", "failed"


@dataclasses.dataclass
class AgentState:
    agent_id: str
    name: str
    hints: PlacementHints
    env_id: str | None = None
    role: str = ""
    index: int = 0
    gpus: pb.GpuReport | None = None
    host: pb.HostInfo | None = None
    failed: str = ""  # the backend gave up on it
    status: str = ""  # the platform's words on why it is not there yet
    url: str = ""  # the platform's page for the agent's job (the `url` of trials placed on it)

    @property
    def member(self) -> Member:
        return Member(self.agent_id, self.role, self.index)


@dataclasses.dataclass
class Environment:
    env_id: str
    members: list[str]  # agent ids
    trial_id: str | None = None  # bound to one trial (reuseMode false)
    state: str = PROVISIONING
    reason: str = ""  # why it failed
    since: float = dataclasses.field(default_factory=time.monotonic)  # of the current state / last trial end
    ever_ready: bool = False

    @property
    def live(self) -> bool:
        return self.state in (PROVISIONING, READY)


def _hints(d: dict[str, Any]) -> PlacementHints:
    gi = d.get("gpu_indices")
    return PlacementHints(
        gpu_indices=None if gi is None else tuple(gi),
        max_trial_number_per_gpu=d.get("max_trial_number_per_gpu", 1),
        use_active_gpu=d.get("use_active_gpu", False),
    )


class Agents:
    """The agent registry (mirrored in the store and registered with the hub)."""

    def __init__(self, store: Store, hub: Hub, ca_certificate: bytes) -> None:
        self.store = store
        self.hub = hub
        self.ca_certificate = ca_certificate
        self.by_id: dict[str, AgentState] = {}
        self.envs: dict[str, Environment] = {}
        for a in store.agents():
            self.by_id[a["agent_id"]] = AgentState(a["agent_id"], a["name"], _hints(a["hints"]), a["env_id"],
                                                   a["role"], a["idx"])
            hub.register(a["agent_id"], a["token"], boot_id=a["boot_id"], applied_seq=a["applied_seq"],
                         next_cmd_seq=a["next_cmd_seq"], enrol=bool(a["enrol"]), spent=a["spent"])
        for e in store.environments():
            members = [a.agent_id for a in self.by_id.values() if a.env_id == e["env_id"]]
            self.envs[e["env_id"]] = Environment(e["env_id"], members, e["trial_id"], e["state"], e["reason"],
                                                 ever_ready=e["state"] == READY)

    def add(self, name: str, hints: PlacementHints, env_id: str | None = None, role: str = "",
            index: int = 0, enrol: bool = False) -> AgentSpec:
        """Register an agent (or find it again by name after a restart) and its spec. With
        `enrol`, its token is a single-use enrolment credential (see Hub.register)."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"agent name {name!r}: use letters, digits, '.', '_' and '-' only")
        known = self.store.agent_by_name(name)
        if known is None:
            token = secrets.token_urlsafe(32)
            with self.store.transaction():
                self.store.add_agent(name, name, token, dataclasses.asdict(hints), env_id, role, index, enrol)
            self.hub.register(name, token, enrol=enrol)
        else:
            token = known["token"]
        self.by_id[name] = AgentState(name, name, hints, env_id, role, index)
        return self.spec(name, token)

    def spec(self, agent_id: str, token: str | None = None) -> AgentSpec:
        a = self.by_id[agent_id]
        if token is None:
            known = self.store.agent_by_name(a.name)
            assert known is not None
            token = known["token"]
        return AgentSpec(agent_id=agent_id, token=token, hub_address=self.hub.public_address,
                         hub_unix_socket=self.hub.socket_path, ca_certificate=self.ca_certificate,
                         role=a.role, index=a.index)

    def connected(self, agent_id: str) -> bool:
        return self.hub.connected(agent_id)

    def name(self, agent_id: str) -> str:
        a = self.by_id.get(agent_id)
        return a.name if a else agent_id

    # ------------------------------------------------------------------ environments
    def add_environment(self, env_id: str, trial_id: str | None) -> Environment:
        env = Environment(env_id, [], trial_id)
        self.envs[env_id] = env
        self.save(env)
        return env

    def save(self, env: Environment) -> None:
        with self.store.transaction():
            self.store.save_environment(env.env_id, env.trial_id, env.state, env.reason)

    def set_state(self, env: Environment, state: str, reason: str = "") -> None:
        if env.state == state:
            return
        env.state, env.reason, env.since = state, reason or env.reason, time.monotonic()
        if state == READY:
            env.ever_ready = True
        self.save(env)

    def env_of(self, agent_id: str) -> Environment | None:
        a = self.by_id.get(agent_id)
        return self.envs.get(a.env_id) if a is not None and a.env_id else None

    def members(self, env: Environment) -> list[Member]:
        return [self.by_id[a].member for a in env.members]

    def all_connected(self, env: Environment) -> bool:
        return bool(env.members) and all(self.connected(a) for a in env.members)

    def live_envs(self) -> Iterable[Environment]:
        return (e for e in self.envs.values() if e.live)

    def why_not_ready(self, env: Environment) -> str:
        """The platform's words on the members that are not connected yet."""
        parts = []
        for agent_id in env.members:
            a = self.by_id[agent_id]
            if not self.connected(agent_id):
                parts.append(a.status or f"waiting for agent {a.name} to connect")
        return "; ".join(dict.fromkeys(parts)) or "starting"
