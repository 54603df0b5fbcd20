"""A manager of an OpenPAI experiment is SIGKILLed mid-trial and restarted on the same directory:
the jobs keep running without it, their agents redial the same hub, the trials are re-attached
(not restarted, no new job), every metric is stored and heard exactly once, and clean_up stops
every job of the experiment and leaves no process behind."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.support.manager.helpers import TRIAL, check_resumed, sigkill_after_metrics, start_manager


def test_manager_sigkill_and_restart_reattaches_running_jobs(pai_factory, tmp_path: Path) -> None:
    pai = pai_factory(rate_limits={"list": 0})
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 2,
        "trialGracePeriod": 2, "experimentWorkingDirectory": str(tmp_path / "exps"),
        "trainingService": {"platform": "openpai", "host": pai.url, "username": pai.username, "token": pai.token,
                            "nniManagerIp": "127.0.0.1", "trialMemorySize": "1gb", "pollInterval": "0.5s"},
    }))
    config.chmod(0o600)
    exp_dir = tmp_path / "exps" / "PaiRestart1"
    first = start_manager("PaiRestart1", "new", 2, "--config", str(config), "--step-sleep", "0.3")
    out1, before = sigkill_after_metrics(first, exp_dir, trials=2, timeout=90)
    prefix = "nni_exp_PaiRestart1_"
    jobs = [j for j in pai.jobs() if j["name"].startswith(prefix)]
    assert len(jobs) == 2 and all(j["state"] == "RUNNING" for j in jobs), jobs  # running without a manager

    second = start_manager("PaiRestart1", "resume", 2, "--config", str(config), "--step-sleep", "0.3")
    out2, err2 = second.communicate(timeout=150)
    assert second.returncode == 0, err2[-3000:]

    trials = check_resumed(exp_dir, out2, before)
    assert {t.environment_id for t in trials} == {"env1", "env2"}
    names = sorted(j["name"] for j in pai.jobs() if j["name"].startswith(prefix))
    assert names == [prefix + "env_1", prefix + "env_2"], names  # re-attached: no new job
    pai.wait_for(lambda: all(j["state"] in ("STOPPED", "SUCCEEDED") for j in pai.jobs() if j["name"].startswith(prefix)), 60,
                 what="clean_up stopped both jobs")
    pai.wait_for(lambda: not pai.live_pids(), 60, what="no task process left")
    assert pai.token not in out2 + err2
