"""`nni-manager export --nni-db`: our store as NNI 3.0's experiment directory, for NNI's own tools.

Writes `<out>/<id>/db/nni.sqlite` with NNI 3.0's three tables (`ts/nni_manager/core/sqlDatabase.ts`,
schema and row formats in shared/reference/nni-webui-rest.md §5.2), plus what `nnictl view` needs
around it: `log/` (NNI's launcher opens `log/nnictl_stdout.log` there), each trial's log files
where NNI's local training service looks for them (`environments/local-env/trials/<trial>/`), and
an entry in `~/nni-experiments/.experiment` (`nnictl view` refuses an id it has no entry for, even
with `--experiment_dir`).

Rows are what NNI's manager would have written for the same trials:

* `ExperimentProfile`: one row, `params` the canonical v2 config (as our `/experiment` serves it),
  with `experimentWorkingDirectory` = `<out>` (where `nnictl view` then looks) and the platform
  `local`: NNI's view mode builds the training service object from it and knows no `slurm` or
  `kubernetes`, and a `remote` config would need its machine list;
* `TrialJobEvent`: per trial WAITING (submit time, the parameter record in `data`), RUNNING (start
  time), its terminal status (end time, the trial's message), ADD_HYPERPARAMETER for further
  parameter records; all rows interleaved in time order as NNI appends them;
* `MetricData`: every metric but REQUEST_PARAMETER, `data` = JSON.stringify(value string),
  `parameterId` as text, PERIODICAL sequences numbered 0..n-1 per trial in arrival order (as our
  REST API serves them, so NNI's WebUI finds no holes).
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nni_manager.jsontypes import JSONValue
from nni_manager.metrics import numbered
from nni_manager.store import DB_NAME, ExperimentRow, Store
from nni_manager.types import TrialJobDetail, TrialJobStatus
from nni_manager.webui import manifest
from nni_manager.webui.views import NniParams, dumps, hyper_parameter, metric_record, nni_params, trial_log_file

# NNI 3.0's createTables (core/sqlDatabase.ts), statement for statement
TABLES = """
create table TrialJobEvent (
    timestamp integer,
    trialJobId text,
    event text,
    data text,
    logPath text,
    sequenceId integer,
    message text,
    environmentId text);
create table MetricData (timestamp integer, trialJobId text, parameterId text, type text, sequence integer, data text);
create table ExperimentProfile (
    params text,
    id text,
    execDuration integer,
    startTime integer,
    endTime integer,
    logDir text,
    nextSequenceId integer,
    revision integer);
