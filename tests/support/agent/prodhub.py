"""The production hub (`nni_manager.hub.Hub`) and agent registry, for tests that run real
`nni-agent` processes: what the agent's half of the protocol meets in production.

`ProdHub` owns an experiment directory with a real `Store`, the registry a manager uses
(`service.agents.Agents`: per-agent tokens in the store, registered with the hub, and
re-registered from the store by a restarted manager), and a `Hub` whose handler is a
`RecordingHandler`: it sees what the hub hands the manager core (only after the hub's token
and version checks, deduplication and ordering) and stores each batch's progress in the same
transaction, as the core does. `restart()` is a manager restart: a new `Hub` built from the
store, on the same port unless asked otherwise. With `tls=` (a TlsMaterial, e.g. the
experiment's own CA from `experiment_tls`, as a manager's loopback hub has) the TCP listener
serves TLS, the registry hands agents that CA, and `start_agent` gives them `--ca-file`.

Only `bundles_served` is observation added to the hub (`ObservedHub`); nothing is changed.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import AgentSpec, PlacementHints
from nni_manager.hub import Hub, TlsMaterial
from nni_manager.service.agents import Agents
from nni_manager.store import Store

TERMINAL = {
    pb.TRIAL_STATE_SUCCEEDED,
    pb.TRIAL_STATE_FAILED,
    pb.TRIAL_STATE_USER_CANCELED,
    pb.TRIAL_STATE_EARLY_STOPPED,
    pb.TRIAL_STATE_SYS_CANCELED,
}
_LOG_NAMES = {pb.LOG_STREAM_STDOUT: "trial.stdout", pb.LOG_STREAM_STDERR: "trial.stderr",
              pb.LOG_STREAM_TRIAL_LOG: "trial.log"}


@dataclass
class TrialView:
    """One trial as the manager core saw it: statuses, metrics, log bytes, parameter requests."""

    statuses: list[pb.TrialStatus] = field(default_factory=list)
    metrics: list[pb.Metric] = field(default_factory=list)
    logs: dict[int, bytearray] = field(default_factory=lambda: defaultdict(bytearray))
    parameter_requests: list[int] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def final(self) -> pb.TrialStatus | None:
        return self.statuses[-1] if self.statuses and self.statuses[-1].state in TERMINAL else None


async def stop_agents(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each agent still running and wait (SIGKILL after 20 s) without blocking the loop."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)


def apply_record(trials: dict[str, TrialView], rec: pb.Record) -> None:
    """What the core takes from one record, kept per trial (log bytes at their offsets)."""
    kind = rec.WhichOneof("body")
    if kind == "status":
        view = trials[rec.status.trial_id]
        view.statuses.append(rec.status)
        if rec.status.state in TERMINAL:
            view.ended.set()
    elif kind == "metric":
        trials[rec.metric.trial_id].metrics.append(rec.metric)
    elif kind == "log":
        buf = trials[rec.log.trial_id].logs[rec.log.stream]
        end = rec.log.offset + len(rec.log.data)
        if len(buf) < end:
            buf.extend(b"\0" * (end - len(buf)))
        buf[rec.log.offset:end] = rec.log.data
    elif kind == "parameter_request":
        trials[rec.parameter_request.trial_id].parameter_requests.append(rec.parameter_request.parameter_index)


class RecordingHandler:
    """The hub's handler (`HubHandler`): records what reaches the manager core and checks the
    hub's promise: per (agent, boot), records arrive in seq order, each once, with no gap."""

    def __init__(self, store: Store, experiment_dir: Path) -> None:
        self.store = store
        self.experiment_dir = experiment_dir
        self.trials: dict[str, TrialView] = defaultdict(TrialView)
        self.hellos: list[tuple[str, pb.Hello, bool]] = []  # (agent_id, hello, restarted)
        self.events: list[tuple[str, str]] = []  # ("lost" | "back" | "expired", agent_id)
        self.telemetry_reports: list[tuple[str, Any]] = []
        self.applied: dict[tuple[str, str], int] = {}  # (agent_id, boot_id) -> last seq seen here
        self.duplicates = 0  # records handed over twice: a hub bug
        self.gaps: list[tuple[str, int, int]] = []  # (agent_id, after, got): a lost record
        self.errors: list[str] = []  # exceptions raised by the test hooks below
        # Test hooks, called on the hub's task right after the event (before the hub answers):
        self.after_apply: Callable[[str, list[pb.Record]], None] | None = None
        self.on_hello: Callable[[str], None] | None = None
        self.on_lost: Callable[[str], None] | None = None
        self.changed = asyncio.Event()

    def sessions(self, agent_id: str) -> int:
        """Streams the hub accepted from `agent_id` (Hello answered with Welcome)."""
        return sum(1 for a, _, _ in self.hellos if a == agent_id)

    def _hook(self, hook: Callable[..., None] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception as e:  # noqa: BLE001 - surfaced through `errors`, never into the hub
            self.errors.append(repr(e))

    # ------------------------------------------------------------------ HubHandler
    def agent_hello(self, agent_id: str, hello: pb.Hello, restarted: bool) -> None:
        self.hellos.append((agent_id, hello, restarted))
        self._hook(self.on_hello, agent_id)
        self.changed.set()

    def apply_records(self, agent_id: str, boot_id: str, last_seq: int, records: list[pb.Record]) -> None:
        key = (agent_id, boot_id)
        with self.store.transaction():
            for rec in records:
                prev = self.applied.get(key, 0)
                if rec.seq <= prev:
                    self.duplicates += 1
                    continue
                if rec.seq != prev + 1:
                    self.gaps.append((agent_id, prev, rec.seq))
                self.applied[key] = rec.seq
                apply_record(self.trials, rec)
            self.store.set_agent_progress(agent_id, boot_id, last_seq)
        self._hook(self.after_apply, agent_id, records)
        self.changed.set()

    def telemetry(self, agent_id: str, report: pb.GpuReport | pb.ResourceReport) -> None:
        self.telemetry_reports.append((agent_id, report))
        self.changed.set()

    def agent_lost(self, agent_id: str, since: float) -> None:
        self.events.append(("lost", agent_id))
        self._hook(self.on_lost, agent_id)
        self.changed.set()

    def agent_back(self, agent_id: str) -> None:
        self.events.append(("back", agent_id))
        self.changed.set()

    def agent_expired(self, agent_id: str) -> None:
        self.events.append(("expired", agent_id))
        self.changed.set()

    def log_file(self, agent_id: str, trial_id: str, stream: int) -> Path | None:
        return self.experiment_dir / "trials" / trial_id / _LOG_NAMES.get(stream, "trial.stdout")


class ObservedHub(Hub):
    """The production hub, also noting which bundles it served (the hub itself keeps no count)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bundles_served: list[str] = []

    async def _serve_bundle(self, session: Any, digest: str) -> None:
        self.bundles_served.append(digest)
        await super()._serve_bundle(session, digest)


class ProdHub:
    """A production hub on 127.0.0.1 (TCP) plus its Unix socket, with agent subprocesses."""

    def __init__(self, experiment_dir: Path, *, experiment_id: str = "hubexp1", **hub_kwargs: Any) -> None:
        self.experiment_dir = experiment_dir
        self.experiment_id = experiment_id
        self.store = Store.open(experiment_dir)
        self.handler = RecordingHandler(self.store, experiment_dir)
        self.hub_kwargs = hub_kwargs
        self.hub: ObservedHub | None = None
        self.registry: Agents | None = None
        self.port = 0  # the TCP port, kept across restarts
        self.restarts = 0
        self.bundles_served: list[str] = []  # over every hub this manager ran
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def tls(self) -> TlsMaterial | None:
        return self.hub_kwargs.get("tls")

    @property
    def trials(self) -> dict[str, TrialView]:
        return self.handler.trials

    # ------------------------------------------------------------------ the manager
    async def start(self, *, same_port: bool = False) -> ProdHub:
        """Start a hub; its agents come from the store, as in a (re)started manager."""
        tcp = f"127.0.0.1:{self.port if same_port else 0}"
        hub = ObservedHub(experiment_id=self.experiment_id, experiment_dir=self.experiment_dir, store=self.store,
                          handler=self.handler, tcp=tcp, **self.hub_kwargs)
        hub.bundles_served = self.bundles_served
        self.registry = Agents(self.store, hub, self.tls.ca_certificate if self.tls else b"")
        await hub.start()
        self.hub = hub
        self.port = int(hub.address.rpartition(":")[2])
        return self

    async def stop(self, grace: float = 0) -> None:
        """The manager goes away (its agents and trials keep running)."""
        if self.hub is not None:
            await self.hub.stop(grace)
            self.hub = None

    async def restart(self, *, same_port: bool = True) -> None:
        """A new manager on the same experiment: a new Hub registered from the store."""
        await self.stop()
        self.restarts += 1
        await self.start(same_port=same_port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add_agent(self, name: str = "agent-1", hints: PlacementHints = PlacementHints()) -> AgentSpec:
        """Register an agent as the core does for a backend (per-agent token, kept in the store)."""
        assert self.registry is not None, "start() first"
        return self.registry.add(name, hints)

    def token(self, agent_id: str) -> str:
        known = self.store.agent_by_name(agent_id)
        assert known is not None, f"no agent {agent_id}"
        return known["token"]

    def connected(self, agent_id: str) -> bool:
        return self.hub is not None and self.hub.connected(agent_id)

    def send(self, agent_id: str, **body: Any) -> int:
        assert self.hub is not None, "the hub is stopped"
        return self.hub.send(agent_id, pb.Command(**body))

    def start_trial(self, agent_id: str, trial_id: str, command: str, *,
                    parameter: str = '{"parameter_id": 0, "parameters": {}}', **fields: Any) -> int:
        return self.send(agent_id, start_trial=pb.StartTrial(
            trial_id=trial_id, experiment_id=self.experiment_id, platform="local", command=command,
            parameter=parameter, **fields))

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 120, what: str = "condition") -> None:
        """Until `predicate()` holds: woken by the handler, and polled every 50 ms for hub state."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            if loop.time() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            self.handler.changed.clear()
            try:
                await asyncio.wait_for(self.handler.changed.wait(), 0.05)
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------------ agents
    def start_agent(self, work_dir: Path, agent_id: str = "agent-1", *, token: str | None = None,
                    address: str | None = None, manager_file: Path | None = None,
                    extra_env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """An `nni-agent` process dialling the hub (or `address`, or the one in `manager_file`)."""
        env = dict(os.environ, NNI_AGENT_TOKEN=token if token is not None else self.token(agent_id),
                   **(extra_env or {}))
        where = ["--manager-file", str(manager_file)] if manager_file else ["--manager", address or self.address]
        if self.tls is not None:
            ca = self.experiment_dir / "agent-ca.crt"
            ca.write_bytes(self.tls.ca_certificate)
            where += ["--ca-file", str(ca)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "nni_agent", *where, "--agent-id", agent_id,
             "--work-dir", str(work_dir), "--log-file", str(work_dir.parent / f"{agent_id}.log"), *args],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    async def connect_agent(self, work_dir: Path, agent_id: str = "agent-1", **kwargs: Any) -> subprocess.Popen[bytes]:
        """Register `agent_id` (if new), start it, and wait until the hub counts it connected."""
        if self.store.agent_by_name(agent_id) is None:
            self.add_agent(agent_id)
        proc = self.start_agent(work_dir, agent_id, **kwargs)
        await self.wait_for(lambda: self.connected(agent_id) or proc.poll() is not None, 30, f"{agent_id} to connect")
        assert proc.poll() is None, \
            f"agent {agent_id} exited with {proc.returncode}: {self.agent_log(work_dir, agent_id)}"
        return proc

    @staticmethod
    def agent_log(work_dir: Path, agent_id: str = "agent-1") -> str:
        path = work_dir.parent / f"{agent_id}.log"
        return path.read_text() if path.exists() else ""

    async def close(self) -> None:
        await stop_agents(self.procs)
        await self.stop()
        self.store.close()

    async def __aenter__(self) -> ProdHub:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class HubContext:
    """The manager core's side of the backend contract (`BackendContext`) over a `ProdHub`, for
    backend tests without the whole service: agents get the registry's per-agent tokens,
    `agent_connected` is the hub's (an open stream now, not "ever said hello"), and a lost
    stream wakes the backend (`agent_lost`) as the core does."""

    def __init__(self, hub: ProdHub) -> None:
        self.hub = hub
        self.experiment_id = hub.experiment_id
        self.experiment_dir = hub.experiment_dir
        self.added: dict[str, tuple[str, PlacementHints]] = {}  # agent_id -> (name, hints)
        self.failures: dict[str, str] = {}
        self.statuses: dict[str, str] = {}
        self.urls: dict[str, str] = {}
        self.backend: Any = None  # set by attach()
        self._lost_tasks: set[asyncio.Task[None]] = set()

    def attach(self, backend: Any) -> None:
        """Tell `backend` when the hub loses one of its agents (Core.agent_lost does)."""
        self.backend = backend

        def lost(agent_id: str) -> None:
            if self.backend is backend:
                task = asyncio.ensure_future(backend.agent_lost(agent_id))
                self._lost_tasks.add(task)
                task.add_done_callback(self._lost_tasks.discard)

        self.hub.handler.on_lost = lost

    def add_agent(self, name: str, hints: PlacementHints = PlacementHints()) -> AgentSpec:
        spec = self.hub.add_agent(name, hints)
        self.added[spec.agent_id] = (name, hints)
        return spec

    def agent_failed(self, agent_id: str, reason: str, *, failed: bool = False) -> None:
        self.failures[agent_id] = reason

    def agent_status(self, agent_id: str, message: str) -> None:
        self.statuses[agent_id] = message

    def agent_url(self, agent_id: str, url: str) -> None:
        self.urls[agent_id] = url

    def agent_connected(self, agent_id: str) -> bool:
        return self.hub.connected(agent_id)

    def environments(self) -> list[Any]:
        return []
