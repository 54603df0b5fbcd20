"""NNI's trial API with NNI's names, stdlib only, for trial code that does not install `nni`.

Under nni-agent it speaks NNI's local file channel (nni-training-service.md §1.3-1.5):
parameters come from `$NNI_SYS_DIR/parameter.cfg` (then `parameter_<i>.cfg`), metrics are
appended to `$NNI_SYS_DIR/.nni/metrics` as `ME%06d` records that the agent tails. Under NNI 3's
own manager, which writes no parameter.cfg, it speaks NNI 3's HTTP trial channel
(`NNI_TRIAL_COMMAND_CHANNEL`, §1.7), as NNI's SDK does. Outside a trial (`NNI_PLATFORM` unset)
it behaves like NNI standalone: empty parameters, printed metrics. Metric values are encoded as
NNI's `nni.dump` (json_tricks) encodes them: numpy scalars as numbers, arrays as `__ndarray__`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, BinaryIO

# Every trial pays this module's imports at its start: urllib.request (http.client, email, ssl)
# is imported only for NNI 3's HTTP channel, and paths are os.path strings, not pathlib; the two
# were three quarters of `import nni_agent`.

__all__ = [
    "get_experiment_id",
    "get_next_parameter",
    "get_sequence_id",
    "get_trial_id",
    "report_final_result",
    "report_intermediate_result",
]

METRIC_SIZE_LIMIT = 1_000_000  # bytes of one record's payload, NNI's limit
_PARAMETER_POLL_S = 0.05

_parameter_record: dict[str, object] | None = None
_parameter_index = 0
_intermediate_seq = 0
_metrics_file: BinaryIO | None = None  # kept open: one append per metric, flushed at once
_http_url: str | None = None  # NNI 3's HTTP channel, once chosen (see _channel_url)
_channel_chosen = False


def _in_trial() -> bool:
    return os.environ.get("NNI_PLATFORM", "") not in ("", "unittest")


def _sys_dir() -> str:
    return os.environ.get("NNI_SYS_DIR") or "."


def get_experiment_id() -> str:
    return os.environ.get("NNI_EXP_ID", "STANDALONE")


def get_trial_id() -> str:
    return os.environ.get("NNI_TRIAL_JOB_ID", "STANDALONE")


def get_sequence_id() -> int:
    return int(os.environ.get("NNI_TRIAL_SEQ_ID", "0"))


def get_next_parameter() -> Any:
    """The next hyperparameter set: index 0 from parameter.cfg, later ones asked for and awaited."""
    global _parameter_record, _parameter_index
    if not _in_trial():
        return {}
    index = _parameter_index
    url = _channel_url()
    if url is not None:
        record = _http_parameter(url)
        if record is None:
            return None
        _parameter_record = record
        _parameter_index = index + 1
        return record.get("parameters")
    path = os.path.join(_sys_dir(), "parameter.cfg" if index == 0 else f"parameter_{index}.cfg")
    if not os.path.isfile(path):
        _append_record({
            "parameter_id": None,
            "trial_job_id": get_trial_id(),
            "type": "REQUEST_PARAMETER",
            "sequence": 0,
            "parameter_index": index,
        })
    while not (os.path.isfile(path) and os.path.getsize(path) > 0):
        time.sleep(_PARAMETER_POLL_S)
    with open(path, encoding="utf-8") as f:
        record = json.loads(f.read())
    if not isinstance(record, dict) or "parameters" not in record:
        raise ValueError(f"{path} is not a ParameterRecord (a JSON object with 'parameters')")
    _parameter_record = record
    _parameter_index = index + 1
    return record["parameters"]


def report_intermediate_result(metric: object) -> None:
    """Report a PERIODICAL metric; sequence counts from 0 per process, as in NNI."""
    global _intermediate_seq
    _report("PERIODICAL", _intermediate_seq, metric)
    _intermediate_seq += 1


def report_final_result(metric: object) -> None:
    _report("FINAL", 0, metric)


def _report(kind: str, sequence: int, metric: object) -> None:
    if not _in_trial():
        print(f"{'Final' if kind == 'FINAL' else 'Intermediate'} result: {metric}", flush=True)
        return
    _append_record({
        "parameter_id": _parameter_record.get("parameter_id") if _parameter_record else None,
        "trial_job_id": get_trial_id(),
        "type": kind,
        "sequence": sequence,
        "value": dump(metric),
    })


def dump(value: object) -> str:
    """JSON as NNI's `nni.dump` writes it for metric values: numpy scalars become numbers and
    arrays json_tricks' `{"__ndarray__": [...], "dtype": ..., "shape": [...]}`."""
    return json.dumps(value, default=_encode)


def _encode(value: Any) -> Any:
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if dtype is not None and hasattr(value, "tolist"):
        if shape == ():
            return value.item()  # numpy scalar (float32, int64, bool_)
        return {"__ndarray__": value.tolist(), "dtype": str(dtype), "shape": list(shape or ())}
    if hasattr(value, "item") and callable(value.item):  # other scalar wrappers (torch tensors of one value)
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{type(value).__name__} is not JSON serializable (NNI metrics are numbers or dicts of them)")


def _channel_url() -> str | None:
    """NNI 3's HTTP trial channel when this trial runs under NNI 3's own manager: the channel is
    set and no parameter.cfg was written (nni-agent writes one and tails the faster metrics file)."""
    global _http_url, _channel_chosen
    if not _channel_chosen:
        url = os.environ.get("NNI_TRIAL_COMMAND_CHANNEL", "")
        written = os.path.join(_sys_dir(), "parameter.cfg")
        if url.startswith(("http://", "https://")) and not os.path.isfile(written):
            _http_url = url
        _channel_chosen = True
    return _http_url


def _http(url: str, method: str, body: dict[str, object] | None = None) -> tuple[int, object]:
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
            return response.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        return e.code, None


def _http_parameter(url: str) -> dict[str, object] | None:
    """`request_parameter`, then long-poll GET until the `parameter` command (408: ask again;
    410: the channel is closed, no parameter), as NNI's `nni/runtime/command_channel/http.py`."""
    _http(url, "PUT", {"type": "request_parameter"})
    while True:
        status, command = _http(url, "GET")
        if status == 408:
            continue
        if status == 410:
            return None
        if status != 200 or not isinstance(command, dict):
            raise RuntimeError(f"NNI trial channel {url}: unexpected answer {status}")
        if command.get("type") == "parameter":
            record = json.loads(command["parameter"])
            if not isinstance(record, dict) or "parameters" not in record:
                raise ValueError("the trial channel sent no ParameterRecord (a JSON object with 'parameters')")
            return record


def _append_record(metric: dict[str, object]) -> None:
    payload = (json.dumps(metric) + "\n").encode("utf-8")
    if len(payload) >= METRIC_SIZE_LIMIT:
        raise ValueError(f"metric too long: {len(payload)} bytes (NNI's limit is {METRIC_SIZE_LIMIT})")
    url = _channel_url()
    if url is not None:
        status, _ = _http(url, "PUT", {"type": "metric", "metric": payload.decode("utf-8").rstrip("\n")})
        if status != 200:
            raise RuntimeError(f"NNI trial channel {url}: the metric was refused ({status})")
        return
    global _metrics_file
    if _metrics_file is None:
        nni_dir = os.path.join(_sys_dir(), ".nni")
        os.makedirs(nni_dir, exist_ok=True)
        _metrics_file = open(os.path.join(nni_dir, "metrics"), "ab")
    _metrics_file.write(b"ME%06d%b" % (len(payload), payload))
    _metrics_file.flush()
