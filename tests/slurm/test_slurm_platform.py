"""`platform: slurm` end to end on a real 2-node Slurm cluster on loopback (tests/support/slurm/fixtures.py):
the backend's real `sbatch` / `squeue` / `scancel` calls, real agents started by `srun` in real
jobs dialling the manager's TLS hub on 127.0.0.1. Slurm's own state paths, an impossible request, a 2-node trial, reuse mode, cleanup, the dry run and config errors. (What every
job platform does alike, a failed or cancelled trial among them: tests/platforms.)"""
from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.registry import backend_class
from nni_manager.backends.slurm.backend import SlurmError
from nni_manager.config import ConfigError
from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, message_with, release, sleeper, wait_status
from tests.support.slurm.experiments import T, assert_clean, config, run


# ----------------------------------------------------------------------------- every state path

def test_state_paths_one_job_per_trial(slurm, base: Path) -> None:
    """reuseMode false: one job per trial. Completed (metrics exactly once), cleanup, secrets only in
    0600 files. (Failed, cancelled by us, PENDING with Slurm's reason while both nodes are busy,
    `scancel` by someone else, every job platform alike:
    tests/platforms/test_job_{failure,cancel,waiting,contract}.py.)"""
    cfg = config(base, {"reuseMode": False})
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            exp = ts.experiment_id
            store.append(ts.trials.store)
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            ok = await ts.submit_trial_job(form(0, x=7, steps=3))
            d = await wait_status(ts, ok.id, "SUCCEEDED", timeout=T)
            assert d.end_time and d.start_time, d
            # every metric of the finished trial, each once (PERIODICAL 0, 1, 2 then FINAL 7)
            got = [json.loads(m) for m in metrics[ok.id]]
            assert [(g["type"], g["sequence"], json.loads(g["value"])) for g in got] == [
                ("PERIODICAL", 0, 0), ("PERIODICAL", 1, 1), ("PERIODICAL", 2, 2), ("FINAL", 0, 7)], got

            jobs = slurm.jobs(f"nni_exp_{exp}_trial_")
            assert len(jobs) == 1, jobs
            # secrets: files of mode 0600 in a 0700 directory, never in the script
            job_dir = ts.experiment_dir / "slurm" / f"nni_exp_{exp}_trial_{ok.id}"
            assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
            assert stat.S_IMODE((job_dir / "ca.crt").stat().st_mode) == 0o600
            script = (job_dir / "batch.sh").read_text()
            assert "--single-trial" in script and "--token-file" in script
            assert not any(tok in script for tok in tokens())
            return exp

    tokens = lambda: [a["token"] for a in store[0].agents()]  # noqa: E731
    store: list[Any] = []
    exp = run(main())
    assert all(len(ms) == len(set(ms)) for ms in metrics.values()), metrics  # exactly once, also late ones
    assert_clean(slurm, exp)
    # after clean_up no token is left in any file of the job directories
    from nni_manager.store import Store
    exp_dir = base / "exps" / exp
    known = [a["token"] for a in Store.open_readonly(exp_dir).agents()]
    assert len(known) == 1 and all(known)
    files = [f for f in (exp_dir / "slurm").rglob("*") if f.is_file()]
    assert files and not any(tok in f.read_text(errors="replace") for f in files for tok in known), files


def test_impossible_request_fails_at_start_in_slurms_words(slurm, base: Path) -> None:
    cfg = config(base, {"trialCpuNumber": 64})

    async def main() -> None:
        async with create_training_service(cfg):
            pass

    with pytest.raises(SlurmError) as err:
        run(main())
    assert "Requested node configuration is not available" in str(err.value), err.value
    assert "64 CPU(s)" in str(err.value)
    assert not slurm.live_jobs("nni_exp_")


# ----------------------------------------------------------------------------- several nodes, reuse

