"""NNI's trial API with NNI's names, stdlib only, for trial code that does not install `nni`.

It speaks NNI's local file channel (nni-training-service.md §1.3-1.5): parameters come from
`$NNI_SYS_DIR/parameter.cfg` (then `parameter_<i>.cfg`), metrics are appended to
`$NNI_SYS_DIR/.nni/metrics` as `ME%06d` records that the agent tails. Outside a trial
(`NNI_PLATFORM` unset) it behaves like NNI standalone: empty parameters, printed metrics.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, BinaryIO

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

_parameter_record: dict[str, Any] | None = None
_parameter_index = 0
_intermediate_seq = 0
_metrics_file: BinaryIO | None = None  # kept open: one append per metric, flushed at once


def _in_trial() -> bool:
    return os.environ.get("NNI_PLATFORM", "") not in ("", "unittest")


def _sys_dir() -> Path:
    return Path(os.environ.get("NNI_SYS_DIR") or ".")


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
    path = _sys_dir() / ("parameter.cfg" if index == 0 else f"parameter_{index}.cfg")
    if not path.is_file():
        _append_record({
            "parameter_id": None,
            "trial_job_id": get_trial_id(),
            "type": "REQUEST_PARAMETER",
            "sequence": 0,
            "parameter_index": index,
        })
    while not (path.is_file() and path.stat().st_size > 0):
        time.sleep(_PARAMETER_POLL_S)
    record = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(record, dict) or "parameters" not in record:
        raise ValueError(f"{path} is not a ParameterRecord (a JSON object with 'parameters')")
    _parameter_record = record
    _parameter_index = index + 1
    return record["parameters"]


def report_intermediate_result(metric: Any) -> None:
    """Report a PERIODICAL metric; sequence counts from 0 per process, as in NNI."""
    global _intermediate_seq
    _report("PERIODICAL", _intermediate_seq, metric)
    _intermediate_seq += 1


def report_final_result(metric: Any) -> None:
    _report("FINAL", 0, metric)


def _report(kind: str, sequence: int, metric: Any) -> None:
    if not _in_trial():
        print(f"{'Final' if kind == 'FINAL' else 'Intermediate'} result: {metric}", flush=True)
        return
    _append_record({
        "parameter_id": _parameter_record.get("parameter_id") if _parameter_record else None,
        "trial_job_id": get_trial_id(),
        "type": kind,
        "sequence": sequence,
        "value": json.dumps(metric),
    })


def _append_record(metric: dict[str, Any]) -> None:
    payload = (json.dumps(metric) + "\n").encode("utf-8")
    if len(payload) >= METRIC_SIZE_LIMIT:
        raise ValueError(f"metric too long: {len(payload)} bytes (NNI's limit is {METRIC_SIZE_LIMIT})")
    global _metrics_file
    if _metrics_file is None:
        nni_dir = _sys_dir() / ".nni"
        nni_dir.mkdir(parents=True, exist_ok=True)
        _metrics_file = open(nni_dir / "metrics", "ab")
    _metrics_file.write(b"ME%06d%b" % (len(payload), payload))
    _metrics_file.flush()
