"""TrainingService: NNI's training-service API over nni-agents.

    async with create_training_service(config) as ts:
        job = await ts.submit_trial_job(form)

The service keeps the trial table (mirrored in SQLite), places WAITING trials on agents
(placement.py), turns agent records into trial status changes and metric callbacks
(each exactly once), and lets a backend bootstrap the agents. It implements the
`BackendContext` the backend sees and the `HubHandler` the hub reports to.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import re
import secrets
import signal
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import AgentSpec, Backend, PlacementHints
from nni_manager.backends.registry import backend_class
from nni_manager.bundle import Bundle, pack
from nni_manager.config import ExperimentConfig
from nni_manager.hub import Hub
from nni_manager.placement import AgentView, Placer, Request
from nni_manager.store import Store
from nni_manager.types import (
    TrialJobApplicationForm,
    TrialJobDetail,
    TrialJobMetric,
    TrialJobStatus,
)

log = logging.getLogger(__name__)

_STATE = {
    pb.TRIAL_STATE_RUNNING: TrialJobStatus.RUNNING,
    pb.TRIAL_STATE_SUCCEEDED: TrialJobStatus.SUCCEEDED,
    pb.TRIAL_STATE_FAILED: TrialJobStatus.FAILED,
    pb.TRIAL_STATE_USER_CANCELED: TrialJobStatus.USER_CANCELED,
    pb.TRIAL_STATE_EARLY_STOPPED: TrialJobStatus.EARLY_STOPPED,
    pb.TRIAL_STATE_SYS_CANCELED: TrialJobStatus.SYS_CANCELED,
}
_CONTACT_LOST = "contact with agent "
_ALNUM = string.ascii_letters + string.digits
Listener = Callable[..., Any]


def new_id(length: int) -> str:
    """NNI-style id: a letter, then letters and digits."""
    return secrets.choice(string.ascii_letters) + "".join(secrets.choice(_ALNUM) for _ in range(length - 1))


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclasses.dataclass
class _Agent:
    agent_id: str
    name: str
    hints: PlacementHints
    gpus: pb.GpuReport | None = None
    host: pb.HostInfo | None = None
    failed: str = ""  # the backend gave up on it


class TrainingService:
    """NNI's `TrainingService` members, plus what the experiment loop and UI need."""

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        experiment_id: str | None = None,
    ) -> None:
        self.config = config
        self.experiment_id = experiment_id or new_id(8)
        self.experiment_dir: Path = Path(config.experiment_working_directory).expanduser() / self.experiment_id
        self.platform = config.training_service.platform
        self._backend: Backend = backend_class(self.platform)(config)
        self.reconnect_window = self._backend.reconnect_window
        self._trials: dict[str, TrialJobDetail] = {}
        self._pids: dict[str, int] = {}
        self._resources: dict[str, pb.TrialResources] = {}
        self._agents: dict[str, _Agent] = {}
        self._metric_listeners: list[Listener] = []
        self._status_listeners: list[Listener] = []
        self._parameter_listeners: list[Listener] = []
        self._metadata: dict[str, str] = {}
        self._placer = Placer()
        self._bundle: Bundle | None = None
        self._store: Store | None = None
        self._hub: Hub | None = None
        self._wake = asyncio.Event()
        self._started = False
        self._stopping = False
        self._cleaned = False
        self._run_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> TrainingService:
        await self.start()
        self._run_task = asyncio.create_task(self.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.clean_up()

    async def start(self) -> None:
        """Open (or reopen) the experiment, start the hub and the backend's agents."""
        if self._started:
            return
        self._started = True
        try:
            await self._open()
        except BaseException:
            if self._hub is not None:
                await self._backend.stop()  # whatever it started before failing
                await self._hub.stop()
            if self._store is not None:
                self._store.close()
            self._cleaned = True
            raise

    async def _open(self) -> None:
        self._store = store = Store.open(self.experiment_dir)
        with store.transaction():
            store.init_experiment(self.experiment_id, _redacted(dataclasses.asdict(self.config)), _now_ms())
            store.set_experiment_status("RUNNING")
        for t in store.trials():
            self._trials[t.id] = t
        self._hub = Hub(
            experiment_id=self.experiment_id,
            experiment_dir=self.experiment_dir,
            store=store,
            handler=self,
            reconnect_window=self.reconnect_window,
            tcp=self._backend.needs_tcp_hub,
        )
        for a in store.agents():
            self._agents[a["agent_id"]] = _Agent(a["agent_id"], a["name"], _hints(a["hints"]))
            self._hub.register(
                a["agent_id"], a["token"], boot_id=a["boot_id"], applied_seq=a["applied_seq"],
                next_cmd_seq=a["next_cmd_seq"],
            )
        if self.platform != "local":  # remote agents get the code over the channel
            self._bundle = await asyncio.to_thread(
                pack, Path(self.config.trial_code_directory), self.experiment_dir / "bundles"
            )
        await self._hub.start()
        await self._backend.start(self)
        self._wake.set()

    async def run(self) -> None:
        """Place waiting trials whenever something changed, until clean_up."""
        await self.start()
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if not self._stopping:
                self._place()

    async def clean_up(self) -> None:
        """Stop every trial and agent; nothing keeps running afterwards."""
        if self._cleaned or not self._started:
            return
        self._cleaned = True
        self._stopping = True
        self._wake.set()
        hub, store = self._hub, self._store
        assert hub is not None and store is not None
        for t in self._trials.values():
            if not t.status.is_terminal and t.agent_id is None:
                self._finish(t, TrialJobStatus.USER_CANCELED, "the experiment was stopped")
        for agent_id in self._agents:
            hub.send(agent_id, pb.Command(shutdown=pb.Shutdown(reason="the experiment was stopped")))
        await self._settle(timeout=self.config.trial_grace_period + 10)
        await self._backend.stop()
        for t in self._trials.values():
            if not t.status.is_terminal:
                self._finish(t, TrialJobStatus.USER_CANCELED, "the experiment was stopped")
        if self._run_task:
            await self._run_task
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        await hub.stop()
        with store.transaction():
            store.set_experiment_status("STOPPED")
        store.close()

    async def _settle(self, timeout: float) -> None:
        """Wait until no trial runs any more or no agent is connected."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [t for t in self._trials.values() if not t.status.is_terminal]
            if not live or not any(self.agent_connected(a) for a in self._agents):
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ NNI API
    async def list_trial_jobs(self) -> list[TrialJobDetail]:
        return [dataclasses.replace(t) for t in self._trials.values()]

    async def get_trial_job(self, trial_id: str) -> TrialJobDetail:
        return dataclasses.replace(self._trial(trial_id))

    def add_trial_job_metric_listener(self, listener: Listener) -> None:
        self._metric_listeners.append(listener)

    def remove_trial_job_metric_listener(self, listener: Listener) -> None:
        self._metric_listeners.remove(listener)

    async def submit_trial_job(self, form: TrialJobApplicationForm) -> TrialJobDetail:
        """Accept a trial at once: WAITING, with `message` saying what it waits for."""
        store = self._require_store()
        trial_id = form.id or self._fresh_trial_id()
        if trial_id in self._trials:
            raise ValueError(f"trial {trial_id} already exists")
        detail = TrialJobDetail(
            id=trial_id, status=TrialJobStatus.WAITING, submit_time=_now_ms(), form=form,
            sequence_id=form.sequence_id, message="waiting to be placed",
        )
        self._trials[trial_id] = detail
        with store.transaction():
            store.save_trial(detail)
            store.add_event(trial_id, detail.status, detail.message, detail.submit_time)
            store.add_parameter(trial_id, form.hyper_parameters.index, form.hyper_parameters.value)
        self._place()
        return dataclasses.replace(detail)

    async def update_trial_job(self, trial_id: str, form: TrialJobApplicationForm) -> TrialJobDetail:
        """Multi-phase: deliver another parameter (written as parameter_<index>.cfg)."""
        trial = self._trial(trial_id)
        hp = form.hyper_parameters
        with self._require_store().transaction():
            self._require_store().add_parameter(trial_id, hp.index, hp.value)
        if trial.agent_id and not trial.status.is_terminal:
            self._send(trial.agent_id, send_parameter=pb.SendParameter(trial_id=trial_id, index=hp.index, parameter=hp.value))
        return dataclasses.replace(trial)

    @property
    def is_multi_phase_job_supported(self) -> bool:
        return True

    async def cancel_trial_job(self, trial_id: str, is_early_stopped: bool = False) -> None:
        trial = self._trial(trial_id)
        if trial.status.is_terminal:
            return
        status = TrialJobStatus.EARLY_STOPPED if is_early_stopped else TrialJobStatus.USER_CANCELED
        reason = "early stopped" if is_early_stopped else "canceled by the user"
        if trial.agent_id is None:
            self._finish(trial, status, reason)
            return
        self._send(trial.agent_id, cancel_trial=pb.CancelTrial(trial_id=trial_id, early_stopped=is_early_stopped, reason=reason))

    async def set_cluster_metadata(self, key: str, value: str) -> None:
        self._metadata[key] = value

    async def get_cluster_metadata(self, key: str) -> str:
        if key not in self._metadata:
            raise KeyError(f"no cluster metadata {key!r}; known keys: {sorted(self._metadata)}")
        return self._metadata[key]

    # ------------------------------------------------------------------ extras for the loop / UI
    def add_trial_job_status_listener(self, listener: Listener) -> None:
        """`listener(detail)` after every change of a trial's status or message."""
        self._status_listeners.append(listener)

    def remove_trial_job_status_listener(self, listener: Listener) -> None:
        self._status_listeners.remove(listener)

    def add_parameter_request_listener(self, listener: Listener) -> None:
        """`listener(trial_id, parameter_index)` when a trial asks for another parameter."""
        self._parameter_listeners.append(listener)

    def remove_parameter_request_listener(self, listener: Listener) -> None:
        self._parameter_listeners.remove(listener)

    def trial_resources(self, trial_id: str) -> pb.TrialResources | None:
        """Latest CPU / RSS of the trial's process tree."""
        return self._resources.get(trial_id)

    def agent_gpus(self) -> dict[str, pb.GpuReport]:
        """Latest GPU report per agent id."""
        return {a.agent_id: a.gpus for a in self._agents.values() if a.gpus is not None}

    def agents(self) -> list[dict[str, Any]]:
        return [
            {"agent_id": a.agent_id, "name": a.name, "connected": self.agent_connected(a.agent_id),
             "failed": a.failed, "host": a.host}
            for a in self._agents.values()
        ]

    # ------------------------------------------------------------------ BackendContext
    def add_agent(self, name: str, hints: PlacementHints) -> AgentSpec:
        store, hub = self._require_store(), self._hub
        assert hub is not None
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"agent name {name!r}: use letters, digits, '.', '_' and '-' only")
        known = store.agent_by_name(name)
        if known is None:
            token = secrets.token_urlsafe(32)
            with store.transaction():
                store.add_agent(name, name, token, dataclasses.asdict(hints))
            hub.register(name, token)
        else:
            token = known["token"]
        self._agents[name] = _Agent(name, name, hints)
        return AgentSpec(agent_id=name, token=token, hub_address=hub.address, hub_unix_socket=hub.socket_path)

    def agent_failed(self, agent_id: str, reason: str) -> None:
        agent = self._agents[agent_id]
        agent.failed = reason
        for t in self._live_on(agent_id):
            self._finish(t, TrialJobStatus.SYS_CANCELED, reason)
        self._wake.set()

    def agent_connected(self, agent_id: str) -> bool:
        return self._hub is not None and self._hub.connected(agent_id)

    # ------------------------------------------------------------------ HubHandler
    def agent_hello(self, agent_id: str, hello: pb.Hello, restarted: bool) -> None:
        agent = self._agents[agent_id]
        agent.host = hello.host
        if hello.HasField("gpus"):
            agent.gpus = hello.gpus
        kept = {s.trial_id: s for s in hello.trials}
        pending = self._pending_starts(agent_id)
        for t in self._live_on(agent_id):
            if t.id in kept:
                self._apply_status(agent_id, kept[t.id])
                self._clear_contact_message(t)
            elif restarted and t.status == TrialJobStatus.RUNNING:
                self._finish(t, TrialJobStatus.SYS_CANCELED, f"agent {agent.name} restarted and lost the trial")
            elif t.status == TrialJobStatus.WAITING and t.id not in pending:
                self._send_start(t)  # the manager restarted before the agent got it
            else:
                self._clear_contact_message(t)
        for trial_id in kept:
            t = self._trials.get(trial_id)
            if t is None or t.status.is_terminal:  # e.g. cancelled after the reconnect window
                reason = "the manager had already given up on this trial"
                self._send(agent_id, cancel_trial=pb.CancelTrial(trial_id=trial_id, reason=reason))
        self._wake.set()

    def apply_records(self, agent_id: str, boot_id: str, last_seq: int, records: list[pb.Record]) -> None:
        store = self._require_store()
        notes: list[tuple[str, Any]] = []
        with store.transaction():
            for r in records:
                kind = r.WhichOneof("body")
                if kind == "status":
                    self._apply_status(agent_id, r.status, notes)
                elif kind == "metric":
                    m = r.metric
                    store.add_metric(m.trial_id, agent_id, boot_id, r.seq, m.trial_seq, m.data, m.time_ms or _now_ms())
                    if m.trial_id in self._trials:
                        notes.append(("metric", TrialJobMetric(id=m.trial_id, data=m.data)))
                elif kind == "parameter_request":
                    notes.append(("parameter", (r.parameter_request.trial_id, r.parameter_request.parameter_index)))
            store.set_agent_progress(agent_id, boot_id, last_seq)
        for what, payload in notes:
            if what == "metric":
                self._notify(self._metric_listeners, payload)
            elif what == "parameter":
                self._notify(self._parameter_listeners, *payload)
            else:
                self._notify(self._status_listeners, payload)

    def telemetry(self, agent_id: str, report: pb.GpuReport | pb.ResourceReport) -> None:
        if isinstance(report, pb.GpuReport):
            self._agents[agent_id].gpus = report
            self._wake.set()
        else:
            for r in report.trials:
                self._resources[r.trial_id] = r

    def agent_lost(self, agent_id: str, since: float) -> None:
        name = self._agents[agent_id].name
        at = time.strftime("%H:%M:%S", time.localtime(since))
        message = (
            f"{_CONTACT_LOST}{name} lost at {at}; waiting up to {self.reconnect_window:g} s for it to reconnect"
        )
        for t in self._live_on(agent_id):
            self._change(t, message=message)
        if not self._stopping:  # backends with their own transport repair it
            self._spawn(self._backend.agent_lost(agent_id))

    def agent_back(self, agent_id: str) -> None:
        for t in self._live_on(agent_id):
            self._clear_contact_message(t)
        self._wake.set()

    def agent_expired(self, agent_id: str) -> None:
        reason = f"agent {self._agents[agent_id].name} did not reconnect within {self.reconnect_window:g} s"
        for t in self._live_on(agent_id):
            self._finish(t, TrialJobStatus.SYS_CANCELED, reason)
            self._send(agent_id, cancel_trial=pb.CancelTrial(trial_id=t.id, reason=reason))
        self._wake.set()

    # ------------------------------------------------------------------ internals
    def _require_store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the training service is not started: use `async with` or await run()")
        return self._store

    def _trial(self, trial_id: str) -> TrialJobDetail:
        try:
            return self._trials[trial_id]
        except KeyError:
            raise KeyError(f"no trial {trial_id!r} in experiment {self.experiment_id}") from None

    def _fresh_trial_id(self) -> str:
        while (trial_id := new_id(5)) in self._trials:
            pass
        return trial_id

    def _live_on(self, agent_id: str) -> list[TrialJobDetail]:
        return [t for t in self._trials.values() if t.agent_id == agent_id and not t.status.is_terminal]

    def _send(self, agent_id: str, **body: Any) -> None:
        assert self._hub is not None
        self._hub.send(agent_id, pb.Command(**body))

    def _pending_starts(self, agent_id: str) -> set[str]:
        assert self._hub is not None
        return {c.start_trial.trial_id for c in self._hub.pending_commands(agent_id) if c.HasField("start_trial")}

    def _place(self) -> None:
        if self._hub is None or self._stopping:
            return
        waiting = [t for t in self._trials.values() if t.status == TrialJobStatus.WAITING and t.agent_id is None]
        if not waiting:
            return
        if self._agents and all(a.failed for a in self._agents.values()):  # nothing will ever run them
            reasons = "; ".join(f"{a.name}: {a.failed}" for a in self._agents.values())
            for t in waiting:
                self._finish(t, TrialJobStatus.FAILED, f"no machine is usable: {reasons}")
            return
        views = []
        for a in self._agents.values():
            if a.failed:
                continue
            live = self._live_on(a.agent_id)
            views.append(AgentView(
                agent_id=a.agent_id, name=a.name, connected=self.agent_connected(a.agent_id), hints=a.hints,
                gpus=a.gpus, trials={t.id: tuple(t.gpu_indices or ()) for t in live},
                pids=frozenset(pid for tid, pid in self._pids.items() if self._trials[tid].agent_id == a.agent_id),
            ))
        gpu_number = self.config.trial_gpu_number
        requests = [Request(t.id, _gpu_request(t, gpu_number)) for t in waiting]
        for d in self._placer.place(requests, views):
            t = self._trials[d.trial_id]
            if d.failed:
                self._finish(t, TrialJobStatus.FAILED, d.message)
            elif d.agent_id:
                name = self._agents[d.agent_id].name
                self._change(
                    t, agent_id=d.agent_id, gpu_indices=list(d.gpu_indices) if d.scheduled else None,
                    message=f"starting on {name}",
                )
                self._send_start(t)
            elif d.message != t.message:
                self._change(t, message=d.message)

    def _send_start(self, t: TrialJobDetail) -> None:
        assert t.agent_id is not None
        cfg = self.config
        start = pb.StartTrial(
            trial_id=t.id, sequence_id=t.sequence_id, experiment_id=self.experiment_id, platform=self.platform,
            command=cfg.trial_command, parameter=t.form.hyper_parameters.value,
            gpus=pb.GpuAssignment(scheduled=t.gpu_indices is not None, indices=t.gpu_indices or []),
            limits=pb.Limits(
                max_duration_ms=int((cfg.max_trial_duration or 0) * 1000),
                kill_signal=_signal_number(cfg.trial_kill_signal),
                grace_period_ms=int(cfg.trial_grace_period * 1000),
            ),
        )
        if self._bundle is not None:
            start.bundle.digest, start.bundle.size = self._bundle.digest, self._bundle.size
        else:
            start.code_directory = str(Path(cfg.trial_code_directory).expanduser().resolve())
        self._send(t.agent_id, start_trial=start)
        for index, value in self._require_store().parameters(t.id):
            if index >= 1:
                self._send(t.agent_id, send_parameter=pb.SendParameter(trial_id=t.id, index=index, parameter=value))

    def _apply_status(self, agent_id: str, st: pb.TrialStatus, notes: list[tuple[str, Any]] | None = None) -> None:
        t = self._trials.get(st.trial_id)
        status = _STATE.get(st.state)
        if t is None or status is None or t.status.is_terminal:
            return
        if st.pid:
            self._pids[t.id] = st.pid
        fields: dict[str, Any] = {"status": status, "agent_id": agent_id}
        if st.working_directory:
            fields["working_directory"] = st.working_directory
        if st.start_time_ms:
            fields["start_time"] = st.start_time_ms
        if status == TrialJobStatus.RUNNING:
            if t.status == TrialJobStatus.RUNNING:
                return
            fields["message"] = ""
        else:
            fields["end_time"] = st.end_time_ms or _now_ms()
            fields["message"] = st.reason
            fields["is_early_stopped"] = status == TrialJobStatus.EARLY_STOPPED
            self._wake.set()
        self._change(t, notes=notes, **fields)

    def _finish(self, t: TrialJobDetail, status: TrialJobStatus, message: str) -> None:
        self._change(
            t, status=status, message=message, end_time=_now_ms(),
            is_early_stopped=status == TrialJobStatus.EARLY_STOPPED,
        )
        self._wake.set()

    def _clear_contact_message(self, t: TrialJobDetail) -> None:
        if t.message.startswith(_CONTACT_LOST):
            self._change(t, message="" if t.status == TrialJobStatus.RUNNING else f"starting on {t.agent_id}")

    def _change(self, t: TrialJobDetail, notes: list[tuple[str, Any]] | None = None, **fields: Any) -> None:
        """Update a trial, persist it (plus an event on status change) and tell listeners."""
        status_changed = "status" in fields and fields["status"] != t.status
        for k, v in fields.items():
            setattr(t, k, v)
        store = self._require_store()
        with store.transaction():
            store.save_trial(t)
            if status_changed:
                store.add_event(t.id, t.status, t.message, _now_ms())
        if notes is not None:
            notes.append(("status", dataclasses.replace(t)))
        else:
            self._notify(self._status_listeners, dataclasses.replace(t))

    def _spawn(self, awaitable: Any) -> None:
        """Run a listener coroutine or backend hook in the background; failures are logged."""
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def _notify(self, listeners: list[Listener], *args: Any) -> None:
        for cb in list(listeners):
            try:
                result = cb(*args)
                if inspect.isawaitable(result):
                    self._spawn(result)
            except Exception:
                log.exception("listener %r failed", cb)


