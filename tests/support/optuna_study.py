"""Running `nni-manager optuna` in a test and checking the study afterwards, for every platform's
Optuna test (tests/optuna): the objectives (tests/optuna/objectives.py) record what they saw, on
the worker, in the test's seen/<trial id>.json."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna

from nni_manager.store import Store
from nni_manager.types import TrialJobStatus
from tests.support.remote.fixtures import processes_with

CLI = [sys.executable, "-m", "nni_manager"]
OBJECTIVES = Path(__file__).resolve().parents[1] / "optuna" / "objectives.py"
COMPLETE, PRUNED, FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                          optuna.trial.TrialState.FAIL)


def start_study(where: Path, target: str, n_trials: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "optuna", target, "--study-name", "s", "--storage", storage_url(where),
                             "--n-trials", str(n_trials), "--config", str(where / "config.yml"), "--plain",
                             "--no-webui", *extra], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def storage_url(where: Path) -> str:
    return f"sqlite:///{where / 'db' / 'study.db'}"


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        raise AssertionError("the study did not end:\n" + out) from None
    assert proc.returncode == 0, out
    return out


def experiment_id(where: Path) -> str:
    """The one experiment under where/exps (beside what a platform keeps there, e.g. Slurm's agent-deps)."""
    (exp_dir,) = [d for d in (where / "exps").iterdir() if (d / "log").is_dir()]
    return exp_dir.name


def copy_objectives(where: Path) -> None:
    """where/code/objectives.py, whose objectives write what they saw to where/seen (a directory of
    the test's, which the worker shares: not the SSH user's home, which other test runs may clean)."""
    code = where / "code"
    code.mkdir()
    shutil.copy(OBJECTIVES, code / "objectives.py")
    (code / "seen_dir.txt").write_text(f"{where}\n")
    (where / "db").mkdir()


def worker_records(where: Path) -> dict[str, dict]:
    """What each objective wrote on the worker (copy_objectives), by NNI trial id: its record, with
    which Python ran it where it said (<id>.worker.json)."""
    seen = where / "seen"
    records = {p.name[:-len(".json")]: json.loads(p.read_text()) for p in seen.glob("*.json")
               if not p.name.endswith(".worker.json")}
    for trial_id, record in records.items():
        worker = seen / f"{trial_id}.worker.json"
        if worker.is_file():
            record.update(json.loads(worker.read_text()))
    return records


def experiment_trials(where: Path) -> tuple[dict[str, TrialJobStatus], dict[str, dict]]:
    """Each trial's status here, and the final metric it reported (what `trials` and the WebUI show)."""
    store = Store.open_readonly(where / "exps" / experiment_id(where))
    try:
        statuses = {t.id: t.status for t in store.trials()}
        finals = {m["trial_id"]: json.loads(json.loads(m["data"])["value"]) for m in store.metrics()
                  if m["type"] == "FINAL"}
        return statuses, finals
    finally:
        store.close()


def trial_messages(where: Path) -> dict[str, str]:
    """Each trial's message and the last lines of its stderr (what a failed assertion shows)."""
    exp_dir = where / "exps" / experiment_id(where)
    store = Store.open_readonly(exp_dir)
    try:
        shown = {}
        for t in store.trials():
            stderr = exp_dir / "trials" / t.id / "trial.stderr"
            tail = stderr.read_text(errors="replace").splitlines()[-5:] if stderr.is_file() else []
            shown[t.id] = f"{t.status.value}: {t.message} | " + " / ".join(tail)
        return shown
    finally:
        store.close()


def check_study(where: Path, python: Path, n_trials: int) -> tuple[list, dict[str, dict]]:
    """Exactly n_trials finished Optuna trials, none RUNNING, each one NNI trial's, with the params its
    objective saw (on the worker, under the worker's Python, through the agent only) and the values
    it returned."""
    trials = optuna.load_study(study_name="s", storage=storage_url(where)).get_trials(deepcopy=False)
    assert len(trials) == n_trials and all(t.state.is_finished() for t in trials), [t.state for t in trials]
    records = worker_records(where)
    statuses, finals = experiment_trials(where)
    assert len(records) == len(statuses) == n_trials, (sorted(records), statuses, trial_messages(where))
    for t in trials:
        trial_id = t.user_attrs["nni:trial_id"]
        record = records[trial_id]
        assert record["number"] == t.number and record["params"] == t.params, (record["params"], t)
        assert record["python"] == str(python), record["python"]  # the worker's Python, not the manager's
        # its own packages (worker_python: linked under <root>/deps), none of the agent's (psutil is shipped
        # to the agent only)
        assert record["grpc_file"].startswith(str(python.parents[2] / "deps")), record["grpc_file"]
        assert not record["psutil_importable"], record["sys_path"]
        assert record["storage_class"] == "AgentStorageProxy" and record["endpoint"].startswith("127.0.0.1:"), (
            record["storage_class"], record["endpoint"])
        assert record["wrong_token"] == "UNAUTHENTICATED" and "NNI_STUDY_STORAGE_TOKEN" not in record["environ"]
        assert "study.db" not in json.dumps([record["environ"], record["argv"]])
        if t.state == COMPLETE:
            assert record["returned"] == t.values and finals[trial_id]["default"] == t.values[0]
            assert statuses[trial_id] == TrialJobStatus.SUCCEEDED
        elif t.state == PRUNED:
            assert record["pruned_at"] == t.last_step and trial_id not in finals
            assert statuses[trial_id] == TrialJobStatus.EARLY_STOPPED
    return trials, records


def kill_the_sleeping_trial(where: Path, proc: subprocess.Popen[str]) -> str:
    """SIGKILL, on the worker, the process tree of the trial running objectives.first_sleeps's Optuna
    trial 0, mid-objective; its NNI trial id."""
    deadline = time.monotonic() + 120
    try:
        while not (sleeping := [r for r in worker_records(where).values() if r.get("slept")]):
            assert proc.poll() is None and time.monotonic() < deadline, "trial 0 never started"
            time.sleep(0.3)
        (record,) = sleeping
        trial_id: str = record["environ"]["NNI_TRIAL_JOB_ID"]
        tree = processes_with(f"NNI_TRIAL_JOB_ID={trial_id}".encode())
        assert record["pid"] in tree, (record["pid"], tree)
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        return trial_id
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def check_the_killed_trial(where: Path, python: Path, n_trials: int, out: str, trial_id: str) -> None:
    """The killed trial's Optuna trial 0 is FAIL (marked by the manager: the runner could not tell
    the study) and counts toward n_trials; the others COMPLETE; none RUNNING; no trial process left."""
    assert f"maxTrialNumber ({n_trials}) reached" in out
    trials, _ = check_study(where, python, n_trials)
    killed = next(t for t in trials if t.user_attrs["nni:trial_id"] == trial_id)
    assert killed.number == 0 and killed.state == FAIL
    assert [t.state for t in trials if t is not killed] == [COMPLETE] * (n_trials - 1)
    statuses, _ = experiment_trials(where)
    assert statuses[trial_id] == TrialJobStatus.FAILED, statuses
    log = (where / "exps" / experiment_id(where) / "log" / "nnimanager.log").read_text()
    assert log.count("was left RUNNING: marked FAIL") == 1
    assert not processes_with(f"NNI_EXP_ID={experiment_id(where)}".encode())