def test_two_node_trial_sees_slurm_and_logs_per_replica(slurm, base: Path) -> None:
    # pythonPath: the job's Python runs the manager's own agent code from its wheel; the trials get only
    # its stdlib trial API (nni_agent.trial_path), never the agent's path
    cfg = config(base, {"nodes": 2, "reuseMode": False, "pythonPath": sys.executable},
                 trialCommand=f"{sys.executable} seen.py")

    async def main() -> tuple[str, dict[str, dict[str, Any]]]:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            assert len(d.agents) == 2, d
            rep = ts.experiment_dir / "trials" / t.id / "replicas"
            views = {}
            for r in sorted(p.name for p in rep.iterdir()):
                line = next(ln for ln in (rep / r / "trial.stdout").read_text().splitlines() if ln.startswith("SEEN "))
                views[r] = json.loads(line[5:])
            return ts.experiment_id, views

    exp, views = run(main())
    env = "trial-"
    assert len(views) == 2 and all(r.startswith(env) for r in views), views
    by_proc = {v["SLURM_PROCID"]: v for v in views.values()}
    assert set(by_proc) == {"0", "1"}
    assert {v["SLURMD_NODENAME"] for v in views.values()} == {"n1", "n2"}
    assert {v["SLURM_NODEID"] for v in views.values()} == {"0", "1"}
    assert all(v["SLURM_NNODES"] == "2" and v["SLURM_JOB_NODELIST"] == "n[1-2]" for v in views.values())
    assert len({v["SLURM_JOB_ID"] for v in views.values()}) == 1  # one allocation
    assert all("/.trial-api-" in v["agent"] for v in views.values()), views
    for r, v in views.items():  # replica <env>-<i> is the agent started as SLURM_PROCID i
        assert r.endswith("-" + v["SLURM_PROCID"])
    assert_clean(slurm, exp)


def test_reuse_mode_runs_ten_trials_on_two_allocations(slurm, base: Path) -> None:
    cfg = config(base, {}, trialConcurrency=2)
    n = 10

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(n)]
            for t in trials:
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            envs = [(await ts.get_trial_job(t.id)).environment_id for t in trials]
            assert set(envs) == {"env1", "env2"}, envs  # 10 trials, each on one of the two allocations
            assert all(envs.count(e) >= 2 for e in set(envs)), envs  # both ran trial after trial
            jobs = slurm.jobs(f"nni_exp_{ts.experiment_id}_")
            assert sorted(j["name"] for j in jobs) == [f"nni_exp_{ts.experiment_id}_env_1",
                                                       f"nni_exp_{ts.experiment_id}_env_2"], jobs
            assert all(j["state"] == "RUNNING" for j in jobs), jobs  # allocations kept for the next trials
            assert slurm.job_processes()  # the agents, which clean_up must end
            return ts.experiment_id

    exp = run(main())
    assert_clean(slurm, exp)  # clean_up cancelled both allocations