"""
INDEXES = """
create index TrialJobEvent_trialJobId on TrialJobEvent(trialJobId);
create index TrialJobEvent_event on TrialJobEvent(event);
create index MetricData_trialJobId on MetricData(trialJobId);
create index MetricData_type on MetricData(type);
create index ExperimentProfile_id on ExperimentProfile(id);
"""
# NNI's TrialJobEvent row: (timestamp, trialJobId, event, data, logPath, sequenceId, message, envId)
_EventRow = tuple[int, str, str, "str | None", str, int, "str | None", str]
ENV_ID = "local-env"  # NNI 3.0's local training service: `${trainingServiceId}-env`
# the WebUI's log buttons ask for these; NNI's local service reads trial.log / trial.stdout / trial.stderr
_LOG_FILES = {"trial.log": ("trial.log", "trial.stdout"), "trial.stdout": ("trial.stdout",),
              "trial.stderr": ("trial.stderr",)}
_MANAGER_LOGS = ("nnimanager.log", "dispatcher.log")


@dataclass
class Exported:
    experiment_id: str
    directory: Path  # <out>/<id>
    working_directory: Path  # <out>
    trials: int = 0
    metrics: int = 0
    events: int = 0
    registered: bool = False
    notes: list[str] = field(default_factory=list)
    kept: Path | None = None  # the previous db, moved aside: it held trials our store lacks

    @property
    def db(self) -> Path:
        return self.directory / "db" / "nni.sqlite"


def export_nni_db(experiment_dir: Path, out: Path | None = None, register: bool = True,
                  manifest_file: Path | None = None) -> Exported:
    """Write NNI's experiment directory for the experiment stored in `experiment_dir` under
    `out` (NNI's experimentWorkingDirectory; default: the directory `experiment_dir` is in)."""
    experiment_dir = Path(experiment_dir).expanduser().resolve()
    if not (experiment_dir / DB_NAME).is_file():
        raise FileNotFoundError(f"{experiment_dir} holds no experiment ({DB_NAME} missing)")
    source = sqlite3.connect(f"file:{experiment_dir / DB_NAME}?mode=ro", uri=True, isolation_level=None)
    try:
        source.execute("BEGIN")  # one consistent snapshot, also of a running experiment
        store = Store(source)
        stored = store.experiment()
        if not stored:
            raise FileNotFoundError(f"{experiment_dir} holds no experiment record")
        experiment_id = str(stored["id"])
        work = (Path(out).expanduser() if out is not None else experiment_dir.parent).resolve()
        target = work / experiment_id
        result = Exported(experiment_id, target, work)
        in_place = target == experiment_dir
        trials = store.trials()
        parameters: dict[str, dict[int, str]] = {}
        for _, trial_id, idx, value in store.parameters_since(0):
            parameters.setdefault(trial_id, {})[idx] = value
        for name in ("db", "log"):
            (target / name).mkdir(parents=True, exist_ok=True)
        params = _params(stored["config"] or {}, work, target, result.notes)
        start = int(stored["start_time"])
        ends = [t.end_time or t.start_time or t.submit_time for t in trials]
        end = max([start, *ends])  # the store keeps no end time: its last trial's end
        profile = (dumps(params), experiment_id, max(0, (end - start) // 1000), start, end,
                   str(target), max((t.sequence_id for t in trials), default=-1) + 1, 1)
        events = _events(trials, parameters, target)
        tmp = target / "db" / f"nni.sqlite.tmp.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.executescript(TABLES)
            db.execute("BEGIN")
            db.executemany("insert into TrialJobEvent values (?,?,?,?,?,?,?,?)", events)
            counter = [0]
            db.executemany("insert into MetricData values (?,?,?,?,?,?)", _metrics(store, counter))
            db.execute("insert into ExperimentProfile values (?,?,?,?,?,?,?,?)", profile)
            db.execute("COMMIT")
            db.executescript(INDEXES)
        finally:
            db.close()
        result.kept = _keep_foreign(result.db, {t.id for t in trials})
        if result.kept is not None:
            result.notes.append(f"{result.db} held trials this experiment's store does not have (NNI's own "
                                f"manager ran them: `nnictl resume`); kept as {result.kept}")
        os.replace(tmp, result.db)
        result.trials, result.events, result.metrics = len(trials), len(events), counter[0]
    finally:
        source.close()
    platform = str(((stored["config"] or {}).get("training_service") or {}).get("platform") or "local")
    for t in trials:
        _trial_files(experiment_dir, t, target, in_place, platform)
    if not in_place:
        for name in _MANAGER_LOGS:
            src = experiment_dir / "log" / name
            if src.is_file():
                shutil.copyfile(src, target / "log" / name)
    if register:
        result.registered = _register(result, stored, start, end, manifest_file)
    return result


def _keep_foreign(db: Path, ours: set[str]) -> Path | None:
    """`nnictl resume ID` runs NNI's own manager on the db we wrote, and the trials it runs are
    recorded only there: such a db is moved aside (its name returned), never replaced."""
    if not db.is_file():
        return None
    try:
        source = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            theirs = {str(row[0]) for row in source.execute("select distinct trialJobId from TrialJobEvent")}
        finally:
            source.close()
    except sqlite3.Error:
        return None  # not a db NNI's manager could have run on
    if theirs <= ours:
        return None
    kept = db.with_name(f"{db.name}.nnictl-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(db, kept)
    return kept


def _params(config: Mapping[str, object], work: Path, target: Path, notes: list[str]) -> NniParams:
    params = nni_params(config)
    params["experimentWorkingDirectory"] = str(work)
    service = params["trainingService"]
    platform = service.get("platform")
    if platform != "local":
        notes.append(f"platform {platform!r} written as 'local': NNI's view mode builds its training service "
                     "from the config, and has no such platform (or needs its machine list)")
        service["platform"] = "local"
        service.pop("gpuIndices", None)
        service.pop("useActiveGpu", None)
    code = params.get("trialCodeDirectory") or ""
    if not code or not Path(code).is_dir():
        notes.append(f"trialCodeDirectory {code!r} is not a directory here (NNI validates it): written as "
                     f"{target}")
        params["trialCodeDirectory"] = service["trialCodeDirectory"] = str(target)
    return params


def _events(trials: list[TrialJobDetail], parameters: dict[str, dict[int, str]],
            target: Path) -> list[_EventRow]:
    """TrialJobEvent rows, in time order across trials (NNI appends them as they happen; a trial's
    rows keep their order, and trials first appear in submission order)."""
    keyed: list[tuple[int, int, int, _EventRow]] = []
    for order, t in enumerate(trials):
        log_path = str(target / "environments" / ENV_ID / "trials" / t.id)
        records = parameters.get(t.id) or {t.form.hyper_parameters.index: t.form.hyper_parameters.value}
        indexed = sorted(records.items())
        rows: list[tuple[int, str, str | None]] = [(t.submit_time, "WAITING", hyper_parameter(indexed[0][1],
                                                                                                indexed[0][0]))]
        if t.start_time is not None and t.status != TrialJobStatus.WAITING:
            rows.append((t.start_time, "RUNNING", None))
        for index, value in indexed[1:]:
            rows.append((rows[-1][0], "ADD_HYPERPARAMETER", hyper_parameter(value, index)))
        if t.status.is_terminal:
            rows.append((t.end_time or rows[-1][0], t.status.value, None))
        elif t.status not in (TrialJobStatus.WAITING, TrialJobStatus.RUNNING):
            rows.append((rows[-1][0], t.status.value, None))
        for stage, (stamp, event, data) in enumerate(rows):
            message = (t.message or None) if stage == len(rows) - 1 else None
            keyed.append((stamp, order, stage, (stamp, t.id, event, data, log_path, t.sequence_id, message, ENV_ID)))
    keyed.sort(key=lambda k: k[:3])
    return [k[3] for k in keyed]


def _metrics(store: Store, counter: list[int]) -> Iterator[tuple[int, str, str, str, int, str]]:
    for trial_id, _, message, timestamp, sequence in numbered(store.metric_rows(), "the NNI export"):
        r = metric_record(trial_id, message, timestamp, sequence)
        counter[0] += 1
        yield r["timestamp"], r["trialJobId"], r["parameterId"], r["type"], r["sequence"], r["data"]


def _trial_files(experiment_dir: Path, t: TrialJobDetail, target: Path, in_place: bool, platform: str) -> None:
    """The trial's logs where NNI's local training service reads them: relative links in place
    (the directory stays movable), copies elsewhere."""
    dest = target / "environments" / ENV_ID / "trials" / t.id
    for name, candidates in _LOG_FILES.items():
        src = next((p for p in (trial_log_file(experiment_dir, t, c, platform) for c in candidates) if p), None)
        if src is None:
            continue
        dest.mkdir(parents=True, exist_ok=True)
        link = dest / name
        if link.is_symlink() or link.exists():
            link.unlink()
        if in_place:
            link.symlink_to(os.path.relpath(src, dest))
        else:
            shutil.copyfile(src, link)


def _register(result: Exported, stored: ExperimentRow, start: int, end: int,
              path: Path | None) -> bool:
    """A STOPPED entry pointing at `<out>`, as NNI leaves a stopped experiment; an entry whose
    manager still runs is left alone."""
    name = ((stored.get("config") or {}).get("experiment_name")) or ""
    done = [False]

    def change(d: manifest.Manifest) -> None:
        entry = d.get(result.experiment_id)
        if isinstance(entry, dict) and entry.get("status") != "STOPPED" and isinstance(pid := entry.get("pid"), int) \
                and manifest.alive(pid):
            return
        new: dict[str, JSONValue] = {"id": result.experiment_id, "startTime": start, "endTime": end,
               "status": "STOPPED", "platform": "local", "experimentName": name, "tag": [], "pid": None,
               "webuiUrl": [], "logDir": str(result.working_directory), "prefixUrl": None}
        if isinstance(entry, dict):
            entry.pop("port", None)
            entry.update({k: new[k] for k in ("status", "logDir", "platform")})
            entry.setdefault("tag", [])
        else:
            d[result.experiment_id] = new
        done[0] = True

    manifest.update(change, path)
    if not done[0]:
        result.notes.append(f"{result.experiment_id} is still served by a running manager: "
                            f"{path or manifest.manifest_path()} left as it is")
    return done[0]
