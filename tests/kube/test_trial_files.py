"""Trial files from an agent in a pod (the Kubernetes emulator): fetched over the agent's TLS
stream, as for any platform; once a one-trial pod is gone, the streamed logs still answer."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nni_manager.errors import AgentUnavailableError
from nni_manager.service import create_training_service
from tests.support.kube.fixtures import KubeNamespace
from tests.support.kube.harness import config, pods_service
from tests.support.manager.helpers import form, until, wait_status
from tests.support.bounded import run_bounded

T = 60.0


@pytest.fixture
def kube(kube_ns: KubeNamespace) -> KubeNamespace:
    """This module's tests share the session's emulator, each in a namespace of its own."""
    return kube_ns


def run(coro: Any) -> Any:
    return run_bounded(coro, 150)


def test_files_from_a_pod_agent(kube, short_dir: Path) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with create_training_service(config(kube, short_dir, pods_service())) as ts:  # reuse: the pod stays
            job = await ts.submit_trial_job(form(0, x=3, steps=1))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=T)
            assert b'"x": 3' in await ts.get_trial_file(job.id, "parameter.cfg")  # .cfg: bytes, as NNI
            assert "params" in await ts.get_trial_file(job.id, "stdout")
            written = await ts.download_trial_directory(job.id, short_dir / "dl")
            assert {"parameter.cfg", "cuda.txt", "trial.stdout"} <= {p.name for p in written}

    run(main())


def test_one_trial_pod_gone_streamed_logs_answer(kube, short_dir: Path) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        cfg = config(kube, short_dir, pods_service(reuseMode=False))
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=4, steps=1))
            done = await wait_status(ts, job.id, "SUCCEEDED", timeout=T)
            await until(lambda: not ts.agent_connected(done.agent_id), T, "the one-trial agent to exit")
            assert "params" in await ts.get_trial_file(job.id, "stdout")  # the manager's streamed copy
            with pytest.raises(AgentUnavailableError, match="not connected"):
                await ts.get_trial_file(job.id, "parameter.cfg")

    run(main())
