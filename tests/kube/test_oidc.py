"""Kubeconfigs whose user is `auth-provider: oidc` (Dex, Keycloak, Entra ID, Okta in front of the
API server): the id-token lives minutes to an hour and is refreshed with the refresh-token at the
issuer, which rotates it. The emulator is the issuer (emulator/oidc.py) and checks id-tokens as
kube-apiserver's --oidc-* flags do; users are authorized by RBAC."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from pathlib import Path

import pytest
import yaml

from nni_manager.service import create_training_service
from tests.support.kube.oidc import CLIENT_ID, CLIENT_SECRET, oidc_kubeconfig
from tests.support.manager.helpers import form, wait_status

def provider_config(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["users"][0]["user"]["auth-provider"]["config"]


def test_the_api_server_checks_id_tokens_as_its_oidc_flags_say(kube, tmp_path: Path) -> None:
    """The emulator refuses what kube-apiserver refuses: an expired id-token, one for another
    client id (audience), a forged signature; it maps the email claim to the RBAC user."""
    import time

    from kubernetes.client.exceptions import ApiException

    path, login = oidc_kubeconfig(kube, tmp_path, lifetime=2)
    assert kube.core(login["idToken"]).list_namespaced_pod("default").items is not None  # alice, by RBAC
    other = kube.oidc_login("bob", email="bob@example.com", client_id="another-app", client_secret="s", lifetime=60)
    head, body, sig = other["idToken"].split(".")
    forged = ".".join([head, body, sig[:-4] + ("AAAA" if sig[-4:] != "AAAA" else "BBBB")])
    for token in (other["idToken"], forged):
        with pytest.raises(ApiException) as refused:
            kube.core(token).list_namespaced_pod("default")
        assert refused.value.status == 401 and json.loads(refused.value.body)["reason"] == "Unauthorized"
    kube.oidc_apiserver(client_id="another-app", username_claim="email")
    with pytest.raises(ApiException) as forbidden:  # authenticated as bob, who has no role
        kube.core(other["idToken"]).list_namespaced_pod("default")
    assert forbidden.value.status == 403
    assert 'User "bob@example.com"' in json.loads(forbidden.value.body)["message"]
    kube.oidc_apiserver(client_id=CLIENT_ID, username_claim="email")
    time.sleep(2.2)
    with pytest.raises(ApiException) as expired:
        kube.core(login["idToken"]).list_namespaced_pod("default")
    assert expired.value.status == 401


def test_id_tokens_are_refreshed_and_the_rotated_tokens_written_back(kube, tmp_path: Path) -> None:
    from kubernetes.aio import client as aio

    from nni_manager.backends.kubernetes.client import load_client
    from nni_manager.backends.kubernetes.config import KubeConfig

    path, login = oidc_kubeconfig(kube, tmp_path, lifetime=3)

    async def body() -> None:
        api = await load_client(KubeConfig(kube_config=path))
        try:
            core = aio.CoreV1Api(api)
            for _ in range(3):  # across two expiries
                await core.list_namespaced_pod("default")
                await asyncio.sleep(2.5)
            await core.list_namespaced_pod("default")
        finally:
            await api.close()

    asyncio.run(body())
    stats = kube.oidc_stats()
    assert stats["refreshGrants"] >= 2 and not stats["refused"], stats
    now = provider_config(path)
    assert now["refresh-token"] != login["refreshToken"] and now["id-token"] != login["idToken"]
    assert (path.stat().st_mode & 0o777) == 0o600  # rewritten, not loosened
    assert kube.core(now["id-token"]).list_namespaced_pod("default").items is not None  # kubectl can use it


def test_experiment_outlives_its_oidc_id_tokens(kube, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.support.kube.harness import config, pods_service

    path, login = oidc_kubeconfig(kube, tmp_path, lifetime=3)
    cfg = config(kube, tmp_path, pods_service(kubeConfig=str(path), reuseMode=False))
    seen: set[str] = {login["idToken"], login["refreshToken"], CLIENT_SECRET}

    async def body() -> None:
        from nni_manager.backends.kubernetes.oidc import expiry

        async with create_training_service(cfg) as ts:
            for i in range(3):  # each trial's pod is made after the id-token the manager last wrote expired
                exp = expiry(provider_config(path)["id-token"])
                assert exp is not None
                while dt.datetime.now(dt.timezone.utc) < exp:
                    await asyncio.sleep(0.2)
                job = await ts.submit_trial_job(form(i, x=i, steps=2, step_sleep=1))
                done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
                assert done.status.value == "SUCCEEDED", done.message
                now = provider_config(path)
                seen.update((now["id-token"], now["refresh-token"]))

    with caplog.at_level(logging.DEBUG):
        asyncio.run(body())
    stats = kube.oidc_stats()
    assert stats["refreshGrants"] >= 3 and not stats["refused"], stats  # several expiries, no reused token
    assert provider_config(path)["refresh-token"] != login["refreshToken"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    on_disk = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "exps").rglob("*")
                        if p.is_file() and p.stat().st_size < 5_000_000)
    for secret in seen:
        assert secret not in logged and secret not in on_disk


def test_a_revoked_refresh_token_is_one_line_naming_the_user_and_the_fix(kube, tmp_path: Path) -> None:
    from tests.support.kube.harness import config, pods_service

    from nni_manager.backends.kubernetes.client import KubeError

    path, _ = oidc_kubeconfig(kube, tmp_path, lifetime=3)
    cfg = config(kube, tmp_path, pods_service(kubeConfig=str(path), reuseMode=False))
    messages: list[str] = []

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=0))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            assert kube.oidc_revoke("alice") >= 1  # the administrator ends alice's sessions
            await asyncio.sleep(3)  # her id-token expires
            try:
                job = await ts.submit_trial_job(form(1, x=1))
            except KubeError as e:
                messages.append(str(e))
            else:
                done = await wait_status(ts, job.id, "FAILED", "SYS_CANCELED", "SUCCEEDED", timeout=90)
                assert done.status.value != "SUCCEEDED"
                messages.append(done.message or "")
        # a new experiment with the same kubeconfig is refused at start with the same line
        with pytest.raises(KubeError) as at_start:
            async with create_training_service(config(kube, tmp_path / "again", pods_service(
                    kubeConfig=str(path), reuseMode=False))):
                pass
        messages.append(str(at_start.value))

    asyncio.run(body())
    for line in messages:
        assert "\n" not in line and "Traceback" not in line, line
        assert "'alice'" in line and "alice@emulator" in line and "invalid_grant" in line, line
        assert "log in again" in line and "kubectl" in line, line
    stats = kube.oidc_stats()
    assert stats["refused"].get("invalid_grant", 0) <= 2, stats  # not retried on every call


def test_public_client_with_a_ca_file_through_a_symlinked_kubeconfig(kube, tmp_path: Path) -> None:
    """A public client (no client-secret: client_id in the form), `idp-certificate-authority` as a
    file, the API server's --oidc-username-prefix, and ~/.kube/config a symlink: the refresh works
    and the rotated tokens land in the file the link points to, which stays a link."""
    from kubernetes.aio import client as aio

    from nni_manager.backends.kubernetes.client import load_client
    from nni_manager.backends.kubernetes.config import KubeConfig

    kube.oidc_apiserver(client_id="public-cli", username_claim="sub", username_prefix="oidc:")
    # refreshed tokens outlive the test: exactly one refresh is due, however slow the machine
    login = kube.oidc_login("carol", client_id="public-cli", lifetime=2, refresh_lifetime=600)
    real = tmp_path / "dotfiles" / "kubeconfig"
    real.parent.mkdir()
    (real.parent / "issuer-ca.crt").write_bytes((kube.state_dir / "ca.crt").read_bytes())
    data = yaml.safe_load(kube.kubeconfig.read_text())
    data["users"] = [{"name": "carol", "user": {"auth-provider": {"name": "oidc", "config": {
        "client-id": "public-cli", "id-token": login["idToken"], "refresh-token": login["refreshToken"],
        "idp-issuer-url": login["issuer"], "idp-certificate-authority": str(real.parent / "issuer-ca.crt")}}}}]
    data["contexts"][0]["context"]["user"] = "carol"
    real.write_text(yaml.safe_dump(data))
    link = tmp_path / "config"
    link.symlink_to(real)
    from kubernetes import client
    client.RbacAuthorizationV1Api(kube.api_client()).create_cluster_role_binding({
        "metadata": {"name": "carol-view"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                        "name": "carol-view"},
        "subjects": [{"kind": "User", "name": "oidc:carol"}]})  # --oidc-username-prefix=oidc:
    client.RbacAuthorizationV1Api(kube.api_client()).create_cluster_role({
        "metadata": {"name": "carol-view"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})

    async def body() -> None:
        await asyncio.sleep(2.2)  # the login's id-token has expired: the first load refreshes it
        api = await load_client(KubeConfig(kube_config=link))
        try:
            await aio.CoreV1Api(api).list_namespaced_pod("default")
        finally:
            await api.close()

    asyncio.run(body())
    assert link.is_symlink()
    assert provider_config(real)["refresh-token"] != login["refreshToken"]
    assert kube.oidc_stats()["refreshGrants"] == 1
