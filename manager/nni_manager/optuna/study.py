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
import dataclasses
import functools
import json
import logging
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import yaml

from nni_manager.types import SearchSpace
from nni_manager.config import ConfigError, ExperimentConfig
from nni_manager.dispatcher.base import Dispatcher, DispatcherEvents, parameter_record
from nni_manager.dispatcher.tuners import ImportedTrial
from nni_manager.experiment import Experiment, TrialSummary
from nni_manager.loader import load_config
from nni_manager.optuna.storage import StorageProxy, open_storage, require_optuna

if TYPE_CHECKING:
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

    from nni_manager.service import TrainingService
    from nni_manager.store import Store

log = logging.getLogger(__name__)


class OptunaRecord(TypedDict):
    """An Optuna trial as the experiment records it (the trial's parameter record's "optuna")."""

    number: int
    state: str
    params: dict[str, object]
    values: list[float] | None

# user attributes of each Optuna trial an NNI trial creates (set with its creation, in one write):
# whose it is, so that a user looking at the study (optuna-dashboard) finds the trial and its logs
ATTR_EXPERIMENT = "nni:experiment_id"
ATTR_TRIAL = "nni:trial_id"
_ROLE_PLATFORMS = ("kubeflow", "frameworkcontroller")  # a command per role: no one trial command to set
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


def trial_python(config: ExperimentConfig) -> str:
    """The Python that runs each trial's runner: the worker's, as any trial's own Python is. On
    `local` the manager's; on Slurm the one that runs the agent in the job (pythonPath, else the
    manager's own on the shared file system, or python3 where a login node drives the cluster);
    elsewhere `python3` from the trial's PATH (on `remote`, pythonPath comes first, as in NNI)."""
    ts = config.training_service
    if ts.platform == "local":
        return sys.executable
    if ts.platform == "slurm":
        python: str | None = getattr(ts.options, "python_path", None)
        return python or ("python3" if getattr(ts.options, "login_node", None) else sys.executable)
    return "python3"


def study_config(source: Path | Mapping[str, Any], spec: StudySpec, python: str | None = None) -> ExperimentConfig:
    """The experiment config: CONFIG.yml (or the same as a mapping, relative paths from the current
    directory) without search space or tuner, with the runner as the trial command (run by
    `python`, else the worker's: trial_python) and maxTrialNumber = n_trials."""
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
    services = data.get("trainingService")
    for ts in services if isinstance(services, list) else [services]:
        platform = ts.get("platform") if isinstance(ts, dict) else None
        if platform in _ROLE_PLATFORMS:
            raise ConfigError("trainingService.platform", f"{platform} runs each role's own `command`, and a study's "
                                                          "trial is one command (the runner of one Optuna trial)",
                              "use `platform: kubernetes` (one pod per trial, on the same cluster)")
    if data.get("maxTrialNumber") not in (None, spec.n_trials):
        raise ConfigError("maxTrialNumber", f"differs from --n-trials {spec.n_trials}",
                          "remove maxTrialNumber: --n-trials counts the study's trials")
    args = ["-m", "nni_agent.study_runner", spec.target, "--study-name", spec.study_name]
    if spec.sampler:
        args += ["--sampler", spec.sampler]
    if spec.pruner:
        args += ["--pruner", spec.pruner]
    data = {**data, "trialCommand": shlex.join(["python3", *args]), "maxTrialNumber": spec.n_trials,
            "experimentName": data.get("experimentName") or f"optuna {spec.study_name}"}
    config = load_config(data, base_dir=base)
    config.trial_command = shlex.join([python or trial_python(config), *args])
    where = spec.target.rpartition(":")[0]
    code = Path(config.trial_code_directory)
    if where.endswith(".py") and not (code / where).is_file():
        raise ConfigError("TARGET", f"{where} is not a file in trialCodeDirectory {code}",
                          "name a file.py inside trialCodeDirectory (or module:function)")
    return config


