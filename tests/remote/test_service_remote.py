"""The real TrainingService over the remote backend: three SSH hosts in network
namespaces, GPU placement across them, a link killed mid-experiment, clean clean_up."""
from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nni_manager.backends.remote.config import RemoteConfig
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobMetric
from tests.support.manager.helpers import TRIAL, form, until, wait_status
from tests.support.remote.fixtures import processes_with
from tests.support.bounded import run_bounded

pytestmark = pytest.mark.ssh


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="nr", dir="/tmp"))  # the hub's Unix socket path must stay short
    d.chmod(0o755)  # the SSH user's trials wait for the release file in it
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_three_hosts_gpu_placement_link_drop_metrics_once_and_clean_up(netns_hosts, short_dir):
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    release = short_dir / "go"
    cfg = ExperimentConfig(
        trial_command="python3 trial.py",  # pythonPath comes first on PATH, like NNI
        trial_code_directory=code,
        trial_concurrency=3,
        trial_gpu_number=1,
        trial_grace_period=1.0,
        experiment_working_directory=short_dir / "exps",
        training_service=TrainingServiceConfig(
            platform="remote", options=RemoteConfig([h.machine for h in netns_hosts]),
            agent_env={"NNI_AGENT_ARTIFICIAL_GPUS": "1"}, reconnect_window=30),
    )
    metrics: list[TrialJobMetric] = []

    async def body() -> str:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(metrics.append)
            jobs = [await ts.submit_trial_job(form(i, action="sleep", release=str(release), x=i)) for i in range(4)]
            running = [await wait_status(ts, j.id, "RUNNING", timeout=30) for j in jobs[:3]]
            assert len({d.agent_id for d in running}) == 3  # one GPU per host: one trial per host
            waiting = await ts.get_trial_job(jobs[3].id)
            assert waiting.status.value == "WAITING" and "GPU" in waiting.message
            await until(lambda: len(metrics) >= 9, 30, "3 intermediate metrics per running trial")
            assert netns_hosts[0].kill_connections() >= 1  # drop one host's SSH link mid-experiment
            await asyncio.sleep(0.3)
            release.touch()
            for j in jobs:
                await wait_status(ts, j.id, "SUCCEEDED", timeout=40)
            experiment_id = ts.experiment_id
        return experiment_id

    experiment_id = run_bounded(body(), 150)
    by_trial: dict[str, list[object]] = {}
    for m in metrics:
        by_trial.setdefault(m.id, []).append(json.loads(json.loads(m.data)["value"]))
    assert len(by_trial) == 4
    assert sorted(by_trial.values()) == sorted([[0, 1, 2, x] for x in range(4)])  # exactly once each
    assert processes_with(f"NNI_AGENT_REMOTE_RUN={experiment_id}/".encode()) == []
    assert processes_with(f"NNI_EXP_ID={experiment_id}".encode()) == []
    shutil.rmtree(netns_hosts[0].home / "nni-experiments" / experiment_id, ignore_errors=True)
    shutil.rmtree(netns_hosts[0].home / ".nni-agent" / "run" / experiment_id, ignore_errors=True)
