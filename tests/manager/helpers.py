"""Helpers shared by the manager tests: a scripted trial, forms, polling."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail

# A trial that reports PERIODICAL metrics and a FINAL one, then does what `action` says:
# "ok", "fail" (exit 3), "sleep" (wait for the `release` file), "phases" (multi-phase).
TRIAL = r'''
import os, sys, time
from pathlib import Path
from nni_agent import get_next_parameter, report_intermediate_result, report_final_result
p = get_next_parameter()
out = Path(os.environ["NNI_OUTPUT_DIR"])
(out / "cuda.txt").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
print("trial", os.environ["NNI_TRIAL_JOB_ID"], "params", p, flush=True)
print("to stderr", file=sys.stderr, flush=True)
action = p.get("action", "ok")
for i in range(p.get("steps", 3)):
    report_intermediate_result(i)
    time.sleep(p.get("step_sleep", 0))
if action == "fail":
    sys.exit(3)
if action == "sleep":
    release = Path(p["release"])
    while not release.exists():
        if not release.parent.exists():  # the test is over: never outlive it
            sys.exit(9)
        time.sleep(0.05)
if action == "phases":
    q = get_next_parameter()
    report_final_result(q["y"])
    sys.exit(0)
report_final_result(p.get("x", 1))
'''


def form(seq: int = 0, **params: Any) -> TrialJobApplicationForm:
    record = {"parameter_id": seq, "parameter_source": "algorithm", "parameters": params, "parameter_index": 0}
    return TrialJobApplicationForm(sequence_id=seq, hyper_parameters=HyperParameters(json.dumps(record), 0))


def param_record(index: int, **params: Any) -> str:
    return json.dumps({"parameter_id": 100 + index, "parameter_source": "algorithm", "parameters": params,
                       "parameter_index": index})


async def until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `cond` (sync or async) every 20 ms until truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def wait_status(ts: Any, trial_id: str, *statuses: str, timeout: float = 20.0) -> TrialJobDetail:
    async def check() -> TrialJobDetail | None:
        d = await ts.get_trial_job(trial_id)
        return d if d.status.value in statuses else None

    try:
        return await until(check, timeout, f"trial {trial_id} to reach {statuses}")
    except AssertionError:
        d = await ts.get_trial_job(trial_id)
        raise AssertionError(f"trial {trial_id} is {d.status.value} ({d.message!r}), expected {statuses}") from None


def kill_tree(pid: int) -> None:
    """Kill a trial process left behind on purpose (its agent was killed) and its children."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
