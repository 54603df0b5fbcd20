"""Credentials as a manager running inside the cluster has them: no kubeconfig, the pod's
service account (KUBERNETES_SERVICE_HOST + the mounted token and CA), as NNI did."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nni_manager.config import load_config
from nni_manager.service import create_training_service
from tests.manager.helpers import TRIAL, form, wait_status


def test_in_cluster_service_account(kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nni_manager.backends.kubernetes import client

    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(kube.token)
    (account / "ca.crt").write_bytes((kube.state_dir / "ca.crt").read_bytes())
    (account / "namespace").write_text("default")
    monkeypatch.setattr(client, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(kube.port))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))  # must not be needed
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = load_config({"trialCommand": "python trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 1,
                          "trialGracePeriod": 2, "experimentWorkingDirectory": str(tmp_path / "exps"),
                          "trainingService": {"platform": "kubernetes", "dockerImage": "nni-test/python:3.11",
                                              "memorySize": 256, "reuseMode": False}})

    async def body() -> None:
        async with create_training_service(config) as ts:
            job = await ts.submit_trial_job(form(0, x=7))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=90)

    asyncio.run(body())
    pods = kube.core().list_namespaced_pod("default", label_selector="app=nni-kubernetes-trial").items
    assert pods == []  # the trial's pod was deleted after it ran


def test_plain_tcp_hub_only_when_asked_and_with_a_warning(kube, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.kube.harness import config, pods_service

    cfg = config(kube, tmp_path, pods_service(hubTls=False, reuseMode=False))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1))
            pod = None
            while pod is None:  # the pod exists while the trial runs
                pods = kube.core().list_namespaced_pod("default", label_selector=f"trialId={job.id}").items
                pod = pods[0] if pods else None
                await asyncio.sleep(0.05)
            args = pod.spec.containers[0].command
            secret = kube.core().read_namespaced_secret(f"{pod.metadata.name}-nni", "default")
            assert "--ca-file" not in args and "ca.crt" not in secret.data  # no TLS material: plain TCP
            await wait_status(ts, job.id, "SUCCEEDED", timeout=90)

    with caplog.at_level("WARNING"):
        asyncio.run(body())
    assert any("PLAIN TEXT" in r.getMessage() for r in caplog.records)
