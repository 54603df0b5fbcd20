"""The manager core behind TrainingService: what the hub reports and what backends say.

`Core` is the `HubHandler` the hub reports to (hello, records, telemetry, contact) and the
`BackendContext` backends see (add_agent, agent_failed, agent_status). It places trials on
fixed agents here (placement.py decides) and hands elastic platforms to `Elastic`. Everything
runs on the asyncio thread.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from nni_agent.metric_check import MetricBudget
from nni_agent.study_storage import ENV_ENDPOINT as STUDY_ENV, REQUESTED as STUDY_REQUESTED
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.service import constraints
from nni_manager.backends.base import AgentSpec, Backend, Completion, EnvironmentRequest, PlacementHints, as_elastic
from nni_manager.bundle import Bundle
from nni_manager.config import ExperimentConfig
from nni_manager.hub import Hub
from nni_manager import notices
from nni_manager.metrics import checked
from nni_manager.service.placement import AgentView, Decision, Placer, Request
from nni_manager.service.agents import Agents
from nni_manager.service.elastic import Elastic
from nni_manager.service.scope import AgentScope
from nni_manager.service.trials import CONTACT_LOST, Member, Notes, Trials, now_ms
from nni_manager.types import TrialJobDetail, TrialJobMetric, TrialJobStatus

log = logging.getLogger(__name__)
Listener = Callable[..., object]  # a coroutine one runs in the background
STORAGE_ERRORS = (sqlite3.Error, OSError)  # the store cannot be written: a full disk, a lost mount


class Listeners:
    def __init__(self) -> None:
        self.metric: list[Listener] = []
        self.status: list[Listener] = []
        self.parameter: list[Listener] = []


class Background:
    """Background work (listener coroutines, backend hooks): failures are logged, and
    `drain` waits for it all at clean-up."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Future[object]] = set()

    def spawn(self, awaitable: Awaitable[object]) -> None:
        task: asyncio.Future[object] = asyncio.ensure_future(awaitable)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[object]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def notify(self, listeners: list[Listener], *args: object) -> None:
        """Call each listener; a coroutine one runs in the background; a failing one is logged."""
        for cb in list(listeners):
            try:
                result = cb(*args)
                if result is not None and inspect.isawaitable(result):
                    self.spawn(result)
            except Exception:
                log.exception("listener %r failed", cb)

    async def drain(self) -> None:
        for task in list(self.tasks):
            await asyncio.gather(task, return_exceptions=True)


