"""Credentials as a manager running inside the cluster has them: no kubeconfig, the pod's
service account (KUBERNETES_SERVICE_HOST + the mounted token and CA), as NNI did."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.manager.helpers import TRIAL, form, wait_status


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
    config = load_config({"nniManagerIp": "127.0.0.1",  # pods on the emulator's host network dial the hub
                          "trialCommand": "python trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 1,
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
    from tests.support.kube.harness import config, pods_service

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


# ----------------------------------------------------------------------------- cloud credentials
EXEC_PLUGIN = r'''
import json, os, ssl, sys, urllib.request
# An exec credential plugin (as `aws eks get-token`): asks the identity provider (here the
# emulator's token issuer) for a short-lived token and prints an ExecCredential.
req = urllib.request.Request(os.environ["EMU_URL"] + "/emulator/v1/tokens", method="POST",
                             data=json.dumps({"user": "exec-user", "lifetime": float(os.environ["LIFETIME"])}).encode(),
                             headers={"Authorization": "Bearer " + os.environ["EMU_ADMIN"]})
with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=os.environ["EMU_CA"])) as r:
    issued = json.loads(r.read())
with open(os.environ["RUNS"], "a") as f:
    f.write(issued["token"] + "\n")
status = {"token": issued["token"]}
if os.environ["WITH_EXPIRY"] == "1":
    status["expirationTimestamp"] = issued["expirationTimestamp"]
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", "status": status}))
'''


def exec_kubeconfig(kube, tmp_path: Path, lifetime: float, with_expiry: bool) -> tuple[Path, Path]:
    import sys

    import yaml

    plugin = tmp_path / "plugin.py"
    plugin.write_text(EXEC_PLUGIN)
    runs = tmp_path / "runs.txt"
    data = yaml.safe_load(kube.kubeconfig.read_text())
    env = {"EMU_URL": kube.url, "EMU_ADMIN": kube.token, "EMU_CA": str(kube.state_dir / "ca.crt"),
           "RUNS": str(runs), "LIFETIME": str(lifetime), "WITH_EXPIRY": "1" if with_expiry else "0"}
    data["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
                                         "args": [str(plugin)], "env": [{"name": k, "value": v} for k, v in env.items()],
                                         "interactiveMode": "Never"}}
    path = tmp_path / "exec-kubeconfig"
    path.write_text(yaml.safe_dump(data))
    return path, runs


@pytest.mark.parametrize("with_expiry", [True, False], ids=["expirationTimestamp", "401-then-refresh"])
def test_exec_plugin_tokens_are_renewed(kube, tmp_path: Path, with_expiry: bool) -> None:
    """EKS-style tokens: re-run when their expirationTimestamp passes; without one, the 401 after
    expiry reloads the credentials and the call is retried once."""
    from kubernetes.aio import client as aio

    from nni_manager.backends.kubernetes.client import load_client
    from nni_manager.backends.kubernetes.config import KubeConfig

    # a lifetime that outlasts the first call on a loaded machine (else that call itself renews it)
    path, runs = exec_kubeconfig(kube, tmp_path, lifetime=10, with_expiry=with_expiry)

    async def body() -> None:
        api = await load_client(KubeConfig(kube_config=path))
        try:
            core = aio.CoreV1Api(api)
            await core.list_namespaced_pod("default")
            assert len(runs.read_text().split()) == 1
            await asyncio.sleep(10.5)  # the token has expired: the emulator refuses it now
            first = runs.read_text().split()[0]
            from kubernetes.client.exceptions import ApiException
            with pytest.raises(ApiException) as refused:
                kube.core(first).list_namespaced_pod("default")
            assert refused.value.status == 401
            await core.list_namespaced_pod("default")  # renewed, not failed
            assert len(runs.read_text().split()) == 2
        finally:
            await api.close()

    asyncio.run(body())


def test_experiment_outlives_its_exec_tokens(kube, tmp_path: Path) -> None:
    from tests.support.kube.harness import config, pods_service

    path, runs = exec_kubeconfig(kube, tmp_path, lifetime=3, with_expiry=True)
    cfg = config(kube, tmp_path, pods_service(kubeConfig=str(path), reuseMode=True))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            for i in range(3):  # trials spread over several token lifetimes
                job = await ts.submit_trial_job(form(i, x=i, steps=3, step_sleep=1))
                done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
                assert done.status.value == "SUCCEEDED", done.message

    asyncio.run(body())
    assert len(runs.read_text().split()) >= 3  # the plugin ran again as tokens expired


def test_kubeconfig_beats_in_cluster_and_in_cluster_namespace_is_the_pods(kube_factory, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.aio import client as aio

    from nni_manager.backends.kubernetes import client
    from nni_manager.backends.kubernetes.config import KubeConfig

    kube = kube_factory(namespaces=["team-a"])
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("a-token-the-cluster-refuses")
    (account / "ca.crt").write_bytes((kube.state_dir / "ca.crt").read_bytes())
    (account / "namespace").write_text("team-a\n")
    monkeypatch.setattr(client, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(kube.port))

    async def namespace_and_listing(kc: KubeConfig) -> tuple[str, bool]:
        api = await client.load_client(kc)
        try:
            await aio.CoreV1Api(api).list_namespaced_pod(kc.namespace)
            return kc.namespace, True
        except Exception as e:
            assert getattr(e, "status", None) == 401, e
            return kc.namespace, False
        finally:
            await api.close()

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    assert asyncio.run(namespace_and_listing(KubeConfig())) == ("default", True)  # KUBECONFIG, not the pod's account
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))  # as client-go: a missing file is skipped
    assert asyncio.run(namespace_and_listing(KubeConfig())) == ("team-a", False)  # in-cluster: the pod's namespace
    given = KubeConfig(namespace="default", namespace_given=True)
    assert asyncio.run(namespace_and_listing(given))[0] == "default"  # the config's namespace wins


# ----------------------------------------------------------------------------- a revoked token, then a rotated one
def token_file_kubeconfig(kube, tmp_path: Path, token: str) -> tuple[Path, Path]:
    """A kubeconfig whose user reads its token from a file (`tokenFile`), as clusters whose token an
    outside refresher rotates (OIDC helpers, projected tokens, CI secrets) are configured."""
    import yaml

    token_file = tmp_path / "token"
    token_file.write_text(token)
    data = yaml.safe_load(kube.kubeconfig.read_text())
    data["users"][0]["user"] = {"tokenFile": str(token_file)}
    path = tmp_path / "token-file-kubeconfig"
    path.write_text(yaml.safe_dump(data))
    return path, token_file


def test_revoked_token_is_reloaded_from_its_rotated_file_and_the_call_retried(kube, tmp_path: Path) -> None:
    """The identity provider revokes the token the client holds; the refresher has written a new one:
    the 401 reloads the credentials and the call is retried once, never failed. While the file still
    holds the revoked token the call fails with the 401 (one reload, no loop)."""
    from kubernetes.aio import client as aio
    from kubernetes.client.exceptions import ApiException as SyncApiException

    from nni_manager.backends.kubernetes.client import load_client
    from nni_manager.backends.kubernetes.config import KubeConfig

    first = kube.issue_token()
    path, token_file = token_file_kubeconfig(kube, tmp_path, first)

    async def body() -> None:
        api = await load_client(KubeConfig(kube_config=path))
        try:
            core = aio.CoreV1Api(api)
            await core.list_namespaced_pod("default")
            assert kube.revoke_token(first)
            with pytest.raises(SyncApiException) as refused:
                kube.core(first).list_namespaced_pod("default")
            assert refused.value.status == 401  # the API server refuses it now
            with pytest.raises(Exception) as failed:  # not rotated yet: reloading finds the same token
                await core.list_namespaced_pod("default")
            assert getattr(failed.value, "status", None) == 401, failed.value
            second = kube.issue_token()
            token_file.write_text(second)  # the refresher rotates it
            await core.list_namespaced_pod("default")  # 401, reload, retried: succeeds
            assert api.configuration.api_key["BearerToken"].endswith(second)
        finally:
            await api.close()

    asyncio.run(body())


def test_experiment_outlives_a_revoked_and_rotated_token(kube, tmp_path: Path) -> None:
    from tests.support.kube.harness import config, pods_service

    first = kube.issue_token()
    path, token_file = token_file_kubeconfig(kube, tmp_path, first)
    cfg = config(kube, tmp_path, pods_service(kubeConfig=str(path), reuseMode=False))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=0))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            token_file.write_text(kube.issue_token())
            assert kube.revoke_token(first)
            job = await ts.submit_trial_job(form(1, x=1))  # a new pod, made with the rotated token
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message

    asyncio.run(body())
