"""The experiment behind the API: a running one (`LiveExperiment`) or a stored one (`StoredExperiment`).

The API asks them for the experiment's status and profile and passes on the writes the WebUI,
`nnictl` and `Experiment` offer; a stored experiment refuses writes with NNI's own words.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from nni_manager.config import ConfigError, parse_duration
from nni_manager.types import TrialJobDetail
from nni_manager.webui import limits
from nni_manager.webui.views import nni_params

if TYPE_CHECKING:
    from nni_manager.config import ExperimentConfig
    from nni_manager.experiment import Experiment
    from nni_manager.service import TrainingService
    from nni_manager.store import ExperimentRow

READONLY = "Error: can not update experiment profile in readonly mode!"


def _bound(field: str, value: float, limit: float, unit: str = "") -> None:
    why = limits.over_limit(field, value, limit, unit)
    if why is not None:
        raise WebError(why, 400)


class WebError(Exception):
    """Answered as NNI answers errors: `{"error": message}` with this HTTP status."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


def _now_ms() -> int:
    return int(time.time() * 1000)


class ExperimentSide:
    """What every side has: identity, config, status, times; writes refused by default."""

    readonly = True
    platform = "local"

    def __init__(self, experiment_id: str, experiment_dir: Path, start_time: int) -> None:
        self.experiment_id = experiment_id
        self.experiment_dir = experiment_dir
        self.start_time = start_time
        self.end_time: int | None = None
        self.revision = 1

    def config(self) -> ExperimentConfig | Mapping[str, object]:
        raise NotImplementedError

    def trials(self) -> Iterable[TrialJobDetail] | None:
        """The running manager's trials, or None to read them from the store."""
        return None

    def status(self) -> tuple[str, list[str]]:
        raise NotImplementedError

    def profile(self, next_sequence_id: int) -> dict[str, object]:
        end = self.end_time
        profile: dict[str, object] = {
            "params": nni_params(self.config()),
            "id": self.experiment_id,
            "execDuration": max(0, ((end or _now_ms()) - self.start_time) // 1000),
            "logDir": str(self.experiment_dir),
            "startTime": self.start_time,
        }
        if end is not None:
            profile["endTime"] = end
        profile["nextSequenceId"] = next_sequence_id
        profile["revision"] = self.revision
        return profile

    async def cancel_trial(self, trial_id: str) -> None:
        raise WebError(READONLY)

    async def update(self, update_type: str, params: Mapping[str, object]) -> None:
        raise WebError(READONLY)

    def stop(self) -> None:
        """DELETE /experiment: end the process serving it (after the response is sent)."""
        raise NotImplementedError


class StoredExperiment(ExperimentSide):
    """A finished (or copied) experiment directory, served read-only: status VIEWED, as
    `nnictl view` serves one."""

    def __init__(self, experiment_dir: Path, stored: ExperimentRow, end_time: int | None,
                 on_stop: Callable[[], None]) -> None:
        super().__init__(stored["id"], experiment_dir, int(stored["start_time"]))
        self._config = stored["config"]
        self.platform = str((self._config.get("training_service") or {}).get("platform") or "local")
        self.end_time = end_time or self.start_time
        self._on_stop = on_stop

    def config(self) -> Mapping[str, object]:
        return self._config

    def status(self) -> tuple[str, list[str]]:
        return "VIEWED", []

    def stop(self) -> None:
        self._on_stop()


class LiveExperiment(ExperimentSide):
    """The experiment `nni-manager run` is running (nni_manager.experiment.Experiment).

    `phase` is set by the runner: INITIALIZED, RUNNING, then DONE, ERROR or STOPPING; while
    RUNNING, NO_MORE_TRIAL / TUNER_NO_MORE_TRIAL are derived as NNI derives them (nothing more
    will be submitted, trials still run).
    """

    readonly = False

    def __init__(self, experiment: Experiment, experiment_id: str, experiment_dir: Path,
                 on_stop: Callable[[], None]) -> None:
        super().__init__(experiment_id, experiment_dir, _now_ms())
        self.experiment = experiment
        self.platform = experiment.config.training_service.platform
        self.phase = "INITIALIZED"
        self.errors: list[str] = []
        self._on_stop = on_stop
        self.on_reopen: Callable[[], None] | None = None  # run a DONE experiment on (set by the runner)

    def config(self) -> ExperimentConfig:
        return self.experiment.config

    def _ts(self) -> TrainingService | None:
        return getattr(self.experiment, "_ts", None)

    def trials(self) -> Iterable[TrialJobDetail]:
        ts = self._ts()
        if ts is None or getattr(ts, "_core", None) is None:
            return ()
        return ts.trials.by_id.values()

    def finish(self, phase: str, error: str | None = None) -> None:
        self.phase = phase
        if error:
            self.errors = [error]
        if self.end_time is None:
            self.end_time = _now_ms()

    def status(self) -> tuple[str, list[str]]:
        own = getattr(self.experiment, "status", None)  # the experiment loop's NNI state, where it keeps one
        if self.phase == "RUNNING" and isinstance(own, str) and own != "INITIALIZED":
            error = getattr(self.experiment, "error", "")
            return own, [error] if error else []
        if self.phase != "RUNNING":
            return self.phase, list(self.errors)
        if own == "INITIALIZED":  # the training service is still starting (machines being bootstrapped)
            return "INITIALIZED", []
        why = getattr(self.experiment, "_why_no_more_trials", lambda: "")()
        if why:
            return ("TUNER_NO_MORE_TRIAL" if why.startswith("the tuner") else "NO_MORE_TRIAL"), []
        return "RUNNING", []

    async def cancel_trial(self, trial_id: str) -> None:
        ts = self._ts()
        if ts is None:
            raise WebError(f"no trial {trial_id}: the experiment has not started", 404)
        try:
            await ts.cancel_trial_job(trial_id)
        except KeyError as exc:
            raise WebError(str(exc.args[0]) if exc.args else f"no trial {trial_id}", 404) from None

    async def update(self, update_type: str, params: Mapping[str, object]) -> None:
        limit = update_type in ("MAX_TRIAL_NUM", "MAX_EXEC_DURATION")
        if self.phase not in ("RUNNING", "INITIALIZED") and not (self.phase == "DONE" and limit):
            raise WebError(f"Error: the experiment is {self.phase}; it can no longer be updated")
        config = self.experiment.config
        try:
            if update_type == "TRIAL_CONCURRENCY":
                value = params.get("trialConcurrency")
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise WebError(f"Error: trialConcurrency must be a positive integer, got {value!r}")
                _bound("trialConcurrency", value, limits.MAX_TRIAL_CONCURRENCY)
                more = value - config.trial_concurrency
                ts = self._ts()
                if ts is not None:  # the backend resizes what it sized by it (Slurm's relay, hybrid parts)
                    await ts.set_trial_concurrency(value)
                else:
                    config.trial_concurrency = value
                dispatcher = getattr(self.experiment, "dispatcher", None)
                if more > 0 and dispatcher is not None and hasattr(dispatcher, "request_trials"):
                    dispatcher.request_trials(more)  # as NNI's manager asks its tuner for the extra trials
            elif update_type == "MAX_TRIAL_NUM":
                value = params.get("maxTrialNumber", params.get("maxTrialNum"))
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise WebError(f"Error: maxTrialNumber must be a positive integer, got {value!r}")
                _bound("maxTrialNumber", value, limits.MAX_TRIAL_NUMBER)
                config.max_trial_number = value
            elif update_type == "MAX_EXEC_DURATION":
                value = params.get("maxExperimentDuration", params.get("maxExecDuration"))
                seconds = parse_duration(value, "maxExperimentDuration")
                _bound("maxExperimentDuration", seconds, limits.MAX_EXPERIMENT_DURATION_S, " s")
                config.max_experiment_duration = seconds
            elif update_type == "SEARCH_SPACE":
                update_space = getattr(self.experiment, "update_search_space", None)
                space = params.get("searchSpace")
                if update_space is None:
                    raise WebError("Error: updating the search space is not supported by this experiment")
                if not isinstance(space, dict):
                    raise WebError(f"Error: searchSpace must be a mapping, got {type(space).__name__}")
                _bound("searchSpace parameters", len(space), limits.MAX_SEARCH_SPACE_PARAMETERS)
                try:
                    update_space(space)
                except (ValueError, TypeError) as exc:
                    raise WebError(f"Error: {exc}") from None
            else:
                raise WebError(f"Error: unknown update_type {update_type!r}")
        except ConfigError as exc:
            raise WebError(f"Error: {exc}") from None
        self.revision += 1
        if limit and getattr(self.experiment, "status", "") == "DONE":  # also before the runner saw it end
            self._maybe_reopen()
        wake = getattr(self.experiment, "_wake", None)
        if wake is not None:
            wake.set()

    def _maybe_reopen(self) -> None:
        """NNI 3.0 runs a DONE experiment on when its maxTrialNumber or maxExperimentDuration is
        raised past what ended it (nnimanager.ts: DONE -> RUNNING, endTime deleted)."""
        ended_by = str(getattr(self.experiment, "stop_reason", ""))
        still = getattr(self.experiment, "_limit_reached", lambda: "x")()
        if self.on_reopen is None or still or not ended_by.startswith(("maxTrialNumber", "maxExperimentDuration")):
            return
        self.phase, self.end_time, self.errors = "RUNNING", None, []
        self.experiment.status = "RUNNING"  # at once, as NNI answers: not the DONE of the run that ended
        self.on_reopen()

    def stop(self) -> None:
        self._on_stop()
