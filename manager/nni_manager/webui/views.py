"""Our records -> NNI 3.0's REST payloads (shapes in shared/reference/nni-webui-rest.md §3).

Clients parse these strictly: NNI's Python `TrialJob` rejects unknown keys inside a
hyper-parameter record and needs `parameter_index`; the WebUI decodes metric `data` twice and
needs every trial's `hyperParameters[0]` and `startTime`. JSON is written as Node's
`JSON.stringify` writes it: compact, non-ASCII kept.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from nni_manager.jsontypes import JSONValue
from nni_manager.local_files import trial_log_path
from nni_manager.types import TrialJobDetail, TrialJobStatus

if TYPE_CHECKING:
    from nni_manager.config import ExperimentConfig

# What NNI's TrialHyperParameters accepts (nni/experiment/data.py); anything else raises there.
_RECORD_KEYS = ("parameter_id", "parameter_source", "parameters", "parameter_index", "placement_constraint",
                "version_info")
METRIC_KEYS = ("timestamp", "trialJobId", "parameterId", "type", "sequence", "data")


class MetricRecord(TypedDict):
    """NNI's MetricDataRecord (`/metric-data`); `data` is the value JSON-encoded twice."""

    timestamp: int
    trialJobId: str  # noqa: N815 - NNI's REST keys
    parameterId: str  # noqa: N815
    type: str
    sequence: int
    data: str


class _TrialJobKeys(TypedDict):
    trialJobId: str  # noqa: N815
    status: str
    hyperParameters: list[str]  # noqa: N815
    startTime: int  # noqa: N815
    logPath: str  # noqa: N815
    sequenceId: int  # noqa: N815


class TrialJobInfo(_TrialJobKeys, total=False):
    """NNI 3.0's TrialJobInfo (`/trial-jobs`): the keys after the required ones come with the state."""

    endTime: int  # noqa: N815
    message: str
    finalMetricData: list[MetricRecord]  # noqa: N815
    stderrPath: str  # noqa: N815


class ExportEntry(TypedDict):
    """One `/export-data` entry."""

    parameter: JSONValue
    value: JSONValue
    trialJobId: str  # noqa: N815


class NniTrainingService(TypedDict, total=False):
    """`params.trainingService` of NNI's canonical config (values as the config holds them)."""

    platform: object
    trialCommand: object  # noqa: N815
    trialCodeDirectory: str  # noqa: N815
    debug: bool
    maxTrialNumberPerGpu: object  # noqa: N815
    useActiveGpu: object  # noqa: N815
    gpuIndices: object  # noqa: N815
    reuseMode: bool  # noqa: N815


class NniParams(TypedDict, total=False):
    """`/experiment`'s `params`: the canonical camelCase v2 config NNI's WebUI reads."""

    experimentName: object  # noqa: N815
    experimentType: str  # noqa: N815
    searchSpace: object  # noqa: N815
    trialCommand: object  # noqa: N815
    trialCodeDirectory: str  # noqa: N815
    trialConcurrency: object  # noqa: N815
    trialGpuNumber: object  # noqa: N815
    maxExperimentDuration: str | None  # noqa: N815
    maxTrialNumber: object  # noqa: N815
    maxTrialDuration: str | None  # noqa: N815
    useAnnotation: bool  # noqa: N815
    debug: bool
    logLevel: str  # noqa: N815
    experimentWorkingDirectory: str  # noqa: N815
    tuner: dict[str, object]
    assessor: dict[str, object]
    advisor: dict[str, object]
    trainingService: NniTrainingService  # noqa: N815


class JobStatistic(TypedDict):
    """One `/job-statistics` entry."""

    trialJobStatus: str  # noqa: N815
    trialJobNumber: int  # noqa: N815


_quote = json.encoder.encode_basestring  # a str as JSON with ensure_ascii=False (C)


