"""Helpers shared by the manager tests: a scripted trial, forms, polling."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail
from tests.support.polling import intervals

# A trial that reports PERIODICAL metrics and a FINAL one, then does what `action` says:
# "ok", "fail" (exit 3), "sleep" (wait for the `release` file), "phases" (multi-phase).
TRIAL = r'''
import os, sys, time
from pathlib import Path
from nni_agent import get_next_parameter, report_intermediate_result, report_final_result
p = get_next_parameter()
out = Path(os.environ["NNI_OUTPUT_DIR"])
(out / "cuda.tmp").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
(out / "cuda.tmp").rename(out / "cuda.txt")  # atomic: a reader never sees it half-written
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
    """Poll `cond` (sync or async) until truthy, every 20 ms at first, then less often
    (tests/support/polling.py); fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    for gap in intervals():
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(gap)
    raise AssertionError("unreachable")


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


# ---------------------------------------------------------------------- a manager in its own process

def start_manager(experiment_id: str, mode: str, n: int, *where: str) -> subprocess.Popen[str]:
    """tests/support/manager/manager_proc.py with `where` = ("--local", workdir, code) or ("--config", yaml)."""
    root = Path(__file__).resolve().parents[3]
    return subprocess.Popen([sys.executable, "-m", "tests.support.manager.manager_proc", experiment_id, mode, str(n), *where],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stored_metrics(exp_dir: Path) -> list[dict[str, Any]]:
    from nni_manager.store import Store

    try:
        return Store.open_readonly(exp_dir).metrics()
    except Exception:  # not created yet
        return []


def sigkill_after_metrics(manager: subprocess.Popen[str], exp_dir: Path, trials: int, timeout: float = 30) -> tuple[str, set[tuple[str, str, int]]]:
    """Wait until `trials` trials have reported past their first metric, SIGKILL the manager;
    returns its output and the metrics stored by then."""
    import signal

    deadline = time.monotonic() + timeout
    while len({m["trial_id"] for m in stored_metrics(exp_dir) if m["sequence"] >= 1}) < trials:
        assert time.monotonic() < deadline, "no metrics from the first manager"
        assert manager.poll() is None, manager.communicate()
        time.sleep(0.05)
    manager.send_signal(signal.SIGKILL)
    out, _ = manager.communicate()
    return out, {(m["trial_id"], m["type"], m["sequence"]) for m in stored_metrics(exp_dir)}


def heard(out: str) -> list[tuple[str, str, int]]:
    """The METRIC lines a manager_proc printed."""
    return [(p[1], p[2], int(p[3])) for p in (line.split() for line in out.splitlines()) if p and p[0] == "METRIC"]


def check_resumed(exp_dir: Path, out: str, before: set[tuple[str, str, int]], *, trials: int = 2,
                  steps: int = 12) -> list[TrialJobDetail]:
    """After a manager SIGKILL and a restart (its output `out`): every trial SUCCEEDED, every metric
    is stored exactly once, the second manager told its listeners only what the first had not stored,
    and no trial was restarted. Returns the trials."""
    from collections import Counter

    from nni_manager.store import Store
    from nni_manager.types import TrialJobStatus

    store = Store.open_readonly(exp_dir)
    done = store.trials()
    assert len(done) == trials and all(t.status == TrialJobStatus.SUCCEEDED for t in done), done
    stored = Counter((m["trial_id"], m["type"], m["sequence"]) for m in store.metrics())
    expected = {(t.id, "PERIODICAL", i) for t in done for i in range(steps)} | {(t.id, "FINAL", 0) for t in done}
    assert set(stored) == expected and set(stored.values()) == {1}  # every metric, exactly once
    second = heard(out)
    assert second and not set(second) & before and len(second) == len(set(second))  # nothing heard twice
    assert not any("restarted" in t.message for t in done)
    return done


def sleeper(base: Path, seq: int, name: str, **params: Any) -> TrialJobApplicationForm:
    """A trial (TRIAL, action "sleep") that runs until `release(base, name)`; it exits by itself
    when `base` is gone, so it never outlives its test."""
    return form(seq, action="sleep", release=str(base / f"release-{name}"), **{"steps": 1, **params})


def release(base: Path, name: str) -> None:
    (base / f"release-{name}").write_text("go")


async def message_with(ts: Any, trial_id: str, *needles: str, timeout: float = 90.0) -> str:
    """Wait until the trial's message holds every needle; fail saying what it is instead."""
    async def check() -> str | None:
        d = await ts.get_trial_job(trial_id)
        return d.message if all(n in d.message for n in needles) else None

    try:
        return await until(check, timeout, f"{needles} in the message of {trial_id}")
    except AssertionError:
        d = await ts.get_trial_job(trial_id)
        raise AssertionError(f"trial {trial_id} is {d.status.value} ({d.message!r}), expected {needles}") from None


def experiment_processes(experiment_id: str) -> list[Any]:
    """Live processes (agents, trials) started for `experiment_id` (psutil.Process objects)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("NNI_EXP_ID") == experiment_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def register_backend(root: Path, dist: str, platform: str, target: str, source: str | None = None) -> Path:
    """Make `root` a site holding a third-party platform package, as pip would install it: a
    dist-info whose `nni_manager.backends` entry point names `target` ("module:Class"), and the
    module's `source` when given. Put `root` on sys.path to register it."""
    root.mkdir(parents=True, exist_ok=True)
    if source is not None:
        (root / f"{target.split(':')[0]}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[nni_manager.backends]\n{platform} = {target}\n")
    return root
