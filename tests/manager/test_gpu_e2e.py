"""GPU placement through the real agent with artificial GPUs (NNI_AGENT_ARTIFICIAL_GPUS)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from nni_manager.config import ExperimentConfig
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.manager.helpers import form, until, wait_status
from tests.support.bounded import run_bounded


def run(coro: Any) -> Any:
    return run_bounded(coro, 90)


def cuda(ts: Any, trial_id: str) -> str:
    return (Path(ts.trials.by_id[trial_id].working_directory) / "cuda.txt").read_text()


def test_fractional_sharing_then_release(make_config: Callable[..., ExperimentConfig], short_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNI_AGENT_ARTIFICIAL_GPUS", "2")
    release = short_dir / "go"

    async def body() -> None:
        cfg = make_config(trial_gpu_number=1, platform_fields={"use_active_gpu": False, "max_trial_number_per_gpu": 2})
        async with create_training_service(cfg) as ts:
            jobs = [await ts.submit_trial_job(form(i, action="sleep", release=str(release))) for i in range(5)]
            for j in jobs[:4]:
                await wait_status(ts, j.id, "RUNNING")
            await until(lambda: all((Path(ts.trials.by_id[j.id].working_directory) / "cuda.txt").exists()
                                    for j in jobs[:4]), what="cuda.txt files")
            assert sorted(cuda(ts, j.id) for j in jobs[:4]) == ["0", "0", "1", "1"]
            waiting = await ts.get_trial_job(jobs[4].id)
            assert waiting.status == TrialJobStatus.WAITING
            owners = ", ".join(sorted(j.id for j in jobs[:4]))
            assert waiting.message == f"waiting for a GPU: all 2 GPUs of local are taken by trials {owners}"
            await until(lambda: ts.trial_resources(jobs[0].id) is not None, what="resource telemetry")
            assert ts.trial_resources(jobs[0].id).rss_bytes > 0
            release.touch()
            await wait_status(ts, jobs[4].id, "SUCCEEDED")

    run(body())


def test_all_gpus_gpu_indices_and_impossible(make_config: Callable[..., ExperimentConfig],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNI_AGENT_ARTIFICIAL_GPUS", "3")

    async def body() -> None:
        cfg = make_config(trial_gpu_number=2, platform_fields={"use_active_gpu": True, "gpu_indices": [1, 2]})
        async with create_training_service(cfg) as ts:
            ok = await ts.submit_trial_job(form(0))  # both GPUs gpuIndices allows
            big = await ts.submit_trial_job(form(1))
            big_form = form(2)
            big_form.placement_constraint = {"type": "GPUNumber", "gpus": [3]}
            too_big = await ts.submit_trial_job(big_form)
            await wait_status(ts, ok.id, "SUCCEEDED")
            assert cuda(ts, ok.id) == "1,2"
            await wait_status(ts, big.id, "SUCCEEDED")
            d = await wait_status(ts, too_big.id, "FAILED")
            assert d.message.startswith("the trial needs 3 GPUs but no agent has that many")
            assert "local has 2 usable GPUs (gpuIndices [1, 2])" in d.message
            assert d.start_time is None

    run(body())


def test_active_gpu_waits_with_reason(make_config: Callable[..., ExperimentConfig],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNI_AGENT_ARTIFICIAL_GPUS", "2")
    monkeypatch.setenv("NNI_AGENT_ARTIFICIAL_ACTIVE_GPUS", "1")

    async def body() -> None:
        cfg = make_config(trial_gpu_number=1, platform_fields={"use_active_gpu": False, "gpu_indices": [1]})
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0))
            expected = "waiting: GPU 1 of local is active (used by a process outside this experiment) and useActiveGpu is false"
            await until(lambda: ts.trials.by_id[job.id].message == expected, what="active-GPU message")
            assert ts.trials.by_id[job.id].status == TrialJobStatus.WAITING
            assert ts.agent_gpus()["local"].provider == "artificial"
        cfg = make_config(trial_gpu_number=1, platform_fields={"use_active_gpu": True, "gpu_indices": [1]})
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0))
            await wait_status(ts, job.id, "SUCCEEDED")
            assert cuda(ts, job.id) == "1"

    run(body())


def test_zero_gpus_and_no_gpu_provider(make_config: Callable[..., ExperimentConfig],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NNI_AGENT_ARTIFICIAL_GPUS", raising=False)

    async def body() -> None:
        async with create_training_service(make_config(trial_gpu_number=0)) as ts:
            job = await ts.submit_trial_job(form(0))
            await wait_status(ts, job.id, "SUCCEEDED")
            assert cuda(ts, job.id) == ""
            gpu_form = form(1)
            gpu_form.placement_constraint = {"type": "GPUNumber", "gpus": [1]}
            job = await ts.submit_trial_job(gpu_form)
            d = await wait_status(ts, job.id, "FAILED")
            assert "local has no GPUs: " in d.message and len(d.message) > len("... local has no GPUs: ") + 10

    run(body())
