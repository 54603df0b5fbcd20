"""The experiment loop: NNI's NNIManager duties over a TrainingService.

It asks the tuner for parameters, keeps `trialConcurrency` trials alive, stops at
maxTrialNumber / maxExperimentDuration / an exhausted tuner, feeds final metrics back to
the tuner, answers multi-phase parameter requests, and early-stops trials that pass
maxTrialDuration. Like NNI, when maxExperimentDuration runs out no new trial starts and
running ones finish. Cancelling `run()` (Ctrl-C) cancels every live trial USER_CANCELED
before the training service cleans up.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nni_manager.config import ExperimentConfig
from nni_manager.tuners import Tuner, make_tuner
from nni_manager.types import (
    HyperParameters,
    TrialJobApplicationForm,
    TrialJobDetail,
    TrialJobMetric,
    TrialJobStatus,
)

_CANCEL_WAIT_S = 10.0  # beyond the trial grace period, for cancelled trials to report their end


@dataclass
class TrialSummary:
    """What the experiment knows about one trial (shown by the UI, returned in the result)."""

    trial_id: str
    sequence_id: int
    parameter_id: int
    parameters: dict[str, Any]
    status: TrialJobStatus = TrialJobStatus.WAITING
    latest: Any = None  # the latest intermediate result as reported (number or dict)
    intermediate_count: int = 0
    final: Any = None  # the final result as reported
    metric: float | None = None  # the number that ranks trials (final, or its "default")
    gpu_indices: list[int] | None = None
    start_time: int | None = None  # epoch ms
    end_time: int | None = None
    message: str = ""

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


def metric_number(value: Any) -> float | None:
    """NNI's metric rule: a number, or a dict whose "default" is a number."""
    if isinstance(value, dict):
        value = value.get("default")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def parameter_record(parameter_id: int, parameters: dict[str, Any] | None, index: int = 0,
                     trial_id: str | None = None) -> str:
    """A ParameterRecord JSON (nni-training-service.md §1.3), NNI's separators."""
    record: dict[str, Any] = {"parameter_id": parameter_id, "parameter_source": "algorithm",
                              "parameters": parameters, "parameter_index": index}
    if trial_id is not None:
        record["trial_job_id"] = trial_id
    return json.dumps(record)


