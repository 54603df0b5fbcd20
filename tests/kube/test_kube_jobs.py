"""The Kubernetes platforms on the job pattern (jobs.py), without a cluster: the pod watch's ends
go through jobs.py's member and job ends, the listing's view carries each member's own end, and
the fields every job platform takes are read (the emulator tests run the same code end to end:
test_pods_platform.py, test_operator_platforms.py, test_restart.py, test_cleanup.py)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.jobs import Job, JobBackend
from nni_manager.backends.kubernetes.adl import AdlBackend
from nni_manager.backends.kubernetes.config import KubeflowConfig, RoleConfig
from nni_manager.backends.kubernetes.frameworkcontroller import FrameworkControllerBackend
from nni_manager.backends.kubernetes.kubeflow import KubeflowBackend
from nni_manager.backends.kubernetes.pods import PodsBackend
from nni_manager.loader import load_config
from tests.support.kube.backend_ctx import Ctx


def _tfjob_backend() -> tuple[KubeflowBackend, Ctx, Job, list[str]]:
    from nni_manager.config import ExperimentConfig, TrainingServiceConfig

    opts = KubeflowConfig(operator="tf-operator", roles=[RoleConfig("worker", replicas=2, command="python3 t.py")])
    config = ExperimentConfig(trial_command="", trial_code_directory=Path("."),
                              training_service=TrainingServiceConfig(platform="kubeflow", options=opts))
    backend = KubeflowBackend(config)
    backend.experiment_id = "exp1"
    ctx = Ctx()
    backend.ctx = ctx  # type: ignore[assignment]
    forgotten: list[str] = []

    async def forget(job: Job) -> None:  # what would delete the TFJob
        forgotten.append(job.name)

    backend.forget = forget  # type: ignore[method-assign]
    name = backend.object_name("env1")
    job = Job("env1", name, [n for n, _, _ in backend.member_names("env1")], submitted=True)
    backend.jobs["env1"] = job
    return backend, ctx, job, forgotten


def _pod(name: str, phase: str, exit_code: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "tensorflow", "state": {"terminated": {"exitCode": exit_code,
                                                                                       "reason": "Error"}}}]
    return {"metadata": {"name": name}, "status": status}


@pytest.mark.parametrize("cls", [PodsBackend, KubeflowBackend, FrameworkControllerBackend, AdlBackend])
def test_the_four_platforms_are_job_backends(cls: type) -> None:
    assert issubclass(cls, JobBackend)


def test_a_failed_replica_fails_its_member_and_the_last_pod_ends_the_job_through_jobs_py() -> None:
    async def run() -> None:
        backend, ctx, job, forgotten = _tfjob_backend()
        assert job.name == "nniexpexp1env1" and backend.job_name("env1", None) == job.name
        w0, w1 = job.members
        backend._tracker.pod_event("MODIFIED", _pod(w0, "Running"))
        assert ctx.status[w0] == f"waiting for the agent in pod {w0} to connect" and job.said[w0] == ctx.status[w0]
        backend._tracker.pod_event("MODIFIED", _pod(w0, "Failed", exit_code=2))
        await asyncio.sleep(0)
        assert ctx.failed == [(w0, f"pod {w0} container tensorflow Error (exit 2)", True)]
        assert w0 in job.ended and not job.done and not forgotten  # its job runs on
        backend._tracker.pod_event("MODIFIED", _pod(w0, "Failed", exit_code=2))  # told once
        backend._tracker.pod_event("MODIFIED", _pod(w1, "Succeeded"))  # the last member: the job ends
        for _ in range(3):
            await asyncio.sleep(0)
        assert ctx.failed[1:] == [(w1, f"pod {w1} ended (Succeeded)", False)]
        assert job.done and forgotten == [job.name]  # jobs.py's _ended: its objects go
    asyncio.run(run())


def test_the_listing_carries_each_members_own_end_into_the_jobs_end() -> None:
    async def run() -> None:
        backend, ctx, job, forgotten = _tfjob_backend()
        w0, w1 = job.members
        backend._tracker.pod_states[w0], backend._tracker.last_words[w0] = "oom", f"pod {w0} OOMKilled"
        tfjob = {"metadata": {"name": job.name, "labels": {"envId": "env1"}}, "status": {"conditions": [
            {"type": "Running", "status": "False"}, {"type": "Failed", "status": "True"}]}}
        view = backend._view(tfjob)
        assert view.phase == "failed" and view.members[w0] == ("failed", f"pod {w0} OOMKilled")
        await backend._ended(job, view)
        assert ctx.failed == [(w0, f"pod {w0} OOMKilled", True), (w1, f"TFJob {job.name} is Failed", True)]
        await backend._ended(job, view)  # once only
        assert len(ctx.failed) == 2 and forgotten == [job.name]
    asyncio.run(run())


def test_poll_interval_and_agent_connect_timeout_are_read(tmp_path: Path) -> None:
    cfg = load_config({"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path),
                       "trainingService": {"platform": "kubernetes", "dockerImage": "python:3.11",
                                           "pollInterval": "10s", "agentConnectTimeout": "5m"}})
    opts = cfg.training_service.options
    assert (opts.poll_interval, opts.connect_timeout) == (10.0, 300.0)
    backend = PodsBackend(cfg)
    assert (backend.poll_interval, backend.connect_timeout) == (10.0, 300.0)
