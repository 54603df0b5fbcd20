"""The manager is SIGKILLed mid-experiment and restarted on the same directory: running
trials are re-attached and every metric reaches the store (and a listener) exactly once."""
from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import psutil

from nni_manager.store import Store
from nni_manager.types import TrialJobStatus
from tests.support.manager.helpers import experiment_processes, heard, sigkill_after_metrics, start_manager


def start(work: Path, code: Path, mode: str, experiment_id: str = "Restart1", *extra: str):  # -> Popen[str]
    return start_manager(experiment_id, mode, 2, "--local", str(work), str(code), *extra)


def test_manager_sigkill_and_restart(short_dir: Path, code_dir: Path) -> None:
    work = short_dir / "exps"
    exp_dir = work / "Restart1"
    first = start(work, code_dir, "new")
    out1, before = sigkill_after_metrics(first, exp_dir, trials=2)
    agent_pid = int((exp_dir / "agents" / "local" / "agent.pid").read_text())
    assert psutil.pid_exists(agent_pid)  # trials keep running without a manager

    second = start(work, code_dir, "resume")
    out2, err2 = second.communicate(timeout=60)
    assert second.returncode == 0, err2

    store = Store.open_readonly(exp_dir)
    trials = store.trials()
    assert len(trials) == 2 and all(t.status == TrialJobStatus.SUCCEEDED for t in trials), trials
    stored = Counter((m["trial_id"], m["type"], m["sequence"]) for m in store.metrics())
    expected = {(t.id, "PERIODICAL", i) for t in trials for i in range(12)} | {(t.id, "FINAL", 0) for t in trials}
    assert set(stored) == expected and set(stored.values()) == {1}  # every metric, exactly once

    second_heard = heard(out2)
    assert second_heard and not set(second_heard) & before  # nothing delivered twice
    assert len(second_heard) == len(set(second_heard))
    assert set(heard(out1)) <= before  # the first manager told listeners only what it had stored
    deadline = time.monotonic() + 10
    while psutil.pid_exists(agent_pid) and psutil.Process(agent_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the agent outlived the restarted manager"
        time.sleep(0.05)


def test_nothing_stays_running_after_the_manager_is_sigkilled(short_dir: Path, code_dir: Path) -> None:
    work = short_dir / "exps"
    exp_dir = work / "Orphan1"
    # Trials that would run for a minute; the agent waits only 2 s for a lost manager.
    manager = start(work, code_dir, "new", "Orphan1", "--reconnect-window", "2", "--step-sleep", "5")
    deadline = time.monotonic() + 30
    while len(experiment_processes("Orphan1")) < 2:  # both trials are running
        assert time.monotonic() < deadline, "trials never started"
        assert manager.poll() is None, manager.communicate()
        time.sleep(0.05)
    agent_pid = int((exp_dir / "agents" / "local" / "agent.pid").read_text())
    manager.send_signal(signal.SIGKILL)
    manager.communicate()
    deadline = time.monotonic() + 20
    while experiment_processes("Orphan1") or (
            psutil.pid_exists(agent_pid) and psutil.Process(agent_pid).status() != psutil.STATUS_ZOMBIE):
        assert time.monotonic() < deadline, "trials or the agent outlived the killed manager"
        time.sleep(0.1)
