"""An Optuna study run as an experiment: `nni-manager optuna TARGET --study-name ... --storage ...`.

The study's trials take the tuner's place: `StudySource` is the experiment's dispatcher and
offers one NNI trial per Optuna trial, `n_trials` of them (maxTrialNumber), each running
`python -m nni_agent.study_runner TARGET` (one `study.ask()` ... `study.tell()` in the trial's
process, where the sampler and the pruner run). The study's storage is opened here and served
to the trials through their agents only (storage.py, hub/study.py, nni_agent.study_storage).
An Optuna trial whose NNI trial ended without telling the study (a killed worker, a cancelled
trial) is marked FAIL when that trial ends, and any left RUNNING when the experiment ends: the
study never keeps a RUNNING trial of ours.
"""
from __future__ import annotations

import asyncio
import logging
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from nni_manager.types import SearchSpace
from nni_manager.config import ConfigError, ExperimentConfig
from nni_manager.dispatcher.base import Dispatcher, DispatcherEvents, parameter_record
from nni_manager.experiment import Experiment
from nni_manager.loader import load_config
from nni_manager.optuna.storage import StorageProxy, open_storage, require_optuna

if TYPE_CHECKING:
    from nni_manager.service import TrainingService

log = logging.getLogger(__name__)

_NOT_IN_CONFIG = ("searchSpace", "searchSpaceFile", "tuner", "assessor", "advisor", "trialCommand")


@dataclass
class StudySpec:
    """The command line's study: which, where, and how its trials are run."""

    target: str
    study_name: str
    storage_url: str
    n_trials: int
    directions: list[str] = field(default_factory=list)
    sampler: str | None = None
    pruner: str | None = None


def check_spec(spec: StudySpec) -> None:
    """One-line errors for what the command line got wrong (before anything starts)."""
    optuna = require_optuna()
    where, sep, name = spec.target.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError("TARGET", f"{spec.target!r} is not file.py:function or module:function",
                          "name the objective, e.g. objective.py:objective")
    if spec.n_trials < 1:
        raise ConfigError("--n-trials", f"{spec.n_trials} is not a positive number", "pass --n-trials 1 or more")
    for d in spec.directions:
        if d not in ("maximize", "minimize"):
            raise ConfigError("--direction", f"{d!r} is neither maximize nor minimize", "pass maximize or minimize")
    for kind, value in (("sampler", spec.sampler), ("pruner", spec.pruner)):
        module = getattr(optuna, kind + "s")
        names = sorted(n for n in dir(module) if n.endswith(kind.capitalize()) and not n.startswith("Base"))
        if value is not None and value not in names:
            raise ConfigError(f"--{kind}", f"{value!r} is not one of Optuna's {kind}s",
                              f"pass one of {', '.join(names)}")


def study_config(source: Path | Mapping[str, Any], spec: StudySpec, python: str = sys.executable) -> ExperimentConfig:
    """The experiment config: CONFIG.yml (or the same as a mapping, relative paths from the current
    directory) without search space or tuner, with the runner as the trial command and
    maxTrialNumber = n_trials."""
    if isinstance(source, Mapping):
        data: Any = dict(source)
        name, base = "the config", Path.cwd()
    else:
        name, base = source.name, source.expanduser().resolve().parent
        try:
            data = yaml.safe_load(source.read_text())
        except OSError as exc:
            raise ConfigError("(file)", f"cannot read {source}: {exc.strerror}", "pass an existing YAML file") from None
        except yaml.YAMLError as exc:
            raise ConfigError("(file)", f"{source} is not YAML: {' '.join(str(exc).split())}",
                              "fix the YAML") from None
    if not isinstance(data, dict):
        raise ConfigError("(root)", f"{name} is not a mapping", "write an NNI v2 experiment config")
    for key in _NOT_IN_CONFIG:
        if key in data:
            raise ConfigError(key, "is given by `nni-manager optuna` (the study samples; the runner is the trial "
                                   "command)", f"remove `{key}` from {name}")
    if data.get("maxTrialNumber") not in (None, spec.n_trials):
        raise ConfigError("maxTrialNumber", f"differs from --n-trials {spec.n_trials}",
                          "remove maxTrialNumber: --n-trials counts the study's trials")
    command = [python, "-m", "nni_agent.study_runner", spec.target, "--study-name", spec.study_name]
    if spec.sampler:
        command += ["--sampler", spec.sampler]
    if spec.pruner:
        command += ["--pruner", spec.pruner]
    data = {**data, "trialCommand": shlex.join(command), "maxTrialNumber": spec.n_trials,
            "experimentName": data.get("experimentName") or f"optuna {spec.study_name}"}
    config = load_config(data, base_dir=base)
    where = spec.target.rpartition(":")[0]
    code = Path(config.trial_code_directory)
    if where.endswith(".py") and not (code / where).is_file():
        raise ConfigError("TARGET", f"{where} is not a file in trialCodeDirectory {code}",
                          "name a file.py inside trialCodeDirectory (or module:function)")
    return config