def dumps(obj: object) -> str:
    """Node's JSON.stringify: no spaces, UTF-8 as is."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@functools.lru_cache(maxsize=65536)
def hyper_parameter(value: str, index: int) -> str:
    """One `hyperParameters` string: the record we sent, re-serialised compactly, only the
    keys NNI's client accepts, `parameter_index` added where missing. Cached: the WebUI asks for
    every trial every 10 s and records never change."""
    try:
        record = json.loads(value)
    except ValueError:
        return dumps({"parameter_id": None, "parameter_source": "algorithm", "parameters": value,
                      "parameter_index": index})
    if not isinstance(record, dict):
        return dumps({"parameter_id": None, "parameter_source": "algorithm", "parameters": record,
                      "parameter_index": index})
    out = {k: record[k] for k in _RECORD_KEYS if k in record}
    out.setdefault("parameter_source", "algorithm")
    out.setdefault("parameter_index", index)
    return dumps(out)


def metric_record(trial_id: str, message: Mapping[str, object], timestamp: int, sequence: int) -> MetricRecord:
    """A MetricDataRecord from one stored NNI metric message. `data` is the value string
    JSON-encoded once more (NNI stores `JSON.stringify(value)`), NaN kept as written."""
    value = message.get("value")
    if not isinstance(value, str):
        value = json.dumps(value)
    parameter_id = message.get("parameter_id")
    return MetricRecord(
        timestamp=timestamp,
        trialJobId=trial_id,
        parameterId="0" if parameter_id is None else str(parameter_id),
        type=str(message.get("type", "CUSTOM")),
        sequence=sequence,
        data=json.dumps(value, ensure_ascii=False),
    )


def metric_record_json(trial_id: str, message: Mapping[str, object], timestamp: int, sequence: int) -> str:
    """`dumps(metric_record(...))`, written directly: 3x faster, for `/metric-data` of a million rows."""
    value = message.get("value")
    if type(value) is not str:
        value = json.dumps(value)
    parameter_id = message.get("parameter_id")
    kind = message.get("type", "CUSTOM")
    if type(timestamp) is not int or type(sequence) is not int or type(trial_id) is not str:
        return dumps(metric_record(trial_id, message, timestamp, sequence))
    return (f'{{"timestamp":{timestamp},"trialJobId":{_quote(trial_id)},'
            f'"parameterId":{_quote("0" if parameter_id is None else str(parameter_id))},'
            f'"type":{_quote(kind if type(kind) is str else str(kind))},"sequence":{sequence},'
            f'"data":{_quote(_quote(value))}}}')


def trial_job(t: TrialJobDetail, parameters: dict[int, str], final: MetricRecord | None,
              log_path: str) -> TrialJobInfo:
    """A TrialJobInfo with NNI 3.0's keys and nothing else (no `envId`: nni 2.x's TrialJob has
    no **kwargs)."""
    if not parameters:
        parameters = {t.form.hyper_parameters.index: t.form.hyper_parameters.value}
    job = TrialJobInfo(
        trialJobId=t.id,
        status=t.status.value,
        hyperParameters=[hyper_parameter(v, i) for i, v in sorted(parameters.items())],
        startTime=t.start_time or t.submit_time,
        logPath=log_path,
        sequenceId=t.sequence_id,
    )
    if t.end_time is not None and t.status.is_terminal:
        job["endTime"] = t.end_time
    if t.message:
        job["message"] = t.message
    if t.status == TrialJobStatus.SUCCEEDED and final is not None:
        job["finalMetricData"] = [final]
    if t.status == TrialJobStatus.FAILED:
        job["stderrPath"] = log_path + "/stderr"
    return job


def _value(v: object) -> str:
    return _quote(v) if type(v) is str else str(v) if type(v) is int else dumps(v)


def trial_job_json(t: TrialJobDetail, parameters: dict[int, str], final_json: str | None, log_path: str) -> str:
    """`dumps(trial_job(...))` written directly, `final_json` being the final's record as JSON:
    the trial table of 10,000 trials is the first thing a WebUI asks for."""
    if not parameters:
        parameters = {t.form.hyper_parameters.index: t.form.hyper_parameters.value}
    status = t.status
    out = ['{"trialJobId":', _value(t.id), ',"status":', _value(status.value), ',"hyperParameters":[',
           ",".join([_quote(hyper_parameter(v, i)) for i, v in sorted(parameters.items())]),
           '],"startTime":', _value(t.start_time or t.submit_time), ',"logPath":', _value(log_path),
           ',"sequenceId":', _value(t.sequence_id)]
    if t.end_time is not None and status.is_terminal:
        out += [',"endTime":', _value(t.end_time)]
    if t.message:
        out += [',"message":', _value(t.message)]
    if status == TrialJobStatus.SUCCEEDED and final_json is not None:
        out += [',"finalMetricData":[', final_json, "]"]
    if status == TrialJobStatus.FAILED:
        out += [',"stderrPath":', _value(log_path + "/stderr")]
    out.append("}")
    return "".join(out)


def export_entry(t: TrialJobDetail, parameters: dict[int, str], final: MetricRecord) -> ExportEntry | None:
    """`/export-data`: the parameters of the final's parameter id, `value` decoded once."""
    records = []
    for _index, value in sorted(parameters.items()) or [(0, t.form.hyper_parameters.value)]:
        try:
            record = json.loads(value)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    if not records:
        return None
    chosen = next((r for r in records if str(r.get("parameter_id")) == final["parameterId"]), records[0])
    return ExportEntry(parameter=chosen.get("parameters"), value=json.loads(final["data"]), trialJobId=t.id)


