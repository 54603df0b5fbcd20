"""Secret `agentEnv` values (by the one rule, `config.is_secret`: `WANDB_API_KEY`, `HF_TOKEN`, ...)
never travel in clear: not in Slurm's batch.sh, a pod spec, an OpenPAI/DLTS/AML/DLC job command or the
remote bootstrap's command line. What each platform would submit (its dry run) holds the other
variables but not the secret; the trials still get it, over the agent's authenticated stream, and
the agent process's own environment never holds it."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, wait_status
from tests.support.dry_run import ALGORITHM, dry_run_env
from tests.support.security.platforms import PLATFORMS, SECRET
from tests.support.bounded import run_bounded

AGENT_ENV = {"WANDB_API_KEY": SECRET, "CUDA_HOME": "/opt/cuda-kept"}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_what_is_submitted_holds_no_secret_agent_env(platform: str, tmp_path: Path) -> None:
    config = tmp_path / f"{platform}.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python3 t.py", "trialCodeDirectory": str(tmp_path), "trialConcurrency": 1,
        **ALGORITHM, "trialGpuNumber": 0, "trainingService": {"platform": platform, "agentEnv": AGENT_ENV, **PLATFORMS[platform]}}))
    out = subprocess.run([sys.executable, "-m", "nni_manager", "run", "--dry-run", str(config)],
                         capture_output=True, text=True, env=dry_run_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "/opt/cuda-kept" in out.stdout  # the other variables are still submitted: the search means something
    assert SECRET not in out.stdout and SECRET not in out.stderr


def test_trials_get_the_secret_over_the_stream_and_the_agent_never_holds_it(short_dir: Path) -> None:
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(
        "import hashlib, os\n"
        "print('key', hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest())\n"
        "print('cuda', os.environ['CUDA_HOME'])\n")
    cfg = ExperimentConfig(trial_command=f"{sys.executable} trial.py", trial_code_directory=code,
                           experiment_working_directory=short_dir / "exps",
                           training_service=TrainingServiceConfig(platform="local", agent_env=dict(AGENT_ENV)))

    async def body() -> tuple[str, list[bytes]]:
        async with create_training_service(cfg) as ts:
            done = await wait_status(ts, (await ts.submit_trial_job(form(0))).id, "SUCCEEDED", "FAILED")
            assert done.status.value == "SUCCEEDED", done.message
            agents = [p for p in psutil.process_iter(["cmdline"])
                      if "nni_agent" in " ".join(p.info["cmdline"] or []) and str(ts.experiment_dir) in
                      " ".join(p.info["cmdline"] or [])]
            assert agents, "the local agent process was not found"
            environs = [Path(f"/proc/{p.pid}/environ").read_bytes() for p in agents]
            return str(await ts.get_trial_file(done.id, "trial.stdout")), environs

    stdout, environs = run_bounded(body(), 60)
    assert f"key {hashlib.sha256(SECRET.encode()).hexdigest()}" in stdout.splitlines()
    assert "cuda /opt/cuda-kept" in stdout.splitlines()
    assert all(SECRET.encode() not in e and b"CUDA_HOME=/opt/cuda-kept" in e for e in environs)