def create_study(spec: StudySpec) -> Any:
    """Open the storage and create the study if it is new (`load_if_exists`); the storage."""
    optuna = require_optuna()
    storage = open_storage(spec.storage_url)
    try:
        optuna.create_study(storage=storage, study_name=spec.study_name, load_if_exists=True,
                            directions=spec.directions or None)
    except ValueError as exc:  # e.g. directions that differ from an existing study's
        raise ConfigError("--direction", str(exc), "match the existing study's directions") from None
    return storage


class StudySource(Dispatcher):
    """The study in the tuner's place: a trial per request, until `n_trials` were offered."""

    def __init__(self, storage: Any, study_name: str, n_trials: int, experiment_id: str, proxy: StorageProxy,
                 on_stop: Any = None) -> None:
        super().__init__("optuna", "maximize")
        self.storage, self.study_name, self.n_trials = storage, study_name, n_trials
        self.experiment_id = experiment_id
        self.proxy = proxy
        self.on_stop = on_stop
        self.created: dict[str, list[int]] = {}  # our trial id -> the storage ids of the Optuna trials it created
        self._events: DispatcherEvents | None = None
        self._offered = 0
        self._tasks: set[asyncio.Future[None]] = set()

    async def start(self, events: DispatcherEvents, search_space: SearchSpace,
                    history: list[dict[str, Any]]) -> None:
        self._events = events
        self._offered = len(history)

    def request_trials(self, count: int) -> None:
        assert self._events is not None
        for _ in range(count):
            if self._offered >= self.n_trials:
                self._events.no_more_trials()
                return
            self._events.new_trial(parameter_record(self._offered, {}))
            self._offered += 1

    def trial_end(self, trial_id: str, event: str, hyper_params: str) -> None:
        task = asyncio.ensure_future(asyncio.to_thread(self.fail_left_running, trial_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def update_search_space(self, search_space: SearchSpace) -> None:
        log.warning("an Optuna study has no search space to update: its objective defines it")

    async def stop(self) -> None:
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        try:
            await asyncio.to_thread(self.fail_left_running, None)
        finally:
            if self.on_stop is not None:
                self.on_stop()
            await self.proxy.stop()

    def fail_left_running(self, trial_id: str | None) -> None:
        """Mark FAIL the Optuna trials our trial `trial_id` (or any of ours) created that are still RUNNING."""
        from optuna.trial import TrialState

        ids = [(t, i) for t, created in list(self.created.items()) if trial_id in (None, t) for i in created]
        for owner, storage_id in ids:
            try:
                if self.storage.get_trial(storage_id).state != TrialState.RUNNING:
                    continue
                self.storage.set_trial_state_values(storage_id, TrialState.FAIL)
                log.info("Optuna trial %d of NNI trial %s was left RUNNING: marked FAIL",
                         self.storage.get_trial_number_from_id(storage_id), owner)
            except Exception as exc:  # noqa: BLE001 - told meanwhile (UpdateFinishedTrialError)
                log.debug("Optuna trial %d: %s", storage_id, exc)


class _Study:
    """What the hub asks of the study (hub/study.StudyService). It notes which Optuna trials each
    of our trials created (CreateNewTrial's answer, before the runner sees it): those are the ones
    to mark FAIL should the trial end without telling the study, however early it was killed."""

    def __init__(self, proxy: StorageProxy, ts: TrainingService, created: dict[str, list[int]]) -> None:
        self._proxy, self._ts, self._created = proxy, ts, created

    def allows(self, agent_id: str, trial_id: str) -> bool:
        trial = self._ts.core.trials.by_id.get(trial_id)
        return (trial is not None and not trial.status.is_terminal
                and self._ts.core.scope.allows(agent_id, trial_id, "a study storage call"))

    async def call(self, trial_id: str, method: str, request: bytes) -> bytes:
        answer = await self._proxy.call(method, request)
        if method == "CreateNewTrial":
            from optuna.storages._grpc.auto_generated import api_pb2

            self._created.setdefault(trial_id, []).append(api_pb2.CreateNewTrialReply.FromString(answer).trial_id)
        return answer


class StudyExperiment(Experiment):
    """An ordinary experiment whose trials are the study's."""

    def __init__(self, config: ExperimentConfig, *, study: StudySpec, storage: Any, **kwargs: Any) -> None:
        self.study = study
        self.storage = storage
        super().__init__(config, **kwargs)
        directions = storage.get_study_directions(storage.get_study_id_from_name(study.study_name))
        self.optimize_mode = directions[0].name.lower()  # the summary's best trial: by the first objective

    def _check_config(self) -> None:
        check_spec(self.study)

    async def _make_dispatcher(self, ts: TrainingService, experiment_dir: Path) -> Dispatcher:
        proxy = StorageProxy(self.storage, experiment_dir / "study.sock")
        await proxy.start()
        hub = ts.core.hub
        source = StudySource(self.storage, self.study.study_name, self.study.n_trials, ts.experiment_id, proxy)
        hub.study = _Study(proxy, ts, source.created)

        def forget() -> None:
            hub.study = None

        source.on_stop = forget
        return source
