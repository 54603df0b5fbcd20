"""A detached `nni-manager optuna` SIGKILLed mid-study (the manager alone), then `nni-manager resume`.

While the manager is gone the study holds its running trials RUNNING (nobody can tell it
otherwise). After the resume it holds exactly n_trials finished trials, none RUNNING: trials that
lived on (the agent waits reconnectWindow for its manager) end as their objectives returned, their
storage calls made while the manager was away answered once it is back; trials that died with the
manager (the agent gave up on it and stopped them) are FAIL, marked by the resumed manager; and no
process of the experiment is left.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

optuna = pytest.importorskip("optuna")

from nni_manager.store import Store  # noqa: E402
from nni_manager.types import TrialJobStatus  # noqa: E402
from tests.support.manager.helpers import experiment_processes  # noqa: E402
from tests.support.optuna_study import (  # noqa: E402
    CLI,
    COMPLETE,
    FAIL,
    copy_objectives,
    experiment_trials,
    storage_url,
    worker_records,
)

N_TRIALS = 4


def wait_for(what, timeout: float = 120, why: str = "timed out"):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, why
        time.sleep(0.2)
    return found


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("agent", ["waits", "gives_up"])
def test_a_sigkilled_manager_resumes_the_study(short_dir: Path, tmp_path: Path, agent: str) -> None:
    """`waits`: resumed within the reconnect window, the two running trials live on and COMPLETE;
    `gives_up`: the agent stops them after a 2 s window, and the resume marks their Optuna trials FAIL.
    Either way the study ends with exactly N_TRIALS finished trials of this experiment."""
    where = short_dir
    copy_objectives(where)
    (where / "config.yml").write_text(
        "trialCodeDirectory: code\ntrialConcurrency: 2\nexperimentWorkingDirectory: exps\n"
        "trainingService:\n  platform: local\n" + ("  reconnectWindow: 2s\n" if agent == "gives_up" else ""))
    env = {**os.environ, "HOME": str(tmp_path)}

    def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], cwd=where, capture_output=True, text=True, timeout=timeout, env=env)

    started = cli("optuna", "objectives.py:held", "--study-name", "s", "--storage", storage_url(where), "--n-trials",
                  str(N_TRIALS), "--config", str(where / "config.yml"), "--detach", "--port", "0")
    assert started.returncode == 0, started.stdout + started.stderr
    experiment_id = started.stdout.split()[1]
    pid = int(re.search(r"\(pid (\d+)\)", started.stdout).group(1))  # type: ignore[union-attr]
    try:
        assert experiment_id in cli("list").stdout
        assert experiment_id in " ".join(psutil.Process(pid).cmdline())  # this experiment's manager
        held = wait_for(lambda: len([r for r in worker_records(where).values() if r.get("held")]) == 2
                        and worker_records(where), why="two trials never ran")
        os.kill(pid, signal.SIGKILL)  # the manager alone: its agent and trials are other processes
        wait_for(lambda: gone(pid), 30, "the manager outlived SIGKILL")
        study = optuna.load_study(study_name="s", storage=storage_url(where))
        at_kill = study.get_trials(deepcopy=False)
        # nobody could tell the study otherwise: the running trials are RUNNING, and they are ours
        assert sorted((t.number, t.state.name) for t in at_kill) == [(0, "RUNNING"), (1, "RUNNING")], at_kill
        assert {t.user_attrs["nni:trial_id"] for t in at_kill} == set(held)
        if agent == "gives_up":
            wait_for(lambda: not experiment_processes(experiment_id), 60, "the agent never gave up")
            assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["RUNNING", "RUNNING"]
        else:
            assert len([p for p in experiment_processes(experiment_id) if p.pid in
                        {r["pid"] for r in held.values()}]) == 2  # the objectives live on without their manager
        (where / "release").write_text("go")  # the objectives now call the storage: the manager is not there
        resumed = cli("resume", experiment_id, "--plain", "--no-webui", timeout=300)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert f"maxTrialNumber ({N_TRIALS}) reached" in resumed.stdout, resumed.stdout
    trials = sorted(optuna.load_study(study_name="s", storage=storage_url(where)).get_trials(deepcopy=False),
                    key=lambda t: t.number)
    assert len(trials) == N_TRIALS and all(t.state.is_finished() for t in trials), [t.state for t in trials]
    assert {t.user_attrs["nni:experiment_id"] for t in trials} == {experiment_id}
    records = worker_records(where)
    statuses, finals = experiment_trials(where)
    assert len(statuses) == N_TRIALS and set(records) == set(statuses), (statuses, sorted(records))
    for t in trials:
        trial_id = t.user_attrs["nni:trial_id"]
        record = records[trial_id]
        assert record["number"] == t.number and record["params"] == t.params
        if t.number < 2 and agent == "gives_up":  # died with the manager: FAIL, by the resumed one
            assert t.state == FAIL and "returned" not in record, (t, record)
            assert statuses[trial_id] != TrialJobStatus.SUCCEEDED and trial_id not in finals
        else:
            assert t.state == COMPLETE and record["returned"] == t.values, (t, record)
            assert t.user_attrs["released"] is True  # its storage call made after the release
            assert statuses[trial_id] == TrialJobStatus.SUCCEEDED and finals[trial_id]["default"] == t.values[0]
    store = Store.open_readonly(where / "exps" / experiment_id)
    try:  # what `trials` and the WebUI show: each trial's Optuna trial, also of those the resume took over
        kept = {t.id: json.loads(t.form.hyper_parameters.value).get("optuna") for t in store.trials()}
    finally:
        store.close()
    assert kept == {t.user_attrs["nni:trial_id"]: {"number": t.number, "state": t.state.name, "params": t.params,
                                                  "values": t.values} for t in trials}, kept
    log = (where / "exps" / experiment_id / "log" / "nnimanager.log").read_text()
    assert log.count("was left RUNNING: marked FAIL") == (2 if agent == "gives_up" else 0)  # by the resumed manager
    assert not experiment_processes(experiment_id)  # no agent, trial or manager of it is left
    assert experiment_id not in cli("list").stdout  # not running