class Core:
    def __init__(self, *, config: ExperimentConfig, backend: Backend[object], experiment_id: str, experiment_dir: Path,
                 trials: Trials, agents: Agents, hub: Hub, bundle: Bundle | None, listeners: Listeners,
                 wake: asyncio.Event, background: Background) -> None:
        self.config, self.backend = config, backend
        self.experiment_id, self.experiment_dir = experiment_id, experiment_dir
        self.trials, self.agents, self.hub, self.bundle = trials, agents, hub, bundle
        self._code_dir: tuple[Path | str | None, str] = (None, "")  # (trialCodeDirectory, as sent)
        self.listeners = listeners
        self.reconnect_window = backend.reconnect_window
        self.resources: dict[str, pb.TrialResources] = {}
        self.stopping = False
        self.elastic = Elastic(self)
        self.scope = AgentScope(trials, agents.name)
        self._bad_metrics: set[tuple[str, str]] = set()  # (agent, trial) warned about
        # a live trial's metric budget, 1.25 times the agent's own (a replay after a reconnect may
        # exceed), and [refused, first reason]
        self._metric_budgets: dict[str, MetricBudget] = {}
        self._refused_metrics: dict[str, list[Any]] = {}
        self._placer = Placer()
        # Placement's view of each fixed agent, kept between placements and rebuilt only for the
        # agents something happened to (None: failed): placing one trial costs O(1) views, not
        # O(agents), in a burst of 1,000 submissions to 1,000 agents.
        self._views: dict[str, AgentView | None] = {}
        self._stale: set[str] = set()
        self._wake = wake
        self.spawn, self.notify = background.spawn, background.notify

    # ------------------------------------------------------------------ plumbing
    def wake(self) -> None:
        self._wake.set()

    def touch(self, agent_id: str) -> None:
        """Something placement looks at changed for this agent: rebuild its view."""
        self._stale.add(agent_id)

    def send(self, agent_id: str, **body: Any) -> None:
        self.hub.send(agent_id, pb.Command(**body))

    # ------------------------------------------------------------------ BackendContext
    def add_agent(self, name: str, hints: PlacementHints = PlacementHints()) -> AgentSpec:
        self.touch(name)
        return self.agents.add(name, hints)

    def agent_failed(self, agent_id: str, reason: str, *, failed: bool = False) -> None:
        agent = self.agents.by_id.get(agent_id)
        if agent is None:
            return
        reason = notices.explain_agent_failure(reason, started=agent.host is not None)
        self._explain_signalled(agent_id, reason)
        env = self.agents.env_of(agent_id)
        if env is not None and self.elastic.agent_ended(env, agent_id):
            return
        agent.failed = reason
        self.touch(agent_id)
        status = TrialJobStatus.FAILED if failed else TrialJobStatus.SYS_CANCELED
        if env is not None:
            self.elastic.failed(env, reason, status)
        for t in self.trials.live_on(agent_id):
            self.trials.finish(t, status, reason)
        self.wake()

    def _explain_signalled(self, agent_id: str, reason: str) -> None:
        """Trials whose agent was stopped by a signal ended SYS_CANCELED saying only that; now
        the platform says why (evicted, deleted, node lost)."""
        for t in self.trials.by_id.values():
            if (agent_id in t.agents and t.status == TrialJobStatus.SYS_CANCELED
                    and self.trials.end_causes.get(t.id) == pb.END_CAUSE_AGENT_SIGNALLED):
                self.trials.change(t, message=f"{reason} ({t.message})")

    def agent_status(self, agent_id: str, message: str) -> None:
        agent = self.agents.by_id.get(agent_id)
        if agent is not None and agent.status != message:
            agent.status = message
            self.touch(agent_id)
            self.wake()

    def agent_url(self, agent_id: str, url: str) -> None:
        agent = self.agents.by_id.get(agent_id)
        if agent is not None:
            agent.url = url

    def agent_connected(self, agent_id: str) -> bool:
        return self.hub.connected(agent_id)

    def hub_listen_address(self) -> str:
        return self.hub.address

    def environments(self) -> list[EnvironmentRequest]:
        return [EnvironmentRequest(e.env_id, tuple(self.agents.spec(a) for a in e.members), e.trial_id)
                for e in self.agents.envs.values() if e.live]

    # ------------------------------------------------------------------ HubHandler
    def agent_hello(self, agent_id: str, hello: pb.Hello, restarted: bool) -> None:
        agent = self.agents.by_id[agent_id]
        agent.host, agent.status = hello.host, ""
        self.touch(agent_id)  # connected now, and its host and GPUs are known
        if hello.HasField("gpus"):
            agent.gpus = hello.gpus
        kept = {s.trial_id: s for s in hello.trials}
        pending = {c.start_trial.trial_id for c in self.hub.pending_commands(agent_id) if c.HasField("start_trial")}
        for t in self.trials.live_on(agent_id):
            if t.id in kept:
                self.apply_status(agent_id, kept[t.id])
                self.trials.clear_contact_message(t)
            elif restarted and t.status == TrialJobStatus.RUNNING:
                self.trials.finish(t, TrialJobStatus.SYS_CANCELED, f"agent {agent.name} restarted and lost the trial")
            elif t.status == TrialJobStatus.WAITING and t.id not in pending:
                self.send_start(t, agent_id)  # the manager restarted before the agent got it
            else:
                self.trials.clear_contact_message(t)
        for trial_id in kept:
            known = self.trials.by_id.get(trial_id)
            if known is None or known.status.is_terminal:  # e.g. cancelled after the reconnect window
                reason = "the manager had already given up on this trial"
                self.send(agent_id, cancel_trial=pb.CancelTrial(trial_id=trial_id, reason=reason))
        self.wake()

    def apply_records(self, agent_id: str, boot_id: str, last_seq: int, records: list[pb.Record]) -> None:
        trials, store = self.trials, self.trials.store
        notes: Notes = []
        metrics: list[tuple[str, str, str, int, int, str, int, dict[str, object]]] = []  # one executemany
        allows, by_id = self.scope.allows, trials.by_id
        with trials.undone_on_failure({r.status.trial_id for r in records if r.HasField("status")}), \
                store.transaction():
            for r in records:
                kind = r.WhichOneof("body")
                if kind == "metric":
                    m = r.metric
                    trial_id, data = m.trial_id, m.data
                    if not allows(agent_id, trial_id, "a metric"):
                        continue
                    message = self._metric_ok(agent_id, trial_id, data)
                    if message is None:
                        self._metric_refused(trial_id)
                        continue
                    metrics.append((trial_id, agent_id, boot_id, r.seq, m.trial_seq, data, m.time_ms or now_ms(),
                                    message))
                    if trial_id in by_id:
                        notes.append(("metric", TrialJobMetric(trial_id, data, message)))
                elif kind == "status":
                    if allows(agent_id, r.status.trial_id, "a status"):
                        if metrics:  # stored first, in arrival order
                            store.add_metrics(metrics)
                            metrics = []
                        self.apply_status(agent_id, r.status, notes)
                elif kind == "parameter_request" and allows(
                        agent_id, r.parameter_request.trial_id, "a parameter request"):
                    notes.append(("parameter", (r.parameter_request.trial_id, r.parameter_request.parameter_index)))
            if metrics:
                store.add_metrics(metrics)
            store.set_agent_progress(agent_id, boot_id, last_seq)
        metric_listeners = self.listeners.metric
        for what, payload in notes:
            if what == "metric":
                self.notify(metric_listeners, payload)
            elif what == "parameter":
                assert isinstance(payload, tuple)  # (trial id, parameter index), appended above
                self.notify(self.listeners.parameter, *payload)
            else:
                self.notify(self.listeners.status, payload)

    def telemetry(self, agent_id: str, report: pb.GpuReport | pb.ResourceReport) -> None:
        if isinstance(report, pb.GpuReport):
            self.agents.by_id[agent_id].gpus = report
            self.touch(agent_id)
            self.wake()
        else:
            for r in report.trials:
                if self.scope.allows(agent_id, r.trial_id, "resource use"):
                    self.resources[r.trial_id] = r

    def agent_lost(self, agent_id: str, since: float) -> None:
        name = self.agents.name(agent_id)
        at = time.strftime("%H:%M:%S", time.localtime(since))
        message = f"{CONTACT_LOST}{name} lost at {at}; waiting up to {self.reconnect_window:g} s for it to reconnect"
        self.touch(agent_id)
        for t in self.trials.live_on(agent_id):
            if not self.trials.member_ended(t.id, agent_id):  # a member whose part is done may go
                self.trials.change(t, message=message)
        if not self.stopping:  # backends with their own transport repair it
            self.spawn(self.backend.agent_lost(agent_id))

    def agent_back(self, agent_id: str) -> None:
        self.touch(agent_id)
        for t in self.trials.live_on(agent_id):
            self.trials.clear_contact_message(t)
        self.wake()

    def enrolment_open(self, agent_id: str) -> bool | None:
        return self.backend.enrolment_open(agent_id)

    def agent_revoked(self, agent_id: str, reason: str) -> None:
        """Its session is revoked (HubHandler): the agent is lost for good and so is its environment."""
        self.agent_failed(agent_id, reason)

    def agent_expired(self, agent_id: str) -> None:
        reason = f"agent {self.agents.name(agent_id)} did not reconnect within {self.reconnect_window:g} s"
        self.touch(agent_id)
        for t in self.trials.live_on(agent_id):
            if self.trials.member_ended(t.id, agent_id):
                continue
            self.trials.finish(t, TrialJobStatus.SYS_CANCELED, reason)
            for member in t.agents:
                self.send(member, cancel_trial=pb.CancelTrial(trial_id=t.id, reason=reason))
        self.wake()

    def log_file(self, agent_id: str, trial_id: str, stream: int) -> Path | None:
        if not self.scope.allows(agent_id, trial_id, "log output"):
            return None
        names: dict[int, str] = {pb.LOG_STREAM_STDERR: "trial.stderr", pb.LOG_STREAM_TRIAL_LOG: "trial.log"}
        name = names.get(stream, "trial.stdout")
        t = self.trials.by_id.get(trial_id)
        base = self.experiment_dir / "trials" / trial_id
        if t is not None and len(t.agents) > 1:  # one file per replica, named for its role and index
            return base / "replicas" / self.agents.by_id[agent_id].member.label / name
        return base / name

    def _metric_ok(self, agent_id: str, trial_id: str, data: str) -> dict[str, object] | None:
        """The metric decoded, when every reader (and NNI's tuner) can take it and the trial's budget
        allows it; else None, with a warning the first time per agent and trial, so that no reader
        ever meets it. The agent checks the same first: this is the trust boundary's own check."""
        budget = self._metric_budgets.get(trial_id)
        if budget is None:
            t = self.trials.by_id.get(trial_id)
            budget = MetricBudget(scale=1.25)
            if t is not None and not t.status.is_terminal:
                self._metric_budgets[trial_id] = budget
        problem = budget.take(len(data))  # first: a flood costs no parsing
        message, problem = (None, problem) if problem else checked(data)
        if problem:
            refused = self._refused_metrics.setdefault(trial_id, [0, problem])
            refused[0] += 1
        if problem and (agent_id, trial_id) not in self._bad_metrics:
            if len(self._bad_metrics) < 4096:
                self._bad_metrics.add((agent_id, trial_id))
            log.warning("agent %s sent a malformed metric for trial %s (%s): refused", self.agents.name(agent_id),
                        trial_id, problem)
        return message

    def _metric_refused(self, trial_id: str) -> None:
        """Say in a live trial's message how many of its metrics the manager refused (once per 1,000:
        each says it, in the store, and a flood must not become a flood of writes)."""
        t = self.trials.by_id.get(trial_id)
        refused = self._refused_metrics.get(trial_id)
        if t is None or refused is None or t.status.is_terminal:
            self._refused_metrics.pop(trial_id, None)
            return
        count, first = refused
        if count == 1 or count % 1000 == 0:
            s = "" if count == 1 else "s"
            self.trials.change(t, message=f"{count:,} metric{s} refused by the manager (first: {first})")

    # ------------------------------------------------------------------ trials
    def apply_status(self, agent_id: str, st: pb.TrialStatus, notes: Notes | None = None) -> None:
        t = self.trials.by_id.get(st.trial_id)
        if t is None:
            return
        members, completion = self._members(t)
        ended_by_platform = self.elastic.stops_members(t.environment_id, t.id)
        for other in self.trials.apply_status(agent_id, st, members, completion, notes):
            if other != agent_id and not ended_by_platform:
                reason = f"the trial ended: {t.message or t.status.value}"
                self.send(other, cancel_trial=pb.CancelTrial(trial_id=t.id, reason=reason))
        if t.status.is_terminal:
            self._metric_budgets.pop(t.id, None)
            refused = self._refused_metrics.pop(t.id, None)
            if refused is not None:
                count, first = refused
                said = f"{count:,} metric{'' if count == 1 else 's'} refused by the manager (first: {first})"
                self.trials.change(t, notes, message=f"{t.message}; {said}" if t.message else said)

    def _members(self, t: TrialJobDetail) -> tuple[list[Member], Completion]:
        env = self.agents.envs.get(t.environment_id or "")
        if env is None:
            return [self.agents.by_id[a].member for a in t.agents if a in self.agents.by_id], Completion()
        return self.agents.members(env), as_elastic(self.backend).environment_backend(env.env_id).shape().completion

    def place(self) -> None:
        if self.stopping:
            return
        try:
            if self.backend.mixed_pool() is not None:
                self.elastic.tick(self._place_on_machines(mixed=True))
            elif self.backend.elastic:
                self.elastic.tick()
            else:
                self._place_on_machines()
        except STORAGE_ERRORS as e:  # e.g. a full disk: the loop must live on and retry at the next change
            log.error("cannot store placement decisions in %s: %s; trying again at the next change",
                      self.experiment_dir, e)

    def _place_on_machines(self, mixed: bool = False) -> list[TrialJobDetail]:
        """Place waiting trials on the fixed machines. `mixed` (hybrid mode with a cluster
        platform): return the trials left to environments instead of failing or holding them: those
        whose placementConstraint names the cluster platform, and those no machine takes now."""
        trials, agents = self.trials, self.agents
        waiting = trials.waiting()
        if not waiting:
            return []
        to_elastic: list[TrialJobDetail] = []
        pool = self.backend.mixed_pool() if mixed else None
        if pool is not None:
            to_elastic = [t for t in waiting if pool.pinned_part(t) is not None]
            waiting = [t for t in waiting if t not in to_elastic]
        unusable = self.unusable_reason()
        if unusable:  # nothing will ever run them
            for t in waiting:
                trials.finish(t, TrialJobStatus.FAILED, unusable)
            return []
        requests = [_request(t, self.config.trial_gpu_number) for t in waiting]
        views = self._agent_views()
        decisions = []
        if mixed:  # a machine takes one unscheduled trial at a time, as an environment does
            unscheduled = [r for r in requests if r.device is None and not r.gpu_number]
            scheduled = [r for r in requests if r not in unscheduled]
            decisions = self._placer.place(scheduled, views)
            taken = {d.agent_id for d in decisions if d.agent_id}
            idle = [v for v in views if not v.trials and v.agent_id not in taken]
            decisions += self._placer.place(unscheduled, idle) if idle else [
                Decision(r.trial_id, message="waiting: every machine runs a trial") for r in unscheduled]
        else:
            decisions = self._placer.place(requests, views)
        pinned = {r.trial_id for r in requests if r.device is not None or r.invalid}
        for d in decisions:
            t = trials.by_id[d.trial_id]
            if mixed and not d.agent_id and d.trial_id not in pinned:
                to_elastic.append(t)  # no machine takes it (now or ever): an environment may
            elif d.failed:
                trials.finish(t, TrialJobStatus.FAILED, d.message)
            elif d.agent_id:
                trials.change(t, agents=[d.agent_id], gpu_indices=list(d.gpu_indices) if d.scheduled else None,
                              message=f"starting on {agents.name(d.agent_id)}")
                self.send_start(t, d.agent_id)
            elif d.message != t.message:
                trials.change(t, message=d.message)
        order = {t.id: i for i, t in enumerate(trials.waiting())}
        return sorted(to_elastic, key=lambda t: order.get(t.id, 0))

    def _agent_views(self) -> list[AgentView]:
        """Placement's views of the usable agents, rebuilding only the stale ones."""
        views, agents, trials = self._views, self.agents.by_id, self.trials
        stale = self._stale | trials.by_id.touched | (agents.keys() - views.keys())
        self._stale = set()
        trials.by_id.touched.clear()
        for agent_id in stale:
            a = agents.get(agent_id)
            if a is None or a.failed or a.env_id is not None:  # environment members: Elastic's
                views[agent_id] = None
                continue
            views[agent_id] = AgentView(
                agent_id=a.agent_id, name=a.name, connected=self.agent_connected(a.agent_id), hints=a.hints,
                gpus=a.gpus, trials={t.id: tuple(t.gpu_indices or ()) for t in trials.live_on(agent_id)},
                pids=trials.agent_pids(agent_id), status=a.status,
                names=tuple(n for n in (a.hints.host, a.host.hostname if a.host else "") if n),
                host_known=a.host is not None,
            )
        return [v for v in views.values() if v is not None]

    def unusable_reason(self) -> str:
        """Why no trial can ever run (every agent failed for good), or "" while some can. Cheap:
        it stops at the first agent that has not failed."""
        if self.backend.mixed_pool() is not None:  # environments can still be made
            return ""
        agents = self.agents.by_id.values()
        if agents and all(a.failed for a in agents):
            return "no machine is usable: " + "; ".join(f"{a.name}: {a.failed}" for a in agents)
        return ""

    def send_start(self, t: TrialJobDetail, agent_id: str) -> None:
        cfg = self.config
        agent = self.agents.by_id[agent_id]
        if agent.url and t.url != agent.url:
            self.trials.change(t, url=agent.url)
        command, env = cfg.trial_command, self.backend.trial_secret_env(agent_id)
        if cfg.shared_storage is not None:  # the agent mounts it; the key travels only in StartTrial
            env.update(cfg.shared_storage.agent_env())
        if self.hub.study is not None:  # an Optuna study's trial: its agent offers it the study's storage
            env[STUDY_ENV] = STUDY_REQUESTED
        if agent.env_id is not None:  # an environment member: its role's command, and who it is
            shape = as_elastic(self.backend).environment_backend(agent.env_id).shape()
            role = next((r for r in shape.roles if r.name == agent.role), None)
            command = (role.command if role and role.command else None) or command
            env.update({"NNI_TRIAL_ROLE": agent.role, "NNI_TRIAL_ROLE_INDEX": str(agent.index),
                        "NNI_TRIAL_ENVIRONMENT": agent.env_id})
        start = pb.StartTrial(
            trial_id=t.id, sequence_id=t.sequence_id, experiment_id=self.experiment_id,
            platform=self.backend.agent_platform(agent_id), command=command, parameter=t.form.hyper_parameters.value,
            env=env, gpus=pb.GpuAssignment(scheduled=t.gpu_indices is not None, indices=t.gpu_indices or []),
            limits=pb.Limits(
                max_duration_ms=int((cfg.max_trial_duration or 0) * 1000),
                kill_signal=_signal_number(cfg.trial_kill_signal),
                grace_period_ms=int(cfg.trial_grace_period * 1000),
            ),
        )
        output = self.backend.trial_output_directory(agent_id, t.id, agent.role, agent.index)
        if output:  # on the platform's storage (Kubernetes' nfs / pvc), so outputs outlive the pod
            start.output_directory = output
        if self.bundle is not None and self.backend.ships_code_to(agent_id):
            start.bundle.digest, start.bundle.size = self.bundle.digest, self.bundle.size
        else:
            start.code_directory = self._code_directory()
        self.send(agent_id, start_trial=start)
        for index, value in self.trials.store.parameters(t.id):
            if index >= 1:
                self.send(agent_id, send_parameter=pb.SendParameter(trial_id=t.id, index=index, parameter=value))


    def _code_directory(self) -> str:
        """trialCodeDirectory as agents on this machine's file system see it, resolved once per value,
        not at every trial start (a realpath is an lstat per path component)."""
        code = self.config.trial_code_directory
        if self._code_dir[0] != code:
            # in the image: as written (relative: the image's working directory)
            self._code_dir = (code, str(code) if self.backend.code_in_image else str(Path(code).expanduser().resolve()))
        return self._code_dir[1]


def _request(t: TrialJobDetail, default: int | None) -> Request:
    """What the trial asks of placement: trialGpuNumber, unless its placementConstraint says otherwise."""
    c = constraints.parse(t.form.placement_constraint, default)
    return Request(t.id, c.gpu_number, device=c.device, invalid=c.invalid)


def _signal_number(name: str) -> int:
    name = name.upper()
    return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