_SECRET_KEY = re.compile(r"password|passphrase|token|secret|key$", re.IGNORECASE)


def _redacted(value: Any) -> Any:
    """The config as stored in experiment.db: secret-looking values replaced by "***"."""
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEY.search(str(k)) and v else _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


def _gpu_request(t: TrialJobDetail, default: int | None) -> int | None:
    """GPUs the trial needs: NNI's placementConstraint {type: GPUNumber, gpus: [n]} wins."""
    pc = t.form.placement_constraint or {}
    if pc.get("type") == "GPUNumber" and pc.get("gpus"):
        return int(pc["gpus"][0])
    return default


def _signal_number(name: str) -> int:
    name = name.upper()
    return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])


def _hints(d: dict[str, Any]) -> PlacementHints:
    gi = d.get("gpu_indices")
    return PlacementHints(
        gpu_indices=None if gi is None else tuple(gi),
        max_trial_number_per_gpu=d.get("max_trial_number_per_gpu", 1),
        use_active_gpu=d.get("use_active_gpu", False),
    )


def create_training_service(
    config: ExperimentConfig | dict[str, Any] | str | Path,
    *,
    experiment_id: str | None = None,
) -> TrainingService:
    """A TrainingService for `config` (an ExperimentConfig, a config dict or a YAML path).

    Use as `async with create_training_service(cfg) as ts:`; with the same `experiment_id`
    (and working directory) it resumes that experiment and re-attaches running trials.
    """
    if not isinstance(config, ExperimentConfig):
        from nni_manager.config import load_config

        config = load_config(config)
    return TrainingService(config, experiment_id=experiment_id)
