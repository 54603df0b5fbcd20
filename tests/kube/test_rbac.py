"""RBAC as clusters enforce it: the Role docs/platforms/kubernetes.md ships runs experiments; each
missing verb is named at start; FrameworkController's barrier reads its Framework as the pod's
service account (the experiment grants it, or refuses with the objects to apply)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.backends.kubernetes.client import KubeError
from nni_manager.service import create_training_service
from tests.support.kube.harness import IMAGE, config, ours, pods_service
from tests.support.kube.rbac_user import USER_TOKEN, bind_alice, doc_role, rbac_api  # noqa: F401
from tests.support.manager.helpers import form, wait_status

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
FC = ("frameworkcontroller.microsoft.com", "v1")
def fc_service(**extra: Any) -> dict[str, Any]:
    return {"platform": "frameworkcontroller", "reuseMode": False, **extra,
            "taskRoles": [{"name": "worker", "taskNumber": 1, "command": "python3 trial.py", "cpuNumber": 0.5,
                           "memorySize": "256mb", "dockerImage": IMAGE}]}


async def run_one_trial(cfg: Any) -> str:
    async with create_training_service(cfg) as ts:
        job = await ts.submit_trial_job(form(0, x=7))
        done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)
        assert done.status.value == "SUCCEEDED", done.message
        return ts.experiment_id


def start_error(cfg: Any) -> str:
    async def main() -> str:
        ts = create_training_service(cfg)
        with pytest.raises(KubeError) as e:
            await ts.start()
        return str(e.value)
    return asyncio.run(main())


@pytest.mark.parametrize("platform", ["kubernetes", "frameworkcontroller"])
def test_the_documented_role_runs_an_experiment(kube_factory, tmp_path: Path, platform: str) -> None:
    kube = kube_factory(tokens=[f"{USER_TOKEN}=alice:rbac"], crd_groups=["kubeflow.org", FC[0]])
    kc = bind_alice(kube, doc_role())
    service = pods_service(reuseMode=False) if platform == "kubernetes" else fc_service()
    cfg = config(kube, tmp_path, {**service, "kubeConfig": str(kc)})
    exp = asyncio.run(run_one_trial(cfg))
    if platform == "frameworkcontroller":  # the barrier ran under RBAC as the experiment's own account
        core = kube.core()
        assert not [s for s in core.list_namespaced_service_account(NS).items if s.metadata.name.startswith("nni-fb-")]
        assert not rbac_api(kube).list_namespaced_role(NS, label_selector=ours(exp)).items
        assert not rbac_api(kube).list_namespaced_role_binding(NS, label_selector=ours(exp)).items


def test_each_missing_verb_is_one_line(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(tokens=[f"{USER_TOKEN}=alice:rbac"])
    full = doc_role()
    kc = bind_alice(kube, full)
    cfg = config(kube, tmp_path, pods_service(kubeConfig=str(kc)))
    api = rbac_api(kube)
    checked = 0
    for i, rule in enumerate(full["rules"]):
        if rule["apiGroups"] != [""] or rule["resources"][0] in ("serviceaccounts", "services", "pods/portforward"):
            continue  # the plain-pods platform needs only the core rules above (no hub tunnel: nniManagerIp is set)
        for verb in rule["verbs"]:
            if (rule["resources"][0], verb) == ("events", "watch"):
                continue  # a courtesy, not asked at start: test_event_watch.py runs without it
            role = yaml.safe_load(yaml.safe_dump(full))
            role["rules"][i]["verbs"] = [v for v in rule["verbs"] if v != verb]
            api.replace_namespaced_role(role["metadata"]["name"], NS, role)
            msg = start_error(cfg)
            denied = [line.strip() for line in msg.splitlines() if line.startswith("  ")]
            assert denied == [f"cannot {verb} {rule['resources'][0]} in namespace {NS}"], msg
            checked += 1
    assert checked == 15
    assert not kube.core().list_namespaced_pod(NS).items  # refused before anything was created


def test_frameworkcontroller_refuses_with_the_objects_then_runs_with_them(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(tokens=[f"{USER_TOKEN}=alice:rbac"], crd_groups=[FC[0]])
    role = doc_role()
    role["rules"] = [r for r in role["rules"] if r["resources"] not in (["serviceaccounts"], ["roles", "rolebindings"])]
    role["rules"].append({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get"]})
    kc = bind_alice(kube, role)
    msg = start_error(config(kube, tmp_path, {**fc_service(), "kubeConfig": str(kc)}))
    assert "cannot create serviceaccounts in namespace default" in msg, msg
    assert "serviceAccountName: nni-frameworkbarrier" in msg, msg
    objects = list(yaml.safe_load_all(msg[msg.index("apiVersion"):]))
    assert [o["kind"] for o in objects] == ["ServiceAccount", "Role", "RoleBinding"]
    from kubernetes import client
    core = client.CoreV1Api(kube.api_client())
    core.create_namespaced_service_account(NS, objects[0])  # what the admin applies, as printed
    rbac_api(kube).create_namespaced_role(NS, objects[1])
    rbac_api(kube).create_namespaced_role_binding(NS, objects[2])
    asyncio.run(run_one_trial(config(kube, tmp_path, {**fc_service(serviceAccountName="nni-frameworkbarrier"),
                                                      "kubeConfig": str(kc)})))


def test_barrier_without_read_access_retries_until_granted(kube_crd_ns) -> None:
    """The emulated frameworkbarrier is a client of the API server as the pod's account: 403, retried."""
    from kubernetes import client
    kube = kube_crd_ns
    NS = kube.namespace  # this test's own namespace on the shared emulator
    api = kube.api_client()
    pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": IMAGE, "command": [
        "sh", "-c", ". /mnt/frameworkbarrier/injector.sh && echo IPS=$FB_WORKER_IPS; sleep 30"],
        "volumeMounts": [{"name": "fb", "mountPath": "/mnt/frameworkbarrier"}]}],
        "initContainers": [{"name": "frameworkbarrier", "image": "frameworkcontroller/frameworkbarrier",
                            "volumeMounts": [{"name": "fb", "mountPath": "/mnt/frameworkbarrier"}]}],
        "volumes": [{"name": "fb", "emptyDir": {}}]}}
    fw = {"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework", "metadata": {"name": "rb"},
          "spec": {"executionType": "Start", "retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                   "taskRoles": [{"name": "worker", "taskNumber": 1, "frameworkAttemptCompletionPolicy": {
                       "minFailedTaskCount": 1, "minSucceededTaskCount": 1},
                       "task": {"retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0}, "pod": pod}}]}}
    client.CustomObjectsApi(api).create_namespaced_custom_object(*FC, NS, "frameworks", fw)
    core = client.CoreV1Api(api)

    def barrier_log() -> str:
        try:
            return core.read_namespaced_pod_log("rb-worker-0", NS, container="frameworkbarrier")
        except Exception:
            return ""
    kube.wait_for(lambda: "forbidden" in barrier_log(), what="the barrier's 403", timeout=30)
    assert f'User "system:serviceaccount:{NS}:default" cannot get resource "frameworks"' in barrier_log()
    assert core.read_namespaced_pod("rb-worker-0", NS).status.phase == "Pending"  # still in its init container
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(NS, {"metadata": {"name": "fb"}, "rules": [
        {"apiGroups": [FC[0]], "resources": ["frameworks"], "verbs": ["get"]}]})
    rbac.create_namespaced_role_binding(NS, {"metadata": {"name": "fb"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fb"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS}]})
    def main_log() -> str:
        try:
            return core.read_namespaced_pod_log("rb-worker-0", NS, container="main")
        except Exception:  # still initializing
            return ""
    kube.wait_for(lambda: "IPS=127.0.0.1" in main_log(), what="the barrier passing", timeout=30)


def test_escalation_is_refused_and_access_reviews_answer(kube_factory) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    kube = kube_factory(tokens=[f"{USER_TOKEN}=alice:rbac"])
    rbac_api(kube).create_namespaced_role(NS, {"metadata": {"name": "small"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["create"]}]})
    rbac_api(kube).create_namespaced_role_binding(NS, {"metadata": {"name": "small"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "small"},
        "subjects": [{"kind": "User", "name": "alice"}]})
    alice = kube.api_client(USER_TOKEN)
    with pytest.raises(ApiException) as e:
        client.RbacAuthorizationV1Api(alice).create_namespaced_role(NS, {"metadata": {"name": "more"}, "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})
    assert e.value.status == 403 and "not currently held" in e.value.body
    client.RbacAuthorizationV1Api(alice).create_namespaced_role(NS, {"metadata": {"name": "same"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
    review = client.AuthorizationV1Api(alice).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"namespace": NS, "verb": "list", "resource": "pods"}}})
    assert review.status.allowed is True
    review = client.AuthorizationV1Api(alice).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"namespace": NS, "verb": "create", "resource": "pods",
                                          "subresource": "portforward"}}})
    assert review.status.allowed is False
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(alice).list_namespaced_secret(NS)
    assert e.value.status == 403