def test_preempted_or_cancelled_allocation_is_replaced_and_its_trial_reported(slurm, base: Path) -> None:
    """reuse mode: an allocation `scancel`ed by someone else, then both allocations PREEMPTED for real (a
    job in partition `high`, PreemptMode CANCEL): each running trial ends SYS_CANCELED in Slurm's words
    (never silently lost), and new allocations take over the trials that still wait."""
    cfg = config(base, {}, trialConcurrency=2)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            exp = ts.experiment_id
            a = await ts.submit_trial_job(sleeper(base, 0, "a"))
            b = await ts.submit_trial_job(sleeper(base, 1, "b"))
            await wait_status(ts, a.id, "RUNNING", timeout=T)
            await wait_status(ts, b.id, "RUNNING", timeout=T)
            env_a = (await ts.get_trial_job(a.id)).environment_id

            # someone scancels the allocation running a: a is reported, a new allocation runs c
            job = slurm.jobs(f"nni_exp_{exp}_env_{env_a.removeprefix('env')}")[0]
            slurm.run("scancel", job["id"])
            d = await wait_status(ts, a.id, "SYS_CANCELED", timeout=T)
            msg = await message_with(ts, a.id, "CANCELLED", job["id"])
            c = await ts.submit_trial_job(form(2, x=5, steps=1))
            d = await wait_status(ts, c.id, "SUCCEEDED", timeout=T)
            assert d.environment_id not in ("env1", "env2"), d  # a replacement allocation
            assert (await ts.get_trial_job(b.id)).status.value == "RUNNING"

            # a higher-tier job preempts both allocations: the running trial b is reported PREEMPTED
            live = {j["id"] for j in slurm.live_jobs(f"nni_exp_{exp}_")}
            assert len(live) == 2, live
            high = slurm.run("sbatch", "--parsable", "-p", "high", "-N", "2", "--mem=100M", "-J", "preemptor",
                             "-o", "/dev/null", "--wrap", "sleep 600").stdout.strip().split(";")[0]
            try:
                await wait_status(ts, b.id, "SYS_CANCELED", timeout=T)
                msg = await message_with(ts, b.id, "PREEMPTED")
                assert "Slurm job" in msg, msg
                # b's allocation is reported first; the other may still be COMPLETING its preemption
                def states() -> dict[str, str]:
                    return {j["id"]: j["state"] for j in slurm.jobs(f"nni_exp_{exp}_")}
                await asyncio.to_thread(slurm.wait_for, lambda: all(states()[i] != "COMPLETING" for i in live), T,
                                        "both preempted allocations to end")
                assert all(states()[i] == "PREEMPTED" for i in live), states()
                # trials keep coming: they wait (the preemptor holds both nodes), then run on new allocations
                e = await ts.submit_trial_job(form(3, x=9, steps=1))
                await message_with(ts, e.id, "PENDING")
            finally:
                slurm.run("scancel", high)
            d = await wait_status(ts, e.id, "SUCCEEDED", timeout=T)
            names = {j["name"] for j in slurm.jobs(f"nni_exp_{exp}_")}
            assert f"nni_exp_{exp}_env_{d.environment_id.removeprefix('env')}" in names
            assert d.environment_id not in ("env1", "env2", (await ts.get_trial_job(c.id)).environment_id)
            # every trial has an end, none is lost
            statuses = {t: (await ts.get_trial_job(t)).status.value for t in (a.id, b.id, c.id, e.id)}
            assert statuses == {a.id: "SYS_CANCELED", b.id: "SYS_CANCELED", c.id: "SUCCEEDED", e.id: "SUCCEEDED"}
            return exp

    exp = run(main())
    assert_clean(slurm, exp)


def test_slurmctld_restart_loses_nothing(slurm, base: Path) -> None:
    """slurmctld goes down and comes back mid-experiment: squeue fails meanwhile (no trial is failed
    for it), the running trials finish, and the allocations keep serving new trials."""
    cfg = config(base, {}, trialConcurrency=2)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            a = await ts.submit_trial_job(sleeper(base, 0, "a"))
            b = await ts.submit_trial_job(sleeper(base, 1, "b"))
            await wait_status(ts, a.id, "RUNNING", timeout=T)
            await wait_status(ts, b.id, "RUNNING", timeout=T)
            await asyncio.to_thread(slurm.restart_controller)
            await asyncio.sleep(1.0)  # a few polls against the restarted controller; not a timing assertion
            release(base, "a")
            release(base, "b")
            for t in (a, b):
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            c = await ts.submit_trial_job(form(2, x=3, steps=1))
            d = await wait_status(ts, c.id, "SUCCEEDED", timeout=T)
            assert d.environment_id in ("env1", "env2"), d
            assert len(slurm.jobs(f"nni_exp_{ts.experiment_id}_")) == 2  # no job was replaced
            return ts.experiment_id

    exp = run(main())
    assert_clean(slurm, exp)