class Experiment:
    """Run one experiment: `result = await Experiment(config).run()`.

    `on_event(kind, trial)` is called on "submitted", "status", "intermediate" and "final".
    """

    def __init__(self, config: ExperimentConfig, *, experiment_id: str | None = None,
                 on_event: Callable[[str, TrialSummary], None] | None = None,
                 poll_interval: float = 0.5) -> None:
        self.config = config
        self.tuner: Tuner = make_tuner(config.tuner, config.search_space)  # ConfigError before any work
        self.experiment_id = experiment_id
        self.experiment_dir: Path | None = None
        self.trials: dict[str, TrialSummary] = {}
        self.stop_reason = ""
        self._on_event = on_event
        self._poll_interval = poll_interval
        self._params: dict[int, dict[str, Any]] = {}  # parameter_id -> parameters
        self._next_parameter_id = 0
        self._next_sequence_id = 0
        self._exhausted = False
        self._early_stopped: set[str] = set()
        self._started = time.monotonic()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ts: Any = None

    # -- public -------------------------------------------------------------------------

    async def run(self) -> ExperimentResult:
        from nni_manager.service import create_training_service

        self._started = time.monotonic()
        async with create_training_service(self.config, experiment_id=self.experiment_id) as ts:
            self._ts = ts
            self.experiment_id, self.experiment_dir = ts.experiment_id, Path(ts.experiment_dir)
            ts.add_trial_job_metric_listener(self._on_metric)
            ts.add_trial_job_status_listener(self._on_status)
            ts.add_parameter_request_listener(self._on_parameter_request)
            try:
                await self._resume(ts)
                await self._loop(ts)
            except asyncio.CancelledError:
                self.stop_reason = "interrupted"
                await asyncio.shield(self._cancel_all(ts))
                raise
            finally:
                for task in list(self._tasks):
                    task.cancel()
        return self.result()

    def result(self) -> ExperimentResult:
        trials = sorted(self.trials.values(), key=lambda t: t.sequence_id)
        best: TrialSummary | None = None
        for trial in trials:  # a NaN or infinite metric is no result: never the best
            if trial.metric is not None and math.isfinite(trial.metric) and (
                    best is None or self.tuner.better(trial.metric, best.metric)):
                best = trial
        return ExperimentResult(self.experiment_id or "", self.experiment_dir or Path(),
                                self.tuner.optimize_mode, self.stop_reason, trials, best)

    def live_count(self) -> int:
        return sum(1 for t in self.trials.values() if not t.status.is_terminal)

    # -- the loop -----------------------------------------------------------------------

    async def _loop(self, ts: Any) -> None:
        while True:
            self._apply_details(await ts.list_trial_jobs())
            await self._enforce_trial_duration(ts)
            stop = self._why_no_more_trials() or _no_usable_machine(ts)
            while not stop and self.live_count() < self.config.trial_concurrency:
                await self._submit(ts)
                stop = self._why_no_more_trials() or _no_usable_machine(ts)
            if stop and self.live_count() == 0:
                self.stop_reason = stop
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._poll_interval)
            except asyncio.TimeoutError:
                pass

    def _why_no_more_trials(self) -> str:
        if self.config.max_trial_number is not None and len(self.trials) >= self.config.max_trial_number:
            return f"maxTrialNumber ({self.config.max_trial_number}) reached"
        duration = self.config.max_experiment_duration
        if duration is not None and time.monotonic() - self._started >= duration:
            return f"maxExperimentDuration ({duration:g} s) reached"
        if self._exhausted:
            return "the tuner has no more parameters"
        return ""

    async def _submit(self, ts: Any) -> None:
        parameter_id = self._next_parameter_id
        params = self.tuner.generate_parameters(parameter_id)
        if params is None:
            self._exhausted = True
            return
        self._next_parameter_id += 1
        self._params[parameter_id] = params
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        form = TrialJobApplicationForm(sequence_id, HyperParameters(parameter_record(parameter_id, params), 0))
        detail = await ts.submit_trial_job(form)
        trial = TrialSummary(detail.id, sequence_id, parameter_id, params)
        self.trials[detail.id] = trial
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
                    self.tuner.trial_end(trial.parameter_id, detail.status == TrialJobStatus.SUCCEEDED)
                self._emit("status", trial)

    async def _enforce_trial_duration(self, ts: Any) -> None:
        limit = self.config.max_trial_duration
        if limit is None:
            return
        now_ms = int(time.time() * 1000)
        for trial in list(self.trials.values()):
            elapsed = trial.elapsed(now_ms)
            if (trial.status == TrialJobStatus.RUNNING and elapsed is not None and elapsed > limit
                    and trial.trial_id not in self._early_stopped):
                self._early_stopped.add(trial.trial_id)
                await ts.cancel_trial_job(trial.trial_id, is_early_stopped=True)

    async def _cancel_all(self, ts: Any) -> None:
        live = [t.trial_id for t in self.trials.values() if not t.status.is_terminal]
        for trial_id in live:
            await ts.cancel_trial_job(trial_id)
        deadline = time.monotonic() + self.config.trial_grace_period + _CANCEL_WAIT_S
        while self.live_count() and time.monotonic() < deadline:
            self._apply_details(await ts.list_trial_jobs())
            await asyncio.sleep(0.05)

    async def _resume(self, ts: Any) -> None:
        """Take over the trials of a resumed experiment: count them, tell the tuner."""
        from nni_manager.store import Store

        details = await ts.list_trial_jobs()
        if not details:
            return
        finals: dict[str, Any] = {}
        store = Store.open_readonly(Path(ts.experiment_dir))
        try:
            for m in store.metrics():
                if m["type"] == "FINAL":
                    finals[m["trial_id"]] = _metric_value(m["data"])
        finally:
            store.close()
        history = []
        for detail in details:
            record = json.loads(detail.form.hyper_parameters.value)
            parameter_id = int(record.get("parameter_id") or 0)
            trial = TrialSummary(detail.id, detail.sequence_id, parameter_id, record.get("parameters") or {},
                                 status=detail.status)
            if detail.id in finals:
                trial.final = finals[detail.id]
                trial.metric = metric_number(trial.final)
            self.trials[detail.id] = trial
            self._params[parameter_id] = trial.parameters
            history.append({"parameter": trial.parameters, "value": trial.metric})
            self._next_parameter_id = max(self._next_parameter_id, parameter_id + 1)
            self._next_sequence_id = max(self._next_sequence_id, detail.sequence_id + 1)
        self.tuner.import_data(history)
        self._apply_details(details)

    # -- listeners (called on the event loop by the training service) -------------------

    def _on_status(self, detail: TrialJobDetail) -> None:
        self._apply_details([detail])
        self._wake.set()

    def _on_metric(self, metric: TrialJobMetric) -> None:
        trial = self.trials.get(metric.id)
        try:
            message = json.loads(metric.data)
        except ValueError:
            return
        if trial is None or not isinstance(message, dict):
            return
        value = _decode(message.get("value"))
        if message.get("type") == "PERIODICAL":
            trial.latest = value
            trial.intermediate_count += 1
            self._emit("intermediate", trial)
        elif message.get("type") == "FINAL":
            trial.final, trial.metric = value, metric_number(value)
            parameter_id = message.get("parameter_id")
            parameter_id = trial.parameter_id if parameter_id is None else int(parameter_id)
            if trial.metric is not None:
                self.tuner.receive_trial_result(parameter_id, self._params.get(parameter_id, trial.parameters),
                                                trial.metric)
            self._emit("final", trial)
            self._wake.set()

    def _on_parameter_request(self, trial_id: str, index: int) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(trial_id, index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, trial_id: str, index: int) -> None:
        """Multi-phase: a new tuner point for the trial (parameters null once exhausted)."""
        parameter_id = self._next_parameter_id
        params = None if self._exhausted else self.tuner.generate_parameters(parameter_id)
        if params is not None:
            self._next_parameter_id += 1
            self._params[parameter_id] = params
        value = parameter_record(parameter_id, params, index, trial_id)
        await self._ts.update_trial_job(trial_id, TrialJobApplicationForm(-1, HyperParameters(value, index)))

    def _emit(self, kind: str, trial: TrialSummary) -> None:
        if self._on_event is not None:
            self._on_event(kind, trial)


def _no_usable_machine(ts: Any) -> str:
    """Why no trial can ever run (every machine failed for good), or "" while some can."""
    agents = ts.agents()
    if agents and all(a["failed"] for a in agents):
        return "no machine is usable: " + "; ".join(f"{a['name']}: {a['failed']}" for a in agents)
    return ""


def _metric_value(data: str) -> Any:
    """The value of a stored NNI metric message (its JSON), decoded."""
    try:
        message = json.loads(data)
    except ValueError:
        return None
    return _decode(message.get("value")) if isinstance(message, dict) else None


def _decode(value: Any) -> Any:
    """Metric values travel JSON-encoded inside the metric JSON (NNI >= 1.4)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
