"""A Python experiment API shaped like NNI's (`nni.experiment.Experiment`), so an NNI experiment
script moves over by changing one import:

    from nni_manager import Experiment          # was: from nni.experiment import Experiment
    experiment = Experiment(config)             # NNI's ExperimentConfig, a dict, a YAML path or ours
    experiment.run()                            # blocks until done; True unless the tuner failed
    print(experiment.export_data())

The experiment runs on an asyncio loop in a background thread (NNI runs its manager as a child
process); `start()` returns once it runs, `stop()` cancels live trials and cleans up.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nni_manager.config import ConfigError, ExperimentConfig
from nni_manager.loader import load_config
from nni_manager.experiment import Experiment as _Loop
from nni_manager.experiment import ExperimentResult

__all__ = ["Experiment", "TrialJob", "TrialResult"]

_ENDED = ("DONE", "STOPPED", "ERROR")


@dataclass
class TrialResult:
    """NNI's `nni.experiment.TrialResult`: one trial's parameters and final metric."""

    parameter: dict[str, Any]
    value: Any
    trialJobId: str  # noqa: N815 - NNI's field name


@dataclass
class TrialJob:
    """What NNI's REST API lists per trial (`list_trial_jobs()`), with NNI's field names."""

    trialJobId: str  # noqa: N815
    status: str
    sequenceId: int  # noqa: N815
    hyperParameters: list[str]  # noqa: N815 - ParameterRecord JSON strings
    startTime: int | None = None  # noqa: N815 - epoch ms
    endTime: int | None = None  # noqa: N815
    message: str = ""
    finalMetricData: Any = None  # noqa: N815 - the final result as reported


class Experiment:
    """`Experiment(config)`: NNI's `run()` / `start()` / `stop()` / `get_status()` /
    `list_trial_jobs()` / `export_data()` / `update_search_space()`. Also `Experiment("local")`
    with NNI installed, then `experiment.config.<field> = ...` as in NNI's examples."""

    def __init__(self, config: Any, *, experiment_id: str | None = None) -> None:
        if isinstance(config, str) and not Path(config).expanduser().exists() and "." not in config:
            try:  # NNI's `Experiment('local')`: an empty config of NNI's API to fill in
                from nni.experiment import ExperimentConfig as NniConfig
            except ImportError:
                raise ConfigError("(config)", f"{config!r} is neither a config file nor, without the `nni` "
                                  "package, a platform to build a config for",
                                  "pass a YAML path, a dict, or `pip install nni` to use NNI's ExperimentConfig") from None
            config = NniConfig(config)
        self.config = config
        self.id = experiment_id
        self._loop_obj: _Loop | None = None
        self._thread: threading.Thread | None = None
        self._aio: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[ExperimentResult] | None = None
        self._error: BaseException | None = None
        self._result: ExperimentResult | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, port: int | None = None, debug: bool = False) -> None:
        """Start the experiment in the background; returns once it runs (or raises what stopped it).
        `port` is accepted for NNI's signature; no web server is started here."""
        if self._thread is not None:
            raise RuntimeError("the experiment is already started")
        config = self.config if isinstance(self.config, ExperimentConfig) else load_config(self.config)
        if debug:
            config.debug, config.log_level = True, "debug"
        self._loop_obj = _Loop(config, experiment_id=self.id)  # ConfigError here, in the caller's thread
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name="nni-manager-experiment",
                                        daemon=True)
        self._thread.start()
        while not started.wait(0.05):
            if not self._thread.is_alive():
                break
        while self._loop_obj.status == "INITIALIZED" and self._thread.is_alive():
            time.sleep(0.05)
        if self._error is not None and not isinstance(self._error, asyncio.CancelledError):
            raise self._error
        self.id = self._loop_obj.experiment_id

    def _main(self, started: threading.Event) -> None:
        self._aio = asyncio.new_event_loop()
        try:
            assert self._loop_obj is not None
            self._task = self._aio.create_task(self._loop_obj.run())
            started.set()
            self._result = self._aio.run_until_complete(self._task)
        except BaseException as exc:  # noqa: BLE001 - reported by start() / run() / get_status()
            self._error = exc
        finally:
            started.set()
            self._aio.close()

    def run(self, port: int | None = None, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """NNI's `run()`: start, wait until the experiment is done, stop. True when it ended
        normally, False when it ended in ERROR (the tuner failed, or no worker could start); None with wait_completion=False (then it keeps running)."""
        self.start(port, debug)
        if not wait_completion:
            return None
        try:
            while self.get_status() not in _ENDED:
                time.sleep(0.2)
            return self.get_status() != "ERROR"
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop: cancel live trials (USER_CANCELED), stop the dispatcher and the agents."""
        if self._thread is None:
            return
        if self._aio is not None and self._task is not None and not self._task.done():
            self._aio.call_soon_threadsafe(self._task.cancel)
        self._thread.join()

    # -- queries --------------------------------------------------------------------------

    def get_status(self) -> str:
        """NNI's experiment status: INITIALIZED, RUNNING, TUNER_NO_MORE_TRIAL, NO_MORE_TRIAL,
        DONE, STOPPED or ERROR."""
        if self._loop_obj is None:
            return "INITIALIZED"
        if self._thread is not None and not self._thread.is_alive():
            if self._loop_obj.status not in _ENDED:
                return "ERROR" if self._error is not None and not isinstance(self._error, asyncio.CancelledError) \
                    else "STOPPED"
        return self._loop_obj.status

    @property
    def error(self) -> str:
        """Why the experiment failed (the tuner's error, or why no worker is usable), or ""."""
        if self._loop_obj is not None and self._loop_obj.error:
            return self._loop_obj.error
        return "" if self._error is None or isinstance(self._error, asyncio.CancelledError) else repr(self._error)

    @property
    def experiment_dir(self) -> Path | None:
        return self._loop_obj.experiment_dir if self._loop_obj else None

    def list_trial_jobs(self) -> list[TrialJob]:
        if self._loop_obj is None:
            return []
        trials = sorted(list(self._loop_obj.trials.values()), key=lambda t: t.sequence_id)
        return [TrialJob(t.trial_id, t.status.value, t.sequence_id, [t.hyper_params], t.start_time, t.end_time,
                         t.message, t.final) for t in trials]

    def export_data(self) -> list[TrialResult]:
        """Every trial with a final result: parameters, value and id (NNI's `export_data()`)."""
        if self._loop_obj is None:
            return []
        trials = sorted(list(self._loop_obj.trials.values()), key=lambda t: t.sequence_id)
        return [TrialResult(t.parameters, t.final, t.trial_id) for t in trials if t.final is not None]

    def get_job_statistics(self) -> list[dict[str, Any]]:
        counts: dict[str, int] = {}
        for job in self.list_trial_jobs():
            counts[job.status] = counts.get(job.status, 0) + 1
        return [{"trialJobStatus": status, "trialJobNumber": n} for status, n in counts.items()]

    def update_search_space(self, search_space: dict[str, Any]) -> None:
        if self._loop_obj is None or self._aio is None:
            raise RuntimeError("start the experiment first")
        done = threading.Event()
        failure: list[BaseException] = []

        def apply() -> None:
            try:
                assert self._loop_obj is not None
                self._loop_obj.update_search_space(json.loads(json.dumps(search_space)))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(exc)
            done.set()

        self._aio.call_soon_threadsafe(apply)
        done.wait()
        if failure:
            raise failure[0]

    def result(self) -> ExperimentResult | None:
        """Our summary (best trial, stop reason) once the experiment ended."""
        return self._result
