"""The WebUI's hand-written JSON (the trial table, metric records) is byte for byte what
`dumps` of the record dicts gives: NNI's clients parse these strictly."""
from __future__ import annotations

import json

from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail, TrialJobStatus
from nni_manager.webui.views import dumps, metric_record, metric_record_json, trial_job, trial_job_json


def _trial(status: TrialJobStatus, message: str = "", end: int | None = None) -> TrialJobDetail:
    record = json.dumps({"parameter_id": 3, "parameter_source": "algorithm", "parameters": {"x": "é\u2028"}})
    return TrialJobDetail(id="t\u00e9\"1", status=status, submit_time=1_795_000_000_000, sequence_id=7,
                          form=TrialJobApplicationForm(7, HyperParameters(record, 0)), working_directory="/w/t1",
                          start_time=None if status == TrialJobStatus.WAITING else 1_795_000_000_500,
                          end_time=end, message=message)


def test_trial_job_json_is_the_job_dumped() -> None:
    message = {"type": "FINAL", "value": json.dumps({"default": 0.5}), "parameter_id": 3}
    final = metric_record("t1", message, 1_795_000_001_000, 0)
    final_json = metric_record_json("t1", message, 1_795_000_001_000, 0)
    cases = [_trial(TrialJobStatus.SUCCEEDED, end=1_795_000_002_000), _trial(TrialJobStatus.RUNNING),
             _trial(TrialJobStatus.WAITING), _trial(TrialJobStatus.FAILED, "exit code 1 \"x\"\n", 1_795_000_002_000),
             _trial(TrialJobStatus.USER_CANCELED, "agent received SIGTERM")]
    for t in cases:
        for parameters in ({}, {0: t.form.hyper_parameters.value, 1: '{"parameter_id": 4, "parameters": 5}'},
                           {2: "not json"}):
            for has_final in (True, False):
                want = dumps(trial_job(t, parameters, final if has_final else None, "/logs/é"))
                assert trial_job_json(t, parameters, final_json if has_final else None, "/logs/é") == want
