"""The experiment loop: NNI's NNIManager duties over a TrainingService.

It follows NNI 3's manager (ts/nni_manager/core/nnimanager.ts): the dispatcher (NNI's own
tuner / assessor / advisor process, or a built-in tuner without nni) is initialised with the
search space and asked for `trialConcurrency` trials; their parameter records queue up and
are submitted while fewer than `trialConcurrency` trials are alive; every metric is reported to
the dispatcher, every trial end is told to it and answered with a request for one more trial.
Its "kill trial" verdicts early-stop trials. It stops at maxTrialNumber / maxExperimentDuration
/ an exhausted tuner, and early-stops trials that pass maxTrialDuration. Like NNI, when
maxExperimentDuration runs out no new trial starts and running ones finish. Cancelling `run()`
(Ctrl-C) cancels every live trial USER_CANCELED before the training service cleans up; a failed
dispatcher does the same and raises `DispatcherError`. When every worker failed for good (none
could be bootstrapped, or all were lost) the run ends in NNI's ERROR status and raises
`NoWorkerError`: a script must never mistake a run where no trial could run for success.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nni_agent.compat import wait_for
from nni_manager.config import ExperimentConfig, SecretFormatter, secret_values
from nni_manager.dispatcher import Dispatcher, DispatcherError, check_algorithms, make_dispatcher, optimize_mode
from nni_manager.dispatcher.base import parameter_record
from nni_manager.dispatcher.tuners import ImportedTrial
from nni_manager.metrics import decode_metric_value, metric_number, metric_value
from nni_manager.types import (
    HyperParameters,
    SearchSpace,
    TrialJobApplicationForm,
    TrialJobDetail,
    TrialJobMetric,
    TrialJobStatus,
)

__all__ = ["DispatcherError", "Experiment", "NoWorkerError", "ExperimentResult", "TrialSummary", "decode_metric_value",
           "metric_number", "parameter_record"]

if TYPE_CHECKING:
    from nni_manager.service import TrainingService

log = logging.getLogger(__name__)


class NoWorkerError(RuntimeError):
    """Every worker failed for good (bootstrap failed, machine gone): no trial can run."""


NO_WORKER = "no worker could start"  # the stop_reason of a run that ended with NoWorkerError
_LOG_LEVELS = {"fatal": logging.CRITICAL, "error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
               "debug": logging.DEBUG, "trace": 5}
_CANCEL_WAIT_S = 10.0  # beyond the trial grace period, for cancelled trials to report their end


@dataclass
class TrialSummary:
    """What the experiment knows about one trial (shown by the UI, returned in the result)."""

    trial_id: str
    sequence_id: int
    parameter_id: object  # an int from most tuners; Hyperband's are strings like "0-3_0_1"
    parameters: dict[str, object]
    status: TrialJobStatus = TrialJobStatus.WAITING
    latest: object = None  # the latest intermediate result as reported (number or dict)
    intermediate_count: int = 0
    final: object = None  # the final result as reported
    metric: float | None = None  # the number that ranks trials (final, or its "default")
    gpu_indices: list[int] | None = None
    start_time: int | None = None  # epoch ms
    end_time: int | None = None
    message: str = ""
    hyper_params: str = ""  # the ParameterRecord JSON as the dispatcher sent it (TRIAL_END carries it back)

    def elapsed(self, now_ms: int | None = None) -> float | None:
        """Seconds running so far (or in total once ended)."""
        if self.start_time is None:
            return None
        end = self.end_time or now_ms or int(time.time() * 1000)
        return max(0.0, (end - self.start_time) / 1000)


@dataclass
class ExperimentResult:
    experiment_id: str
    experiment_dir: Path
    optimize_mode: str
    stop_reason: str
    trials: list[TrialSummary] = field(default_factory=list)
    best: TrialSummary | None = None
    error: str = ""  # why the experiment failed (the tuner, or no usable worker), when it did


class Experiment:
    """Run one experiment: `result = await Experiment(config).run()`.

    `on_event(kind, trial)` is called on "submitted", "status", "intermediate" and "final".
    `status` follows NNI's experiment states: INITIALIZED, RUNNING, TUNER_NO_MORE_TRIAL,
    NO_MORE_TRIAL, DONE, STOPPED, ERROR.
    """

    def __init__(self, config: ExperimentConfig, *, experiment_id: str | None = None,
                 on_event: Callable[[str, TrialSummary], None] | None = None,
                 poll_interval: float = 0.5, on_started: Callable[[], None] | None = None) -> None:
        self.config = config
        self._check_config()  # ConfigError before any work
        self.optimize_mode = optimize_mode(config)
        self.dispatcher: Dispatcher | None = None
        self.experiment_id = experiment_id
        self.experiment_dir: Path | None = None
        self.trials: dict[str, TrialSummary] = {}
        self._live: dict[str, TrialSummary] = {}  # the trials not ended: what each wake-up refreshes
        self.stop_reason = ""
        self.status = "INITIALIZED"
        self.error = ""
        self._on_event = on_event
        self._on_started = on_started  # start-up is over: the platform and the dispatcher are up
        self.started = False
        self._poll_interval = poll_interval
        self._queue: deque[str] = deque()  # parameter records waiting for a trial slot
        self._phase_requests: deque[tuple[str, int]] = deque()  # multi-phase: (trial id, parameter index)
        self._next_sequence_id = 0
        self._exhausted = False
        self._early_stopped: set[str] = set()
        self._resumed: set[str] = set()  # trials of an earlier run: the new dispatcher never saw them
        self._started = time.monotonic()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[object]] = set()
        self._ts: TrainingService | None = None

    # -- public -------------------------------------------------------------------------

    async def run(self) -> ExperimentResult:
        from nni_manager.service import create_training_service

        self._started = time.monotonic()
        # a second run() (a DONE experiment reopened): what the last one left is history now
        self._queue.clear()
        self._phase_requests.clear()
        self._exhausted, self.stop_reason, self.error, self.status = False, "", "", "INITIALIZED"
        service = create_training_service(self.config, experiment_id=self.experiment_id)
        self.experiment_id, self.experiment_dir = service.experiment_id, Path(service.experiment_dir)
        # before the service starts: its start-up (a machine that cannot be reached) and clean-up are logged too
        handler = _log_file(self.experiment_dir, self.config.log_level, secret_values(self.config))
        try:
            await self._run(service, self.experiment_dir)
        except (DispatcherError, NoWorkerError, asyncio.CancelledError):
            raise
        except Exception:  # the one-line reason goes to the user; the details stay in the log
            log.exception("the experiment %s", "failed" if self.started else "could not start")
            raise
        finally:
            logging.getLogger("nni_manager").removeHandler(handler)
            handler.close()
        return self.result()

    async def _run(self, service: TrainingService, experiment_dir: Path) -> None:
        async with service as ts:
            self._ts = ts
            ts.add_trial_job_metric_listener(self._on_metric)
            ts.add_trial_job_status_listener(self._on_status)
            ts.add_parameter_request_listener(self._on_parameter_request)
            try:
                history = await self._resume(ts)
                self.dispatcher = await self._make_dispatcher(ts, experiment_dir)
                await self.dispatcher.start(self, self.config.search_space or {}, history)
                self.status, self.started = "RUNNING", True
                if self._on_started is not None:
                    self._on_started()
                self.dispatcher.request_trials(self.config.trial_concurrency)
                await self._loop(ts)
                self.status = "DONE"
            except asyncio.CancelledError:
                self.stop_reason, self.status = "interrupted", "STOPPED"
                await asyncio.shield(self._cancel_all(ts))
                raise
            except (DispatcherError, NoWorkerError) as exc:
                self.error, self.status = str(exc), "ERROR"
                self.stop_reason = "the tuner failed" if isinstance(exc, DispatcherError) else NO_WORKER
                log.error("%s", exc)
                await asyncio.shield(self._cancel_all(ts))
                raise
            finally:
                ts.end_state = self._end_state()
                for task in list(self._tasks):
                    task.cancel()
                if self.dispatcher is not None:
                    await asyncio.shield(self.dispatcher.stop())

    def _check_config(self) -> None:
        check_algorithms(self.config)

    async def _make_dispatcher(self, ts: TrainingService, experiment_dir: Path) -> Dispatcher:
        """Where trials come from: the configured tuner (an Optuna study overrides it, optuna/study.py)."""
        return make_dispatcher(self.config, experiment_dir, resume=bool(self._resumed))

    def result(self) -> ExperimentResult:
        trials = sorted(self.trials.values(), key=lambda t: t.sequence_id)
        best: TrialSummary | None = None
        for trial in trials:  # a NaN or infinite metric is no result: never the best
            if trial.metric is not None and math.isfinite(trial.metric) and (best is None or self._better(trial.metric, best.metric)):
                best = trial
        return ExperimentResult(self.experiment_id or "", self.experiment_dir or Path(),
                                self.optimize_mode, self.stop_reason, trials, best, self.error)

    def _end_state(self) -> tuple[str, str]:
        """NNI's final status and the reason, as `nni-manager list --all` shows them."""
        if self.status == "DONE":
            return "DONE", self.stop_reason or "done"
        if self.status == "ERROR":
            return "ERROR", f"{self.stop_reason}: {self.error}" if self.stop_reason else self.error
        if self.stop_reason == "interrupted":
            return "STOPPED", "stopped by the user (Ctrl-C, SIGTERM, `nni-manager stop` or the WebUI)"
        return "ERROR", "the manager failed (see log/nnimanager.log)"

    def live_count(self) -> int:
        return len(self._live)

    def update_search_space(self, search_space: SearchSpace) -> None:
        """NNI's UPDATE_SEARCH_SPACE: trials requested from now on come from the new space."""
        from nni_manager.search_space import validate

        validate(search_space)
        self.config.search_space = search_space
        if self.dispatcher is not None:
            self.dispatcher.update_search_space(search_space)

    def _better(self, a: float, b: float | None) -> bool:
        return b is None or (a > b if self.optimize_mode == "maximize" else a < b)

    # -- the dispatcher's commands (DispatcherEvents) --------------------------------------

    def new_trial(self, record: str) -> None:
        if self._phase_requests:  # multi-phase: this record was asked for by a running trial
            self._answer(*self._phase_requests.popleft(), record)
            return
        self._queue.append(record)
        self._exhausted = False
        if self.status == "TUNER_NO_MORE_TRIAL":
            self.status = "RUNNING"
        self._wake.set()

    def no_more_trials(self) -> None:
        if self._phase_requests:
            self._answer(*self._phase_requests.popleft(), None)
            return
        self._exhausted = True
        if self.status == "RUNNING":
            self.status = "TUNER_NO_MORE_TRIAL"
        self._wake.set()

    def kill_trial(self, trial_id: str) -> None:
        trial = self.trials.get(trial_id)
        if trial is None or trial.status.is_terminal or trial_id in self._early_stopped or self._ts is None:
            return
        log.info("the assessor / advisor early-stops trial %s", trial_id)
        self._early_stopped.add(trial_id)
        self._spawn(self._ts.cancel_trial_job(trial_id, is_early_stopped=True))

    # -- the loop -----------------------------------------------------------------------

    async def _loop(self, ts: TrainingService) -> None:
        assert self.dispatcher is not None
        while True:
            if self.dispatcher.error is not None:
                raise DispatcherError(self.dispatcher.error)
            # Only the live trials: the status listener already told of every change, and a long
            # experiment's 100,000 ended trials would cost 0.5 s per wake-up to list.
            self._apply_details([await ts.get_trial_job(i) for i in list(self._live)])
            await self._enforce_trial_duration(ts)
            stop, broken = self._stop_reason(ts)
            while not stop and self.live_count() < self.config.trial_concurrency and self._queue:
                await self._submit(ts, self._queue.popleft())
                stop, broken = self._stop_reason(ts)
            if stop and self.live_count() == 0:
                if broken:
                    raise NoWorkerError(stop)
                self.stop_reason = stop
                return
            if stop and self.status in ("RUNNING", "TUNER_NO_MORE_TRIAL") and not self._exhausted:
                self.status = "NO_MORE_TRIAL"
            self._wake.clear()
            try:
                await wait_for(self._wake.wait(), self._poll_interval)
            except asyncio.TimeoutError:
                pass

    def _stop_reason(self, ts: TrainingService) -> tuple[str, bool]:
        """Why no more trials start, and whether that is a failure (no usable worker left)."""
        why = self._why_no_more_trials()
        if why:
            return why, False
        why = _no_usable_machine(ts)
        return why, bool(why)

    def _trial_count(self) -> int:
        """The trials maxTrialNumber counts (an Optuna study leaves out those that ran no Optuna trial)."""
        return len(self.trials)

    def _limit_reached(self) -> str:
        if self.config.max_trial_number is not None and self._trial_count() >= self.config.max_trial_number:
            return f"maxTrialNumber ({self.config.max_trial_number}) reached"
        duration = self.config.max_experiment_duration
        if duration is not None and time.monotonic() - self._started >= duration:
            return f"maxExperimentDuration ({duration:g} s) reached"
        return ""

    def _why_no_more_trials(self) -> str:
        limit = self._limit_reached()
        if limit:
            return limit
        assert self.dispatcher is not None
        # An advisor may answer the last trial end with a new round: let it settle first.
        if (self._exhausted and not self._queue and not self._phase_requests
                and time.monotonic() - self.dispatcher.last_activity >= self.dispatcher.settle_s):
            return "the tuner has no more parameters"
        return ""

    async def _submit(self, ts: TrainingService, record: str) -> None:
        try:
            parsed = json.loads(record)
        except ValueError:
            parsed = {}
        parameters = parsed.get("parameters") if isinstance(parsed, dict) else None
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        form = TrialJobApplicationForm(sequence_id, HyperParameters(record, 0),
                                       placement_constraint=parsed.get("placement_constraint") if isinstance(parsed, dict) else None)
        detail = await ts.submit_trial_job(form)
        trial = TrialSummary(detail.id, sequence_id, parsed.get("parameter_id") if isinstance(parsed, dict) else None,
                             parameters if isinstance(parameters, dict) else {}, hyper_params=record)
        self.trials[detail.id] = self._live[detail.id] = trial
        self._emit("submitted", trial)
        self._apply_details([detail])

    def _apply_details(self, details: list[TrialJobDetail]) -> None:
        for detail in details:
            trial = self.trials.get(detail.id)
            if trial is None:
                continue
            trial.gpu_indices = detail.gpu_indices
            trial.start_time, trial.end_time, trial.message = detail.start_time, detail.end_time, detail.message
            if detail.status != trial.status:
                trial.status = detail.status
                if detail.status.is_terminal:
                    self._live.pop(trial.trial_id, None)
                    self._trial_ended(trial)
                self._emit("status", trial)

    def _trial_ended(self, trial: TrialSummary) -> None:
        """TRIAL_END, then one more trial in its place (NNI requests as many as ended)."""
        if self.dispatcher is None or trial.trial_id in self._resumed:
            return
        self.dispatcher.trial_end(trial.trial_id, trial.status.value, trial.hyper_params)
        if not self._limit_reached():
            self.dispatcher.request_trials(1)

    async def _enforce_trial_duration(self, ts: TrainingService) -> None:
        limit = self.config.max_trial_duration
        if limit is None:
            return
        now_ms = int(time.time() * 1000)
        for trial in list(self._live.values()):
            elapsed = trial.elapsed(now_ms)
            if (trial.status == TrialJobStatus.RUNNING and elapsed is not None and elapsed > limit
                    and trial.trial_id not in self._early_stopped):
                self._early_stopped.add(trial.trial_id)
                await ts.cancel_trial_job(trial.trial_id, is_early_stopped=True)

    async def _cancel_all(self, ts: TrainingService) -> None:
        live = list(self._live)
        for trial_id in live:
            await ts.cancel_trial_job(trial_id)
        deadline = time.monotonic() + self.config.trial_grace_period + _CANCEL_WAIT_S
        while self.live_count() and time.monotonic() < deadline:
            self._apply_details([await ts.get_trial_job(i) for i in list(self._live)])
            await asyncio.sleep(0.05)

    async def _resume(self, ts: TrainingService) -> list[ImportedTrial]:
        """Take over the trials of a resumed experiment: count them; their results, in NNI's
        IMPORT_DATA form ([{"parameter": ..., "value": ...}]), go to the new dispatcher."""
        from nni_manager.store import Store

        details = await ts.list_trial_jobs()
        if not details:
            return []
        finals: dict[str, object] = {}
        store = Store.open_readonly(Path(ts.experiment_dir))
        try:
            for m in store.metrics():
                if m["type"] == "FINAL":
                    finals[m["trial_id"]] = metric_value(m["data"], "resuming the experiment", m["trial_id"])
        finally:
            store.close()
        history: list[ImportedTrial] = []
        for detail in details:
            record = json.loads(detail.form.hyper_parameters.value)
            trial = TrialSummary(detail.id, detail.sequence_id, record.get("parameter_id"), record.get("parameters") or {},
                                 status=detail.status, hyper_params=detail.form.hyper_parameters.value)
            if detail.id in finals:
                trial.final = finals[detail.id]
                trial.metric = metric_number(trial.final)
                if trial.final is not None:
                    history.append({"parameter": trial.parameters, "value": trial.final})
            self.trials[detail.id] = trial
            if not trial.status.is_terminal:
                self._live[detail.id] = trial
            self._resumed.add(detail.id)
            self._next_sequence_id = max(self._next_sequence_id, detail.sequence_id + 1)
        self._apply_details(details)
        return history

    # -- listeners (called on the event loop by the training service) -------------------

    def _on_status(self, detail: TrialJobDetail) -> None:
        self._apply_details([detail])
        self._wake.set()

    def _on_metric(self, metric: TrialJobMetric) -> None:
        trial = self.trials.get(metric.id)
        if trial is None:
            return
        message = metric.message  # decoded once, at ingest
        if message is None:
            try:
                message = json.loads(metric.data)
            except ValueError:
                return
            if not isinstance(message, dict):
                return
        if self.dispatcher is not None and metric.id not in self._resumed:
            self.dispatcher.report_metric(metric.data)  # REPORT_METRIC_DATA, exactly as the trial sent it
        value = decode_metric_value(message.get("value"))
        if message.get("type") == "PERIODICAL":
            trial.latest = value
            trial.intermediate_count += 1
            self._emit("intermediate", trial)
        elif message.get("type") == "FINAL":
            trial.final, trial.metric = value, metric_number(value)
            self._emit("final", trial)
            self._wake.set()

    def _on_parameter_request(self, trial_id: str, index: int) -> None:
        """Multi-phase (`nni.get_next_parameter()` called again): the next record the dispatcher
        sends goes to this trial (NNI 3's dispatcher has no multi-phase mode of its own)."""
        if self.dispatcher is None:
            return
        self._phase_requests.append((trial_id, index))
        self.dispatcher.request_trials(1)

    def _answer(self, trial_id: str, index: int, record: str | None) -> None:
        parsed: dict[str, object] = {}
        if record is not None:
            try:
                parsed = json.loads(record)
            except ValueError:
                pass
        value = parameter_record(parsed.get("parameter_id"), parsed.get("parameters"), index, trial_id)
        if self._ts is not None:  # the service answers its own requests: it exists
            self._spawn(self._ts.update_trial_job(trial_id, TrialJobApplicationForm(-1, HyperParameters(value, index))))

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _emit(self, kind: str, trial: TrialSummary) -> None:
        if self._on_event is not None:
            self._on_event(kind, trial)


def _log_file(experiment_dir: Path, level: str, secrets: set[str] | None = None) -> logging.Handler:
    """The manager's log at NNI's `logLevel`: <experiment>/log/nnimanager.log, with the config's
    `secrets` masked should any message carry one."""
    (experiment_dir / "log").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(experiment_dir / "log" / "nnimanager.log")
    handler.setLevel(_LOG_LEVELS.get(level, logging.INFO))
    handler.setFormatter(SecretFormatter("[%(asctime)s] %(levelname)s (%(name)s) %(message)s", secrets or set()))
    root = logging.getLogger("nni_manager")
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > handler.level:
        root.setLevel(handler.level)
    return handler


def _no_usable_machine(ts: TrainingService) -> str:
    """Why no trial can ever run (every machine failed for good), or "" while some can."""
    return ts.unusable_reason()
