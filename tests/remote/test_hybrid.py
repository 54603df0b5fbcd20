"""Hybrid mode for real: a local agent and an SSH agent (real sshd on 127.0.0.1) in one pool;
placementConstraint Device and GPUNumber across them; trial files and trial.log fetched from
the SSH agent over its stream, and shown by `nni-manager logs`."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nni_manager.backends.remote.config import RemoteConfig
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.config.hybrid import HybridOptions
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobApplicationForm
from tests.support.manager.helpers import TRIAL, form, until, wait_status
from tests.support.remote.fixtures import processes_with
from tests.support.bounded import run_bounded

pytestmark = pytest.mark.ssh
ROOT = Path(__file__).resolve().parents[2]
# TRIAL, plus a trial.log as NNI's SDK writes one, and where it ran
LOGGING_TRIAL = TRIAL.replace('print("trial"', '(out / "trial.log").write_text("log from trial\\n")\n'
                              '(out / "where.txt").write_text(os.environ["NNI_PLATFORM"] + " " + os.getcwd())\n'
                              'print("trial"', 1)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="nh", dir="/tmp"))  # the hub's Unix socket path must stay short
    d.chmod(0o755)  # the SSH user's trial waits for the release file in it
    yield d
    shutil.rmtree(d, ignore_errors=True)


def constrained(seq: int, kind: str, gpus: list[object], **params: object) -> TrialJobApplicationForm:
    f = form(seq, **params)
    f.placement_constraint = {"type": kind, "gpus": gpus}
    return f


def test_local_plus_remote_one_pool_constraints_and_files(plain_sshd, short_dir):  # type: ignore[no-untyped-def]
    assert "trial.log" in LOGGING_TRIAL
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(LOGGING_TRIAL)
    release = short_dir / "go"
    two_gpus = {"NNI_AGENT_ARTIFICIAL_GPUS": "2"}
    cfg = ExperimentConfig(
        trial_command="python3 trial.py",  # each part's Python: the test's (PATH) here, pythonPath's there
        trial_code_directory=code,
        trial_concurrency=4,
        trial_gpu_number=1,
        trial_grace_period=1.0,
        experiment_working_directory=short_dir / "exps",
        training_service=TrainingServiceConfig(platform="hybrid", options=HybridOptions([
            TrainingServiceConfig(platform="local", use_active_gpu=False, agent_env=two_gpus),
            TrainingServiceConfig(platform="remote", options=RemoteConfig([plain_sshd.machine]), agent_env=two_gpus,
                                  reconnect_window=30),
        ])),
    )

    async def body() -> tuple[Path, str, str]:
        async with create_training_service(cfg) as ts:
            assert ts.platform == "hybrid"
            # one pool: four 1-GPU trials fill both machines' two GPUs
            jobs = [await ts.submit_trial_job(form(i, action="sleep", release=str(release), x=i)) for i in range(4)]
            running = [await wait_status(ts, j.id, "RUNNING", timeout=60) for j in jobs]
            remote_id = next(a["agent_id"] for a in ts.agents() if a["agent_id"] != "local")
            assert sorted(d.agent_id for d in running) == sorted(["local", "local", remote_id, remote_id])
            release.touch()
            for j in jobs:
                await wait_status(ts, j.id, "SUCCEEDED", timeout=30)

            on_remote = await ts.submit_trial_job(constrained(10, "Device", [["127.0.0.1", 1]]))
            on_local = await ts.submit_trial_job(constrained(11, "Device", [["local", 0]]))
            both = await ts.submit_trial_job(constrained(12, "GPUNumber", [2]))
            no_host = await ts.submit_trial_job(constrained(13, "Device", [["nohost", 0]]))
            no_gpu = await ts.submit_trial_job(constrained(14, "Device", [["127.0.0.1", 7]]))
            done = {j.id: await wait_status(ts, j.id, "SUCCEEDED", timeout=30) for j in (on_remote, on_local, both)}
            assert (done[on_remote.id].agent_id, done[on_remote.id].gpu_indices) == (remote_id, [1])
            assert (done[on_local.id].agent_id, done[on_local.id].gpu_indices) == ("local", [0])
            assert done[both.id].gpu_indices == [0, 1]
            failed = await wait_status(ts, no_host.id, "FAILED")
            assert "'nohost'" in failed.message and "127.0.0.1" in failed.message
            failed = await wait_status(ts, no_gpu.id, "FAILED")
            assert "GPU 7" in failed.message and "GPUs 0-1" in failed.message

            # files of the SSH agent's trial, over its stream
            assert await ts.get_trial_file(on_remote.id, "cuda.txt") == "1"
            # each trial sees its own agent's platform; only the SSH agent gets the code shipped
            platform, cwd = (await ts.get_trial_file(on_remote.id, "where.txt")).split(" ", 1)
            assert platform == "remote" and Path(cwd) != code
            platform, cwd = (await ts.get_trial_file(on_local.id, "where.txt")).split(" ", 1)
            assert platform == "local" and Path(cwd) == code
            assert await ts.get_trial_file(on_remote.id, "trial.log") == "log from trial\n"
            written = await ts.download_trial_directory(on_remote.id, short_dir / "dl")
            assert {"cuda.txt", "trial.log", "parameter.cfg"} <= {p.name for p in written}
            collected = ts.experiment_dir / "trials" / on_remote.id / "trial.log"
            await until(collected.is_file, 20, "trial.log streamed from the SSH agent")
            assert collected.read_text() == "log from trial\n"
            return ts.experiment_dir, on_remote.id, done[on_remote.id].working_directory

    exp_dir, trial_id, remote_dir = run_bounded(body(), 180)
    shutil.rmtree(remote_dir)  # as if on another machine: `logs` can only use what was streamed
    out = subprocess.run([sys.executable, "-m", "nni_manager", "logs", str(exp_dir), trial_id],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "==> trial.log <==\nlog from trial" in out.stdout and "params" in out.stdout
    experiment_id = exp_dir.name
    assert processes_with(f"NNI_AGENT_REMOTE_RUN={experiment_id}/".encode()) == []  # clean_up stopped both parts
    assert processes_with(f"NNI_EXP_ID={experiment_id}".encode()) == []
    shutil.rmtree(plain_sshd.home / "nni-experiments" / experiment_id, ignore_errors=True)
    shutil.rmtree(plain_sshd.home / ".nni-agent" / "run" / experiment_id, ignore_errors=True)