def create_study(spec: StudySpec) -> BaseStorage:
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

    def __init__(self, storage: BaseStorage, study_name: str, n_trials: int, experiment_id: str, proxy: StorageProxy,
                 on_stop: Callable[[], None] | None = None) -> None:
        super().__init__("optuna", "maximize")
        self.storage, self.study_name, self.n_trials = storage, study_name, n_trials
        self.experiment_id = experiment_id
        self.proxy = proxy
        self.on_stop = on_stop
        self.on_record: Callable[[str, OptunaRecord], None] | None = None  # (trial id, optuna_record) once a trial ended: the experiment keeps it
        self.message_of: Callable[[str], str] = lambda trial_id: ""  # an ended trial's message (why it ended)
        self.uncounted: set[str] = set()  # our trials n_trials does not count: they ran no Optuna trial
        self.counted_before = 0
        self.created: dict[str, list[int]] = {}  # our trial id -> the storage ids of the Optuna trials it created
        self._events: DispatcherEvents | None = None
        self._offered = 0
        self._tasks: set[asyncio.Future[None]] = set()

    async def start(self, events: DispatcherEvents, search_space: SearchSpace,
                    history: list[ImportedTrial]) -> None:
        self._events = events
        self._offered = self.counted_before  # a resumed experiment's trials that count (StudyExperiment._resume)

    def request_trials(self, count: int) -> None:
        assert self._events is not None
        for _ in range(count):
            if self._offered >= self.n_trials:
                self._events.no_more_trials()
                return
            self._events.new_trial(parameter_record(self._offered, {}))
            self._offered += 1

    def trial_end(self, trial_id: str, event: str, hyper_params: str) -> None:
        if not self.created.get(trial_id) and not counts_without_optuna_trial(event, self.message_of(trial_id)):
            self.uncounted.add(trial_id)  # ended before its Optuna trial existed: another takes its place
            self._offered -= 1
            log.info("trial %s ended before creating its Optuna trial: it does not count in n_trials", trial_id)
        task = asyncio.ensure_future(self._ended(trial_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ended(self, trial_id: str) -> None:
        await asyncio.to_thread(self.fail_left_running, trial_id)
        seen = await asyncio.to_thread(self.optuna_trial_of, trial_id)
        if seen is not None and self.on_record is not None:
            self.on_record(trial_id, seen)

    def optuna_trial_of(self, trial_id: str) -> OptunaRecord | None:
        """What the study holds of our trial `trial_id`'s Optuna trial: number, state, params, values."""
        created = self.created.get(trial_id)
        if not created:
            return None
        try:
            frozen = self.storage.get_trial(created[-1])
        except Exception as exc:  # noqa: BLE001 - the storage is gone (the experiment is ending)
            log.debug("Optuna trial of %s: %s", trial_id, exc)
            return None
        return optuna_record(frozen)

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


def counts_without_optuna_trial(status: str, message: str) -> bool:
    """Whether a trial that ended before its runner created an Optuna trial counts in n_trials: only
    when the runner exited by itself (FAILED with its own exit code 1 or 2: no optuna in the worker's
    Python, no storage endpoint, an error before `study.ask()`), which each trial in its place would
    repeat. One killed (a signal, or a shell's 128+N), lost or cancelled before `study.ask()` would
    leave the study a trial short: another trial takes its place."""
    return status == "FAILED" and re.match(r"exit code [12]\b", message) is not None


def optuna_record(frozen: FrozenTrial) -> OptunaRecord:
    """An Optuna trial as the experiment records it (the trial's parameter record's "optuna")."""
    return {"number": frozen.number, "state": frozen.state.name, "params": dict(frozen.params),
            "values": list(frozen.values) if frozen.values is not None else None}


def with_optuna(record: str, seen: OptunaRecord) -> str:
    """The trial's parameter record with the Optuna trial's params as its parameters (what `trials`,
    the WebUI and export show) and the Optuna trial itself under "optuna"."""
    try:
        data = json.loads(record)
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    return json.dumps({**data, "parameters": seen["params"], "optuna": seen})


def keep_optuna_record(ts: TrainingService, experiment: Experiment, trial_id: str, seen: OptunaRecord) -> None:
    """Record on the manager's loop, in the experiment's store and its summary, the Optuna trial
    that NNI trial `trial_id` ran (until now its params were in the study alone)."""
    from nni_manager.types import HyperParameters

    detail = ts.core.trials.by_id.get(trial_id)
    if detail is None:
        return
    hp = detail.form.hyper_parameters
    value = with_optuna(hp.value, seen)
    store = ts.core.trials.store
    with store.transaction():
        store.add_parameter(trial_id, hp.index, value)
        ts.core.trials.change(detail, form=dataclasses.replace(detail.form,
                                                               hyper_parameters=HyperParameters(value, hp.index)))
    summary = experiment.trials.get(trial_id)
    if summary is not None:
        summary.parameters, summary.hyper_params = dict(seen["params"]), value


class _Study:
    """What the hub asks of the study (hub/study.StudyService). Each Optuna trial one of our trials
    creates is made with our ids as user attrs (ATTR_EXPERIMENT, ATTR_TRIAL: Optuna's own template
    trial, so the trial and its tags are one write), and noted (before the runner sees it) as the
    trial's to mark FAIL should the trial end without telling the study, however early it was
    killed; likewise a WAITING trial (`study.enqueue_trial`) its `study.ask()` took."""

    def __init__(self, proxy: StorageProxy, ts: TrainingService, created: dict[str, list[int]]) -> None:
        self._proxy, self._ts, self._created = proxy, ts, created

    def allows(self, agent_id: str, trial_id: str) -> bool:
        trial = self._ts.core.trials.by_id.get(trial_id)
        return (trial is not None and not trial.status.is_terminal
                and self._ts.core.scope.allows(agent_id, trial_id, "a study storage call"))

    async def call(self, trial_id: str, method: str, request: bytes) -> bytes:
        from optuna.storages._grpc.auto_generated import api_pb2

        attrs = {ATTR_EXPERIMENT: self._ts.experiment_id, ATTR_TRIAL: trial_id}
        if method == "CreateNewTrial":
            request = tagged_new_trial(request, attrs)
        answer = await self._proxy.call(method, request)
        if method == "CreateNewTrial":
            self._created.setdefault(trial_id, []).append(api_pb2.CreateNewTrialReply.FromString(answer).trial_id)
        elif method == "SetTrialStateValues":
            asked = api_pb2.SetTrialStateValuesRequest.FromString(request)
            if asked.state == api_pb2.RUNNING and api_pb2.SetTrialStateValuesReply.FromString(answer).trial_updated:
                self._created.setdefault(trial_id, []).append(asked.trial_id)  # a WAITING trial, ours from now
                await asyncio.to_thread(tag_trial, self._proxy.storage, asked.trial_id, attrs)
        return answer


def tagged_new_trial(request: bytes, attrs: dict[str, str]) -> bytes:
    """CreateNewTrial's request for a new RUNNING trial (`study.ask()`: no template) with `attrs`
    as user attrs, as the template trial Optuna's storages create in one write; any other as is."""
    from datetime import datetime

    from optuna.storages._grpc.auto_generated import api_pb2
    from optuna.storages._grpc.servicer import _to_proto_trial
    from optuna.trial import FrozenTrial, TrialState

    asked = api_pb2.CreateNewTrialRequest.FromString(request)
    if not asked.template_trial_is_none:
        return request  # `study.add_trial` and the like: a finished trial, not one this trial runs
    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
                           datetime_complete=None, params={}, distributions={}, user_attrs=dict(attrs),
                           system_attrs={}, intermediate_values={}, trial_id=-1)
    return api_pb2.CreateNewTrialRequest(study_id=asked.study_id, template_trial=_to_proto_trial(template),
                                         template_trial_is_none=False).SerializeToString()


def tag_trial(storage: BaseStorage, storage_id: int, attrs: dict[str, str]) -> None:
    for key, value in attrs.items():
        storage.set_trial_user_attr(storage_id, key, value)


class StudyExperiment(Experiment):
    """An ordinary experiment whose trials are the study's."""

    def __init__(self, config: ExperimentConfig, *, study: StudySpec, storage: BaseStorage,
                 source: str | Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.study = study
        self.storage = storage
        self.source = source  # the CONFIG.yml path (or mapping) `resume` builds the config from again
        self._uncounted: set[str] = set()
        self._resumed_created: dict[str, list[int]] = {}
        super().__init__(config, **kwargs)
        directions = storage.get_study_directions(storage.get_study_id_from_name(study.study_name))
        self.optimize_mode = directions[0].name.lower()  # the summary's best trial: by the first objective

    def _check_config(self) -> None:
        check_spec(self.study)

    def _trial_count(self) -> int:
        return len(self.trials) - len(self._uncounted)

    def _trial_ended(self, trial: TrialSummary) -> None:
        """A trial of the earlier run that ends after a resume (it lived on while the manager was
        away) is the study's as any other: its Optuna trial marked FAIL if left RUNNING, kept as its
        record, and replaced if it ran none (a tuner never saw it; the study did)."""
        if self.dispatcher is not None:
            self._resumed.discard(trial.trial_id)
        super()._trial_ended(trial)

    async def _resume(self, ts: TrainingService) -> list[ImportedTrial]:
        """The earlier runs' trials, and which of them count: those whose Optuna trial is in the
        study (a FAIL left by a stop included, as Optuna counts it), or that ended FAILED by
        themselves (counts_without_optuna_trial); a resumed study runs to n_trials of them."""
        history = await super()._resume(ts)
        if self._resumed:
            ended = {i for i in self._resumed if self.trials[i].status.is_terminal}
            self._resumed_created = await asyncio.to_thread(self._ours_in_study, ended)
            for trial_id in ended & set(self._resumed_created):  # ended while the manager was away: kept now
                seen = await asyncio.to_thread(self._optuna_trial, self._resumed_created[trial_id][-1])
                if "optuna" not in json.loads(self.trials[trial_id].hyper_params or "{}") and seen is not None:
                    keep_optuna_record(ts, self, trial_id, seen)
            for trial_id in ended - set(self._resumed_created):
                t = self.trials[trial_id]
                if not counts_without_optuna_trial(t.status.value, t.message):
                    self._uncounted.add(trial_id)
        return history

    def _optuna_trial(self, storage_id: int) -> OptunaRecord | None:
        try:
            return optuna_record(self.storage.get_trial(storage_id))
        except KeyError:
            return None

    def _ours_in_study(self, ended: set[str]) -> dict[str, list[int]]:
        """{our trial id: the storage ids of its Optuna trials}; those of ended trials still RUNNING
        (the manager was killed before it could tell the study) are marked FAIL now."""
        from optuna.trial import TrialState

        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        ours: dict[str, list[int]] = {}
        for t in self.storage.get_all_trials(study_id, deepcopy=False):
            attrs = {**t.system_attrs, **t.user_attrs}  # (system attrs: where an earlier version kept them)
            if attrs.get(ATTR_EXPERIMENT) != self.experiment_id or not attrs.get(ATTR_TRIAL):
                continue
            ours.setdefault(attrs[ATTR_TRIAL], []).append(t._trial_id)
            if t.state == TrialState.RUNNING and attrs[ATTR_TRIAL] in ended:
                self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                log.info("Optuna trial %d of NNI trial %s was left RUNNING: marked FAIL", t.number, attrs[ATTR_TRIAL])
        return ours

    async def _make_dispatcher(self, ts: TrainingService, experiment_dir: Path) -> Dispatcher:
        save_spec(ts.core.trials.store, self.study, self.source)
        proxy = StorageProxy(self.storage, experiment_dir / "study.sock")
        await proxy.start()
        hub = ts.core.hub
        source = StudySource(self.storage, self.study.study_name, self.study.n_trials, ts.experiment_id, proxy)
        source.created.update(self._resumed_created)
        source.uncounted = self._uncounted
        source.counted_before = self._trial_count()
        source.message_of = lambda trial_id: self.trials[trial_id].message if trial_id in self.trials else ""
        hub.study = _Study(proxy, ts, source.created)

        def forget() -> None:
            hub.study = None

        source.on_stop = forget
        source.on_record = functools.partial(keep_optuna_record, ts, self)
        return source


SPEC_SETTING = "optuna_study"  # the experiment store's setting: what `nni-manager resume` runs again


def save_spec(store: Store, spec: StudySpec, source: str | Mapping[str, Any] | None) -> None:
    """Keep the study's command line in the experiment's store for `resume`: the storage URL only
    when it holds no password (else `resume` reads it from NNI_MANAGER_STUDY_STORAGE again)."""
    from urllib.parse import urlsplit

    try:
        secret = urlsplit(spec.storage_url).password is not None
    except ValueError:
        secret = True
    kept = {"target": spec.target, "study_name": spec.study_name, "n_trials": spec.n_trials,
            "directions": spec.directions, "sampler": spec.sampler, "pruner": spec.pruner,
            "storage": "" if secret else spec.storage_url,
            "config": dict(source) if isinstance(source, Mapping) else source}
    with store.transaction():
        store.set_setting(SPEC_SETTING, json.dumps(kept))


def saved_spec(store: Store) -> dict[str, Any] | None:
    """What save_spec kept, or None for an experiment that ran no study."""
    value = store.setting(SPEC_SETTING)
    return json.loads(value) if value else None