def job_statistics(trials: Iterable[TrialJobDetail]) -> list[JobStatistic]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status.value] = counts.get(t.status.value, 0) + 1
    return [JobStatistic(trialJobStatus=s, trialJobNumber=n) for s, n in counts.items()]


def _get(obj: object, key: str, default: object = None) -> object:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _duration(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"a duration in seconds, not {value!r}")
    seconds = float(value)
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds}s"


def _algorithm(section: object) -> dict[str, object] | None:
    if section is None:
        return None
    out: dict[str, object] = {}
    for ours, theirs in (("name", "name"), ("class_name", "className"), ("code_directory", "codeDirectory")):
        value = _get(section, ours)
        if value is not None:
            out[theirs] = str(value) if ours == "code_directory" else value
    class_args = _get(section, "class_args") or {}
    out["classArgs"] = dict(class_args) if isinstance(class_args, Mapping) else class_args
    return out


def nni_params(config: ExperimentConfig | Mapping[str, object]) -> NniParams:
    """The canonical camelCase v2 config NNI's WebUI reads (`/experiment`'s `params`), from our
    ExperimentConfig or its stored dict. Only fields NNI knows (so `nnictl view` validates it);
    backend options (machine lists, credentials) are left out."""
    ts = _get(config, "training_service") or {}
    platform = _get(ts, "platform", "local")
    command = _get(config, "trial_command") or ""
    code_dir = str(_get(config, "trial_code_directory") or "")
    params = NniParams()
    if _get(config, "experiment_name"):
        params["experimentName"] = _get(config, "experiment_name")
    params["experimentType"] = "hpo"
    params["searchSpace"] = _get(config, "search_space") or {}
    params["trialCommand"] = command
    params["trialCodeDirectory"] = code_dir
    params["trialConcurrency"] = _get(config, "trial_concurrency", 1)
    if _get(config, "trial_gpu_number") is not None:
        params["trialGpuNumber"] = _get(config, "trial_gpu_number")
    if _get(config, "max_experiment_duration") is not None:
        params["maxExperimentDuration"] = _duration(_get(config, "max_experiment_duration"))
    if _get(config, "max_trial_number") is not None:
        params["maxTrialNumber"] = _get(config, "max_trial_number")
    if _get(config, "max_trial_duration") is not None:
        params["maxTrialDuration"] = _duration(_get(config, "max_trial_duration"))
    params["useAnnotation"] = False
    params["debug"] = bool(_get(config, "debug", False))
    params["logLevel"] = "info"
    params["experimentWorkingDirectory"] = str(_get(config, "experiment_working_directory") or "")
    if (tuner := _algorithm(_get(config, "tuner"))) is not None:
        params["tuner"] = tuner
    if (assessor := _algorithm(_get(config, "assessor"))) is not None:
        params["assessor"] = assessor
    if (advisor := _algorithm(_get(config, "advisor"))) is not None:
        params["advisor"] = advisor
    service = NniTrainingService(platform=platform, trialCommand=command, trialCodeDirectory=code_dir,
                                 debug=params["debug"],
                                 maxTrialNumberPerGpu=_get(ts, "max_trial_number_per_gpu", 1))
    if _get(ts, "use_active_gpu") is not None:
        service["useActiveGpu"] = _get(ts, "use_active_gpu")
    if _get(ts, "gpu_indices") is not None:
        gpu_indices = _get(ts, "gpu_indices")
        service["gpuIndices"] = list(gpu_indices) if isinstance(gpu_indices, Iterable) else gpu_indices
    service["reuseMode"] = False
    params["trainingService"] = service
    return params


def trial_log_file(experiment_dir: Path, t: TrialJobDetail, name: str, platform: str) -> Path | None:
    """The copy streamed to the manager (every platform), else a local trial's own directory
    (local agents write there and stream too); never a directory an agent reported elsewhere."""
    return trial_log_path(experiment_dir, t, name, platform)