def test_agent_that_cannot_start_fails_the_trial_with_its_words(slurm, base: Path) -> None:
    """pythonPath: the job's Python runs the manager's agent wheel; one without the agent's
    dependencies, when the manager has none to ship (tests/conftest.py: an empty wheel cache, no
    download, no agentWheelhouse), ends the job FAILED, and the trial says why (the boot step's line)."""
    cfg = config(base, {"pythonPath": "/usr/bin/python3", "reuseMode": False})
    if subprocess.run(["/usr/bin/python3", "-c", "import grpc"], capture_output=True).returncode == 0:
        pytest.skip("/usr/bin/python3 has grpc: it would start the agent")

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "FAILED" in d.message and "nni-agent: Python " in d.message, d.message
            assert "of the compute node cannot run the agent: grpcio is missing" in d.message, d.message
            assert "fix: /usr/bin/python3 -m pip install 'grpcio>=1.49.1,<2'" in d.message, d.message
            return ts.experiment_id

    exp = run(main())
    assert_clean(slurm, exp)


@pytest.mark.skipif(not os.environ.get("NNI_SLURM_SLOW"),
                    reason="takes 60-90 s (Slurm checks time limits every 30 s): set NNI_SLURM_SLOW=1 to run it")
def test_time_limit_ends_the_trial_with_timeout(slurm, base: Path) -> None:
    """timeLimit 1 (minute): Slurm ends the job (SIGTERM to it, then TIMEOUT); the trial ends with
    Slurm's word. Slurm checks time limits every 30 s, so this takes 60 to 90 s."""
    cfg = config(base, {"timeLimit": 1, "reuseMode": False})

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(sleeper(base, 0, "never"))
            await wait_status(ts, t.id, "RUNNING", timeout=T)
            d = await wait_status(ts, t.id, "FAILED", "SYS_CANCELED", timeout=150)
            msg = await message_with(ts, t.id, "TIMEOUT")
            assert d.status.value in ("FAILED", "SYS_CANCELED") and "Slurm job" in msg, msg
            return ts.experiment_id

    exp = run(main())
    assert_clean(slurm, exp)


# ----------------------------------------------------------------------------- without a cluster

def test_dry_run_shows_batch_script_and_no_secret(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"partition": "gpu", "account": "proj", "qos": "high", "timeLimit": "2h",
                            "trialCpuNumber": 4, "trialMemorySize": "8gb", "nodes": 2,
                            "sbatchOptions": ["--constraint=a100"], "prologue": ["module load cuda"],
                            "pythonPath": "/opt/py/bin/python3"}, trialGpuNumber=1)
    dry = backend_class("slurm")(cfg).render()
    text = str(dry)
    for needle in ("#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --qos=high", "#SBATCH --time=120",
                   "#SBATCH --cpus-per-task=4", "#SBATCH --mem=8192M", "#SBATCH --gres=gpu:1", "#SBATCH --nodes=2",
                   "#SBATCH --constraint=a100", "module load cuda", "srun --nodes=2", "for c in /opt/py/bin/python3; do",
                   "$SLURM_PROCID", "sbatch --parsable", "--ca-file"):
        assert needle in text, (needle, text)
    assert dry.requests[0]["job_name"].startswith("nni_exp_")
    assert '--token-file "$NNI_SLURM_JOB_DIR/$id.token"' in text  # a path, never the token


@pytest.mark.parametrize("field,value,problem", [
    ("loginNode", {"host": "x"}, "user"),  # an SSH machine spec, as in machineList
    ("sbatchOptions", ["--job-name=x"], "set by nni-manager"),
    ("sbatchOptions", ["constraint=a100"], "not an sbatch option"),
    ("timeLimit", "soon", "time limit"),
    ("nodes", 0, ">= 1"),
])
def test_config_errors_name_the_field(tmp_path: Path, field: str, value: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(tmp_path, {field: value})
    assert field in str(err.value) and problem in str(err.value), str(err.value)
