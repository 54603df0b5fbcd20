"""TrainingService: NNI's training-service API over nni-agents.

    async with create_training_service(config) as ts:
        job = await ts.submit_trial_job(form)

This class is NNI's API and the experiment's lifecycle (open the store, start the hub and the
backend, run the placement loop, clean up). What the hub and the backend report is handled by
`Core` (core.py), trials change state in trials.py, agents and environments live in agents.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import secrets
import string
import time
from pathlib import Path
from typing import Any

from nni_agent.compat import wait_for
from nni_agent.v1 import agent_pb2 as pb
from nni_manager.annotations import expand_annotations
from nni_manager.backends.base import Backend, EnvironmentRequest
from nni_manager import experiment_lock, notices, shared_storage
from nni_manager.bundle import pack
from nni_manager.config import ExperimentConfig, redacted
from nni_manager.errors import ClusterMetadataNotFoundError, TrialExistsError
from nni_manager.hub import Hub
from nni_manager.service import hub_setup
from nni_manager.service.agents import RELEASED, Agents
from nni_manager.service.core import Background, Core, Listener, Listeners
from nni_manager.service import heap
from nni_manager.service.heap import HeapFreezer
from nni_manager.service.hybrid import make_backend
from nni_manager.service.trial_files import DIRECTORY_LIMIT, FILE_LIMIT, TrialFiles
from nni_manager.service.trials import Trials, now_ms
from nni_manager.store import Store
from nni_manager.types import TrialJobApplicationForm, TrialJobDetail, TrialJobStatus

_ALNUM = string.ascii_letters + string.digits
STOP_REASON = "stop_reason"  # the store's setting: why the experiment ended (shown by `nni-manager list --all`)


def _one_line(exc: BaseException | None) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def new_id(length: int) -> str:
    """NNI-style id: a letter, then letters and digits."""
    return secrets.choice(string.ascii_letters) + "".join(secrets.choice(_ALNUM) for _ in range(length - 1))


class TrainingService:
    """NNI's `TrainingService` members, plus what the experiment loop and UI need."""

    def __init__(self, config: ExperimentConfig, *, experiment_id: str | None = None) -> None:
        self.config = config
        self.experiment_id = experiment_id or new_id(8)
        self.experiment_dir: Path = Path(config.experiment_working_directory).expanduser() / self.experiment_id
        self.platform = config.training_service.platform
        self._backend: Backend[object] = make_backend(config)  # hybrid mode: one backend per listed service
        self.reconnect_window = self._backend.reconnect_window
        self._listeners = Listeners()
        self._metadata: dict[str, str] = {}
        self._store: Store | None = None
        self._hub: Hub | None = None
        self._core: Core | None = None
        self._files: TrialFiles | None = None
        self._wake = asyncio.Event()
        self._started = self._cleaned = False
        self._storage_mounted = False  # nni-manager mounted sharedStorage at localMountPoint
        self._run_task: asyncio.Task[None] | None = None
        self._background = Background()
        self._heap = HeapFreezer()
        # how the run ended, as NNI names it (DONE / ERROR / STOPPED) and why: set by the experiment
        # loop before clean-up, kept in the store for `nni-manager list --all`
        self.end_state: tuple[str, str] | None = None
        self._ours = False

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
            if self._store is None:  # refused (or failed) before the store: nothing of ours to clean
                experiment_lock.release(self.experiment_dir)
                self._cleaned = True
                raise
            if self._store is not None and self._ours:  # `list --all` tells this failure apart from a stop
                with contextlib.suppress(Exception):
                    with self._store.transaction():
                        self._store.set_experiment_status("ERROR")
                        self._store.set_setting(STOP_REASON, f"could not start: {_one_line(sys.exc_info()[1])}")
            if self._hub is not None:
                await self._backend.stop()  # whatever it started before failing
                await self._hub.stop()
            if self._store is not None:
                self._store.close()
            if self._storage_mounted and self.config.shared_storage is not None:
                await asyncio.to_thread(shared_storage.release_local, self.config.shared_storage)
            experiment_lock.release(self.experiment_dir)
            self._cleaned = True
            raise

    async def _open(self) -> None:
        experiment_lock.acquire(self.experiment_dir, self.experiment_id)  # one manager per experiment
        self._store = store = Store.open(self.experiment_dir)
        if self.config.use_annotation:
            await asyncio.to_thread(expand_annotations, self.config, self.experiment_dir)
        with store.transaction():
            store.init_experiment(self.experiment_id, _redacted(dataclasses.asdict(self.config)), now_ms())
            store.set_experiment_status("RUNNING")
        self._ours = True  # the store is this experiment's (a refused one is never written to)
        with heap.bulk():  # 100,000 trials after a long run
            trials = Trials(store, lambda t: self._background.notify(self._listeners.status, t), self._wake.set)
        storage = self.config.shared_storage
        if storage is not None:  # NNI: the manager's machine mounts it (nnimount) before any worker starts
            self._storage_mounted = await asyncio.to_thread(shared_storage.prepare_local, storage, self.experiment_id)
        hub_plan = await hub_setup.plan(self._backend, store, self.experiment_dir, self.experiment_id)
        listen, tls = hub_plan.listen, hub_plan.tls
        self._hub = hub = Hub(experiment_id=self.experiment_id, experiment_dir=self.experiment_dir, store=store,
                              reconnect_window=self.reconnect_window, tcp=listen, tls=tls, advertise=hub_plan.advertise)
        agents = Agents(store, hub, tls.ca_certificate if tls else b"")
        bundle = None
        if self._backend.ships_code:  # agents elsewhere get the code over the channel
            bundle = await asyncio.to_thread(pack, Path(self.config.trial_code_directory), self.experiment_dir / "bundles")
        self._core = core = Core(config=self.config, backend=self._backend, experiment_id=self.experiment_id,
                                 experiment_dir=self.experiment_dir, trials=trials, agents=agents, hub=hub,
                                 bundle=bundle, listeners=self._listeners, wake=self._wake,
                                 background=self._background)
        hub.handler = core
        self._files = TrialFiles(core)
        await hub.start()
        hub_setup.remember(store, hub)
        notices.new_experiment()  # its console notices (nni_manager.notices) are said once each
        await self._backend.start(core)
        self._heap.grown_to(len(trials.by_id))
        self._wake.set()

    async def run(self) -> None:
        """Place waiting trials whenever something changed, until clean_up."""
        await self.start()
        core = self.core
        while not core.stopping:
            try:
                await wait_for(self._wake.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            core.place()
            self._heap.grown_to(len(core.trials.by_id))

    async def clean_up(self) -> None:
        """Stop every trial and agent; nothing keeps running afterwards. A stop request (SIGTERM,
        Ctrl-C) that arrives meanwhile does not cut it short: the experiment's end is recorded
        first (a DONE experiment stopped while it cleans up stays DONE), then it is re-raised."""
        if self._cleaned or not self._started:
            return
        self._cleaned = True
        steps = asyncio.ensure_future(self._clean_up_steps())
        cancelled = False
        while not steps.done():
            try:
                await asyncio.shield(steps)
            except asyncio.CancelledError:
                cancelled = True
        steps.result()
        if cancelled:
            raise asyncio.CancelledError

    async def _clean_up_steps(self) -> None:
        core, hub, store = self.core, self._hub, self._store
        assert hub is not None and store is not None
        core.stopping = True
        self._wake.set()
        trials = core.trials
        for t in trials.live():
            if not t.agents:
                trials.finish(t, TrialJobStatus.USER_CANCELED, "the experiment was stopped")
        for agent_id in core.agents.by_id:
            hub.send(agent_id, pb.Command(shutdown=pb.Shutdown(reason="the experiment was stopped")))
        await self._settle(timeout=self.config.trial_grace_period + 10)
        await self._backend.stop()
        if self._storage_mounted and self.config.shared_storage is not None:
            await asyncio.to_thread(shared_storage.release_local, self.config.shared_storage)
        for env in core.agents.envs.values():
            if env.live:
                core.agents.set_state(env, RELEASED)
        for t in trials.live():
            trials.finish(t, TrialJobStatus.USER_CANCELED, "the experiment was stopped")
        if self._run_task:
            await self._run_task
        await self._background.drain()
        await hub.stop()
        status, reason = self.end_state or ("STOPPED", "the training service was cleaned up")
        with store.transaction():
            store.set_experiment_status(status)
            store.set_setting(STOP_REASON, reason)
        store.close()
        experiment_lock.release(self.experiment_dir)
        self._heap.release()

    async def _settle(self, timeout: float) -> None:
        """Wait until no trial runs any more or no agent is connected."""
        core = self.core
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not core.trials.live() or not any(core.agent_connected(a) for a in core.agents.by_id):
                return
            await asyncio.sleep(0.05)

    @property
    def core(self) -> Core:
        if self._core is None:
            raise RuntimeError("the training service is not started: use `async with` or await run()")
        return self._core

    @property
    def trials(self) -> Trials:
        """The trial table (read it; changes go through the API)."""
        return self.core.trials

    # ------------------------------------------------------------------ NNI API
    async def list_trial_jobs(self) -> list[TrialJobDetail]:
        with heap.bulk():
            return [t.snapshot() for t in self.trials.by_id.values()]

    async def get_trial_job(self, trial_id: str) -> TrialJobDetail:
        return self.trials.get(trial_id, self.experiment_id).snapshot()

    def add_trial_job_metric_listener(self, listener: Listener) -> None:
        self._listeners.metric.append(listener)

    def remove_trial_job_metric_listener(self, listener: Listener) -> None:
        self._listeners.metric.remove(listener)

    async def submit_trial_job(self, form: TrialJobApplicationForm) -> TrialJobDetail:
        """Accept a trial at once: WAITING, with `message` saying what it waits for."""
        trials = self.trials
        trial_id = form.id or self._fresh_trial_id()
        if trial_id in trials.by_id:
            raise TrialExistsError(f"trial {trial_id} already exists: submit it without an id, or resume it")
        detail = TrialJobDetail(
            id=trial_id, status=TrialJobStatus.WAITING, submit_time=now_ms(), form=form,
            sequence_id=form.sequence_id, message="waiting to be placed",
        )
        trials.by_id[trial_id] = detail
        with trials.store.transaction():
            trials.store.save_trial(detail)
            trials.store.add_event(trial_id, detail.status, detail.message, detail.submit_time)
            trials.store.add_parameter(trial_id, form.hyper_parameters.index, form.hyper_parameters.value)
        self.core.place()
        placed = detail.snapshot()
        # Let the hub answer its agents between the submissions of a burst (trialConcurrency 1,000:
        # 1,000 placements in a row held the loop past the agents' heartbeat silence limit).
        await asyncio.sleep(0)
        return placed

    async def update_trial_job(self, trial_id: str, form: TrialJobApplicationForm) -> TrialJobDetail:
        """Multi-phase: deliver another parameter (written as parameter_<index>.cfg)."""
        trial = self.trials.get(trial_id, self.experiment_id)
        hp = form.hyper_parameters
        with self.trials.store.transaction():
            self.trials.store.add_parameter(trial_id, hp.index, hp.value)
        if not trial.status.is_terminal:
            for agent_id in trial.agents:
                self.core.send(agent_id, send_parameter=pb.SendParameter(trial_id=trial_id, index=hp.index,
                                                                         parameter=hp.value))
        return trial.snapshot()

    @property
    def is_multi_phase_job_supported(self) -> bool:
        return True

    async def cancel_trial_job(self, trial_id: str, is_early_stopped: bool = False) -> None:
        trial = self.trials.get(trial_id, self.experiment_id)
        if trial.status.is_terminal:
            return
        status = TrialJobStatus.EARLY_STOPPED if is_early_stopped else TrialJobStatus.USER_CANCELED
        reason = "early stopped" if is_early_stopped else "canceled by the user"
        if not trial.agents:
            self.trials.finish(trial, status, reason)
            return
        self.trials.cancelling[trial_id] = (status, reason)
        for agent_id in trial.agents:
            self.core.send(agent_id, cancel_trial=pb.CancelTrial(trial_id=trial_id, early_stopped=is_early_stopped,
                                                                 reason=reason))
        self.core.elastic.cancelled(trial)

    async def get_trial_file(self, trial_id: str, name: str, *, max_bytes: int = FILE_LIMIT) -> str | bytes:
        """NNI's getTrialFile: a file of the trial's directory, fetched from its agent wherever it
        runs. `name` is relative to the directory ("trial.log", "output/model.pt"; NNI's "stdout" and
        "stderr" too); text for names without an extension or ending .log/.txt, else bytes. Raises
        TrialNotFoundError, TrialFileNotFoundError, TrialFileNotAllowedError (outside the directory),
        TrialFileTooLargeError, AgentUnavailableError: all TrainingServiceError."""
        return await self._trial_files().get_trial_file(trial_id, name, max_bytes)

    async def download_trial_directory(self, trial_id: str, dest: str | os.PathLike[str], subpath: str = "", *,
                                       max_bytes: int = DIRECTORY_LIMIT) -> list[Path]:
        """NNI's fetchTrialOutput: copy the trial's directory (or `subpath` of it) from its agent into
        `dest`; returns the files written. Symlinks are skipped; errors as for get_trial_file."""
        return await self._trial_files().download(trial_id, dest, subpath, max_bytes)

    def _trial_files(self) -> TrialFiles:
        if self._files is None:
            raise RuntimeError("the training service is not started: use `async with` or await start()")
        return self._files

    async def set_trial_concurrency(self, value: int) -> None:
        """Change trialConcurrency while the experiment runs (NNI's TRIAL_CONCURRENCY update):
        the core's next decision uses it, and the backend resizes what it sized by it."""
        self.config.trial_concurrency = value
        if self._started:
            await self._backend.trial_concurrency_changed()
        self._wake.set()

    async def set_cluster_metadata(self, key: str, value: str) -> None:
        self._metadata[key] = value

    async def get_cluster_metadata(self, key: str) -> str:
        if key not in self._metadata:
            raise ClusterMetadataNotFoundError(f"no cluster metadata {key!r}; known keys: {sorted(self._metadata)}")
        return self._metadata[key]

    # ------------------------------------------------------------------ extras for the loop / UI
    def add_trial_job_status_listener(self, listener: Listener) -> None:
        """`listener(detail)` after every change of a trial's status or message."""
        self._listeners.status.append(listener)

    def remove_trial_job_status_listener(self, listener: Listener) -> None:
        self._listeners.status.remove(listener)

    def add_parameter_request_listener(self, listener: Listener) -> None:
        """`listener(trial_id, parameter_index)` when a trial asks for another parameter."""
        self._listeners.parameter.append(listener)

    def remove_parameter_request_listener(self, listener: Listener) -> None:
        self._listeners.parameter.remove(listener)

    def trial_resources(self, trial_id: str) -> pb.TrialResources | None:
        """Latest CPU / RSS of the trial's process tree."""
        return self.core.resources.get(trial_id)

    def trial_pid(self, trial_id: str) -> int | None:
        """The trial's root process on its agent (single-agent trials)."""
        return self.trials.pids.get(trial_id)

    def agent_gpus(self) -> dict[str, pb.GpuReport]:
        """Latest GPU report per agent id."""
        return {a.agent_id: a.gpus for a in self.core.agents.by_id.values() if a.gpus is not None}

    def agents(self) -> list[dict[str, object]]:
        core = self.core
        return [
            {"agent_id": a.agent_id, "name": a.name, "connected": core.agent_connected(a.agent_id),
             "failed": a.failed, "host": a.host, "environment": a.env_id, "role": a.role, "index": a.index}
            for a in core.agents.by_id.values()
        ]

    def environments(self) -> list[EnvironmentRequest]:
        """Elastic platforms: every environment not released, with its members."""
        return self.core.environments()

    def agent_connected(self, agent_id: str) -> bool:
        return self.core.agent_connected(agent_id)

    def unusable_reason(self) -> str:
        """Why no trial can ever run here (every machine failed for good), or "" while some can."""
        return self.core.unusable_reason()

    def _fresh_trial_id(self) -> str:
        while (trial_id := new_id(5)) in self.trials.by_id:
            pass
        return trial_id


def _redacted(value: object) -> Any:
    """The config as stored in experiment.db: secret values replaced by "***" (config.py's one
    secret rule, `is_secret`, which reprs and the manager's log follow too)."""
    return redacted(value)


def create_training_service(
    config: ExperimentConfig | dict[str, object] | str | Path,
    *,
    experiment_id: str | None = None,
) -> TrainingService:
    """A TrainingService for `config` (an ExperimentConfig, a config dict or a YAML path).

    Use as `async with create_training_service(cfg) as ts:`; with the same `experiment_id`
    (and working directory) it resumes that experiment and re-attaches running trials.
    """
    if not isinstance(config, ExperimentConfig):
        from nni_manager.loader import load_config

        config = load_config(config)
    return TrainingService(config, experiment_id=experiment_id)


