"""The dispatcher contract: how the experiment loop talks to a tuner / assessor / advisor.

It is NNI's tuner command channel in Python terms, so the loop is the same whether the
algorithm runs in NNI's own dispatcher process (`nni_process.py`) or is one of the built-in
tuners (`BuiltinDispatcher`, used when `nni` is not installed). Requests go down as method
calls (initialize, request trials, report metric, trial end, update search space,
terminate); answers come back through `DispatcherEvents` callbacks on the event loop
(new trial, no more trials, kill trial), in the order the algorithm sent them.
"""
from __future__ import annotations

import json
import time
from typing import Protocol

from nni_manager.types import SearchSpace
from nni_manager.dispatcher.tuners import ImportedTrial, Tuner
from nni_manager.metrics import checked, decode_metric_value, metric_number


class DispatcherError(RuntimeError):
    """The tuner / assessor / advisor failed (its process crashed, or it reported an error)."""


class DispatcherEvents(Protocol):
    def new_trial(self, record: str) -> None:
        """NEW_TRIAL_JOB: a ParameterRecord JSON string, stored verbatim as the trial's parameters."""

    def no_more_trials(self) -> None:
        """NO_MORE_TRIAL_JOBS: nothing to offer now (an advisor may offer more after a trial ends)."""

    def kill_trial(self, trial_id: str) -> None:
        """KILL_TRIAL_JOB: an assessor's or advisor's verdict; the trial is early-stopped."""


class Dispatcher:
    """Base class; subclasses implement the commands. `last_activity` (monotonic seconds) is
    when a command last went either way: the loop lets a dispatcher that said "no more
    trials" settle for `settle_s` after it, because an advisor (Hyperband, BOHB) may still
    answer a trial end with the next round's trials."""

    settle_s = 0.0

    def __init__(self, name: str, optimize_mode: str) -> None:
        self.name = name
        self.optimize_mode = optimize_mode
        self.last_activity = time.monotonic()
        self.error: str | None = None  # set once the algorithm failed for good

    async def start(self, events: DispatcherEvents, search_space: SearchSpace,
                    history: list[ImportedTrial]) -> None:
        """INITIALIZE with the search space (and IMPORT_DATA `history` of a resumed experiment)."""
        raise NotImplementedError

    def request_trials(self, count: int) -> None:
        raise NotImplementedError

    def report_metric(self, metric_json: str) -> None:
        """REPORT_METRIC_DATA: NNI's metric message exactly as the trial sent it."""

    def trial_end(self, trial_id: str, event: str, hyper_params: str) -> None:
        """TRIAL_END with the terminal status name and the trial's ParameterRecord string."""

    def update_search_space(self, search_space: SearchSpace) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """TERMINATE, and make sure nothing of the dispatcher is left running."""

    def better(self, a: float, b: float | None) -> bool:
        """Whether metric `a` beats `b` under the algorithm's optimize_mode."""
        return b is None or (a > b if self.optimize_mode != "minimize" else a < b)

    def touch(self) -> None:
        self.last_activity = time.monotonic()


def parameter_record(parameter_id: object, parameters: object, index: int = 0, trial_id: str | None = None) -> str:
    """A ParameterRecord JSON (nni-training-service.md §1.3)."""
    record: dict[str, object] = {"parameter_id": parameter_id, "parameter_source": "algorithm",
                              "parameters": parameters, "parameter_index": index}
    if trial_id is not None:
        record["trial_job_id"] = trial_id
    return json.dumps(record)


class BuiltinDispatcher(Dispatcher):
    """A built-in tuner (Random, GridSearch) behind the dispatcher contract, in process."""

    def __init__(self, tuner: Tuner, name: str) -> None:
        super().__init__(name, tuner.optimize_mode)
        self.tuner = tuner
        self._events: DispatcherEvents | None = None
        self._next_parameter_id = 0
        self._params: dict[int, dict[str, object]] = {}

    async def start(self, events: DispatcherEvents, search_space: SearchSpace,
                    history: list[ImportedTrial]) -> None:
        self._events = events
        if history:
            self.tuner.import_data(history)

    def skip_parameter_ids(self, next_id: int) -> None:
        """A resumed experiment: new parameter ids continue after the old ones."""
        self._next_parameter_id = max(self._next_parameter_id, next_id)

    def request_trials(self, count: int) -> None:
        assert self._events is not None
        for _ in range(count):
            parameter_id = self._next_parameter_id
            params = self.tuner.generate_parameters(parameter_id)
            if params is None:
                self._events.no_more_trials()
                return
            self._next_parameter_id += 1
            self._params[parameter_id] = params
            self._events.new_trial(parameter_record(parameter_id, params))

    def report_metric(self, metric_json: str) -> None:
        message, _ = checked(metric_json)
        if message is None or message.get("type") != "FINAL":
            return
        value = metric_number(decode_metric_value(message.get("value")))
        parameter_id = message.get("parameter_id")
        if value is not None and parameter_id is not None and parameter_id in self._params:
            self.tuner.receive_trial_result(parameter_id, self._params[parameter_id], value)

    def trial_end(self, trial_id: str, event: str, hyper_params: str) -> None:
        try:
            parameter_id = json.loads(hyper_params).get("parameter_id")
        except (ValueError, AttributeError):
            return
        self.tuner.trial_end(parameter_id, event == "SUCCEEDED")

    def update_search_space(self, search_space: SearchSpace) -> None:
        self.tuner.update_search_space(search_space)
