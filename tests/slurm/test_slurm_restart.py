"""A manager of a Slurm experiment reached through `loginNode` is SIGKILLed mid-trial and restarted
on the same directory: the relay on the login node outlives it, the agents redial through it, their
trials are re-attached. (The plain restart, every job platform alike: tests/platforms/test_job_contract.py.)"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.manager.helpers import TRIAL, check_resumed, sigkill_after_metrics, start_manager


def test_manager_restart_through_the_login_node_keeps_the_relay(slurm, login_node, tmp_path: Path) -> None:
    """The restart of tests/platforms/test_job_contract.py through `loginNode`: the SIGKILLed manager's SSH link and forward die with it; the
    restarted one reconnects, finds the relay still running (same port, the one the batch scripts
    name), points it at a new forward, and the agents' redials reach the new hub."""
    from tests.support.slurm.fixtures import relay_processes

    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 2,
        "trialGracePeriod": 2, "experimentWorkingDirectory": str(tmp_path / "exps"),
        "trainingService": {"platform": "slurm", "reuseMode": True, "pythonPath": sys.executable,
                            "trialCpuNumber": 1, "trialMemorySize": "200mb", "pollInterval": "0.3s",
                            "loginNode": login_node.spec},
    }))
    exp_dir = tmp_path / "exps" / "SlurmLoginRestart1"
    # the login node's side lives in root's real home: a run killed before its end left this one there
    shutil.rmtree(login_node.home / "nni-experiments" / "SlurmLoginRestart1", ignore_errors=True)
    first = start_manager("SlurmLoginRestart1", "new", 2, "--config", str(config), "--step-sleep", "0.3")
    out1, before = sigkill_after_metrics(first, exp_dir, trials=2, timeout=90)
    relays = relay_processes()
    assert len(relays) == 1, relays  # the relay outlives its manager (agents keep its address)

    second = start_manager("SlurmLoginRestart1", "resume", 2, "--config", str(config), "--step-sleep", "0.3")
    try:
        out2, err2 = second.communicate(timeout=150)
    except subprocess.TimeoutExpired as e:  # say where it stands: the jobs, the store, every log on both sides
        second.kill()
        out2, err2 = second.communicate()
        raise AssertionError(f"the resumed manager did not end in 150 s\nits stdout: {(e.output or '')[-2000:]}"
                             f"{out2[-2000:]}\nits stderr: {err2[-3000:]}\n"
                             f"{_state(slurm, exp_dir, login_node.home / 'nni-experiments' / 'SlurmLoginRestart1')}") from None
    assert second.returncode == 0, err2[-3000:]
    trials = check_resumed(exp_dir, out2, before)
    assert {t.environment_id for t in trials} == {"env1", "env2"}
    names = [j["name"] for j in slurm.jobs("nni_exp_SlurmLoginRestart1_")]
    assert sorted(names) == ["nni_exp_SlurmLoginRestart1_env_1", "nni_exp_SlurmLoginRestart1_env_2"], names
    log = (login_node.home / "nni-experiments" / "SlurmLoginRestart1" / "relay.log").read_text()
    assert log.count("relay on ") == 1, log  # one relay for both managers
    slurm.wait_for(lambda: not slurm.live_jobs("nni_exp_SlurmLoginRestart1_"), 60, "no live job")
    slurm.wait_for(lambda: not slurm.job_processes(), 60, "no process left by a job")
    slurm.wait_for(lambda: not relay_processes(), 30, "the relay to stop")


def _state(slurm, exp_dir: Path, login_dir: Path) -> str:  # noqa: ANN001 (the slurm fixture)
    """The experiment's jobs, its trials in the store, and the last lines of every log on both sides."""
    from nni_manager.store import Store

    lines = [f"jobs: {slurm.jobs('nni_exp_SlurmLoginRestart1_')}"]
    try:
        store = Store.open_readonly(exp_dir)
        lines.append(f"trials: {[(t.id, t.status.value, t.environment_id, t.message) for t in store.trials()]}")
        store.close()
    except Exception as e:  # what there is to see, whatever is missing
        lines.append(f"store: {e!r}")
    for where in (exp_dir, login_dir):
        for log in sorted(where.rglob("*.log")) if where.is_dir() else []:
            lines.append(f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    return "\n".join(lines)
