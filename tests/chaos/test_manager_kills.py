"""The manager is SIGKILLed at random points (while trials are placed, streaming, ending, or
while a restarted manager is still starting and re-attaching) and restarted each time on the
same directory: every metric is stored exactly once, no listener hears one twice, every trial
ends SUCCEEDED, and nothing keeps running at the end."""
from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import psutil

from nni_manager.store import Store
from nni_manager.types import TrialJobStatus
from tests.support.manager.helpers import TRIAL, experiment_processes, heard, start_manager, stored_metrics

TRIALS, STEPS = 3, 60


def _stored_trials(exp_dir: Path) -> int:
    try:
        return len(Store.open_readonly(exp_dir).trials())
    except Exception:  # not created yet
        return 0


def test_repeated_manager_sigkills_at_random_points(short_dir: Path, chaos_seed: int) -> None:
    rng = random.Random(chaos_seed)
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    work, experiment_id = short_dir / "exps", "Chaos1"
    exp_dir = work / experiment_id

    def start(mode: str):  # -> Popen[str]
        return start_manager(experiment_id, mode, TRIALS, "--local", str(work), str(code),
                             "--steps", str(STEPS), "--step-sleep", "0.05")

    outputs: list[str] = []
    kills: list[str] = []
    manager = start("new")
    deadline = time.monotonic() + 30
    while _stored_trials(exp_dir) < TRIALS:  # the first kill comes after the trials exist
        assert time.monotonic() < deadline and manager.poll() is None, manager.communicate()
        time.sleep(0.02)
    for round_ in range(3):
        delay = rng.uniform(0.0, 1.5) if round_ == 0 else rng.uniform(0.3, 2.5)
        time.sleep(delay)
        if manager.poll() is None:
            manager.send_signal(signal.SIGKILL)
            metrics = len(stored_metrics(exp_dir))
            kills.append(f"after {delay:.2f} s ({metrics} metrics stored)")
        out, _ = manager.communicate()
        outputs.append(out)
        manager = start("resume")
    out, err = manager.communicate(timeout=90)
    outputs.append(out)
    print("kills:", kills)
    assert manager.returncode == 0, err

    store = Store.open_readonly(exp_dir)
    done = store.trials()
    assert len(done) == TRIALS and all(t.status == TrialJobStatus.SUCCEEDED for t in done), \
        [(t.id, t.status, t.message) for t in done]
    assert not any("restarted" in t.message for t in done)
    stored = Counter((m["trial_id"], m["type"], m["sequence"]) for m in store.metrics())
    expected = {(t.id, "PERIODICAL", i) for t in done for i in range(STEPS)} | {(t.id, "FINAL", 0) for t in done}
    assert set(stored) == expected and set(stored.values()) == {1}  # every metric, exactly once
    told = Counter(m for out in outputs for m in heard(out))
    assert set(told) <= expected and set(told.values()) <= {1}  # no listener heard a metric twice
    deadline = time.monotonic() + 20
    while experiment_processes(experiment_id):
        assert time.monotonic() < deadline, f"left running: {experiment_processes(experiment_id)}"
        time.sleep(0.1)
    agent_pid = int((exp_dir / "agents" / "local" / "agent.pid").read_text())
    while psutil.pid_exists(agent_pid) and psutil.Process(agent_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the agent outlived the experiment"
        time.sleep(0.05)
