"""The Kubernetes emulator, exercised only through the official client (sync and asyncio)."""
from __future__ import annotations

import asyncio
import base64
import json
import os

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from tests.support.kube.fixtures import KubeNamespace, namespace_of
from tests.support.kube.pods import IMG, pod_body, wait_phase


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    """Running and not a zombie (reparented grandchildren may wait for their reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def err(e: ApiException) -> dict:
    return json.loads(e.body)


@pytest.fixture
def kube(kube_ns: KubeNamespace) -> KubeNamespace:
    """This module's tests share the session's emulator, each in a namespace of its own; those that change
    the cluster itself (nodes, tokens, watch history) start a private one with `kube_factory`."""
    return kube_ns


def test_crud_list_selectors_and_errors(kube):
    v1 = kube.core()
    for i, team in enumerate(["a", "a", "b"]):
        v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": f"cm{i}", "labels": {"team": team, "i": str(i)}},
                                             "data": {"k": str(i)}})
    cm = v1.read_namespaced_config_map("cm0", namespace_of(kube))
    assert cm.metadata.uid and int(cm.metadata.resource_version) > 0 and cm.metadata.creation_timestamp
    assert sorted(c.metadata.name for c in v1.list_namespaced_config_map(namespace_of(kube), label_selector="team=a").items) == ["cm0", "cm1"]
    assert [c.metadata.name for c in v1.list_namespaced_config_map(namespace_of(kube), label_selector="team!=a").items] == ["cm2"]
    assert sorted(c.metadata.name for c in v1.list_namespaced_config_map(namespace_of(kube), label_selector="i in (0,2),team").items) == ["cm0", "cm2"]
    assert [c.metadata.name for c in v1.list_namespaced_config_map(namespace_of(kube), label_selector="!team").items] == []
    assert [c.metadata.name for c in v1.list_namespaced_config_map(namespace_of(kube), field_selector="metadata.name=cm1").items] == ["cm1"]
    resp = v1.list_namespaced_config_map_with_http_info(namespace_of(kube), _preload_content=False)
    body = json.loads(resp.data)
    assert body["kind"] == "ConfigMapList" and "kind" not in body["items"][0] and body["metadata"]["resourceVersion"]

    # 409 AlreadyExists
    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "cm0"}, "data": {}})
    assert ei.value.status == 409 and err(ei.value)["reason"] == "AlreadyExists"
    assert err(ei.value)["message"] == 'configmaps "cm0" already exists'
    # 404 NotFound Status
    with pytest.raises(ApiException) as ei:
        v1.read_namespaced_pod("nope", namespace_of(kube))
    assert ei.value.status == 404 and err(ei.value)["reason"] == "NotFound"
    assert err(ei.value)["details"] == {"name": "nope", "kind": "pods"}
    # 422 Invalid with causes
    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_pod(namespace_of(kube), pod_body("Bad_Name", "true"))
    b = err(ei.value)
    assert ei.value.status == 422 and b["reason"] == "Invalid"
    assert b["message"].startswith('Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain')
    assert b["details"]["causes"][0]["field"] == "metadata.name"
    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_pod(namespace_of(kube), {"metadata": {"name": "x"}, "spec": {"restartPolicy": "Sometimes", "containers": [
            {"name": "c", "command": ["true"], "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
            {"name": "c", "image": IMG, "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]}})
    fields = {c["field"]: c["reason"] for c in err(ei.value)["details"]["causes"]}
    assert fields == {"spec.containers[0].image": "FieldValueRequired",
                      "spec.containers[0].volumeMounts[0].name": "FieldValueNotFound",
                      "spec.containers[1].name": "FieldValueDuplicate",
                      "spec.containers[1].resources.requests": "FieldValueInvalid",
                      "spec.restartPolicy": "FieldValueNotSupported"}
    # 400: bad quantity, bad base64, unsupported field selector
    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_pod(namespace_of(kube), pod_body("q", "true", container={"resources": {"requests": {"memory": "8GG"}}}))
    assert ei.value.status == 400 and "quantities must match" in err(ei.value)["message"]
    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_secret(namespace_of(kube), {"metadata": {"name": "s"}, "data": {"k": "not base64!"}})
    assert ei.value.status == 400 and "illegal base64 data" in err(ei.value)["message"]
    with pytest.raises(ApiException) as ei:
        v1.list_namespaced_pod(namespace_of(kube), field_selector="spec.foo=1")
    assert ei.value.status == 400 and err(ei.value)["message"] == "field label not supported: spec.foo"
    # too large
    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "big"}, "data": {"k": "x" * (1024 * 1024 + 1)}})
    assert ei.value.status == 422 and "Too long: must have at most 1048576 bytes" in err(ei.value)["message"]

    # patch (strategic, merge, json), replace, delete, deletecollection
    v1.patch_namespaced_config_map("cm0", namespace_of(kube), {"metadata": {"labels": {"x": "1"}}, "data": {"n": "v"}})
    v1.patch_namespaced_config_map("cm0", namespace_of(kube), [{"op": "remove", "path": "/data/k"}])
    cm = v1.read_namespaced_config_map("cm0", namespace_of(kube))
    assert cm.data == {"n": "v"} and cm.metadata.labels["x"] == "1"
    cm.data["z"] = "1"
    cm2 = v1.replace_namespaced_config_map("cm0", namespace_of(kube), cm)
    assert cm2.data == {"n": "v", "z": "1"} and int(cm2.metadata.resource_version) > int(cm.metadata.resource_version)
    cm.data["stale"] = "1"
    with pytest.raises(ApiException) as ei:
        v1.replace_namespaced_config_map("cm0", namespace_of(kube), cm)
    assert ei.value.status == 409 and err(ei.value)["reason"] == "Conflict"
    v1.delete_collection_namespaced_config_map(namespace_of(kube), label_selector="team=a")
    assert [c.metadata.name for c in v1.list_namespaced_config_map(namespace_of(kube)).items] == ["cm2"]
    v1.delete_namespaced_config_map("cm2", namespace_of(kube))
    assert v1.list_namespaced_config_map(namespace_of(kube)).items == []

    # unknown API group / resource: plain text 404 as a real apiserver
    co = client.CustomObjectsApi(kube.api_client())
    with pytest.raises(ApiException) as ei:
        co.list_namespaced_custom_object("nosuch.example.com", "v1", namespace_of(kube), "things")
    assert ei.value.status == 404 and ei.value.body.strip() == "404 page not found"


def test_auth_401_403(kube_factory):
    kube = kube_factory(tokens=["ro-token=system:serviceaccount:default:nni:get/pods,list/pods"])
    with pytest.raises(ApiException) as ei:
        kube.core("wrong").list_namespaced_pod(namespace_of(kube))
    assert ei.value.status == 401 and err(ei.value)["reason"] == "Unauthorized"
    ro = kube.core("ro-token")
    assert ro.list_namespaced_pod(namespace_of(kube)).items == []
    with pytest.raises(ApiException) as ei:
        ro.create_namespaced_pod(namespace_of(kube), pod_body("p", "true"))
    assert ei.value.status == 403
    assert err(ei.value)["message"] == ('pods is forbidden: User "system:serviceaccount:default:nni" cannot create '
                                        'resource "pods" in API group "" in the namespace "default"')
    with pytest.raises(ApiException) as ei:
        client.CustomObjectsApi(kube.api_client("ro-token")).list_namespaced_custom_object("kubeflow.org", "v1", namespace_of(kube), "tfjobs")
    assert ei.value.status == 404 and ei.value.body.strip() == "404 page not found"   # group not installed


def test_field_validation_strict_and_warn(kube):
    body = pod_body("strict", "true", container={"foo": 1})
    path = f"/api/v1/namespaces/{namespace_of(kube)}/pods"
    status, _, data = kube.raw("POST", path, body, [("fieldValidation", "Strict")])
    assert status == 400 and json.loads(data)["message"] == 'strict decoding error: unknown field "spec.containers[0].foo"'
    assert json.loads(data)["reason"] == "BadRequest"
    status, headers, data = kube.raw("POST", path, body)          # server default: Warn
    assert status == 201 and headers.get("Warning") == '299 - "unknown field \\"spec.containers[0].foo\\""'
    assert "foo" not in json.loads(data)["spec"]["containers"][0]
    assert kube.core().read_namespaced_pod("strict", namespace_of(kube)).spec.containers[0].name == "main"


def test_watch_resource_version_and_410(kube_factory):
    kube = kube_factory(watch_history=20)
    v1 = kube.core()
    v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "w0", "labels": {"w": "y"}}})
    rv = v1.list_namespaced_config_map(namespace_of(kube)).metadata.resource_version
    w = watch.Watch()
    got = [(e["type"], e["object"].metadata.name) for e in
           w.stream(v1.list_namespaced_config_map, namespace_of(kube), label_selector="w=y", timeout_seconds=1)]
    assert got == [("ADDED", "w0")]
    v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "w1", "labels": {"w": "y"}}})
    v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "other"}})
    v1.patch_namespaced_config_map("w1", namespace_of(kube), {"metadata": {"labels": {"w": "n"}}})
    v1.delete_namespaced_config_map("w0", namespace_of(kube))
    got = [(e["type"], e["object"].metadata.name) for e in
           watch.Watch().stream(v1.list_namespaced_config_map, namespace_of(kube), label_selector="w=y", resource_version=rv, timeout_seconds=1)]
    # w1 leaving the selector is a DELETED for this watch, as on a real server
    assert got == [("ADDED", "w1"), ("DELETED", "w1"), ("DELETED", "w0")]
    for i in range(25):
        v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": f"f{i}"}})
    resp = v1.list_namespaced_config_map_with_http_info(namespace_of(kube), watch=True, resource_version=rv, timeout_seconds=1,
                                                         _preload_content=False)
    ev = json.loads(resp.data.splitlines()[0])
    assert ev["type"] == "ERROR" and ev["object"]["code"] == 410 and ev["object"]["reason"] == "Expired"
    assert ev["object"]["message"].startswith(f"too old resource version: {rv} (")
    with pytest.raises(ApiException) as ei:
        list(watch.Watch().stream(v1.list_namespaced_config_map, namespace_of(kube), resource_version=rv, timeout_seconds=1))
    assert ei.value.status == 410


def test_event_watch_bookmarks_an_ended_stream_and_compaction(kube_factory):
    """Events are watched like any resource: bookmarks carry the newest resourceVersion; after
    compaction (`end_watches(expire=True)`) an open stream gets the 410 Expired Status and a resume
    from an older version 410 Gone; requests are counted by verb."""
    kube = kube_factory()
    v1, ns = kube.core(), namespace_of(kube)

    def event(name: str) -> None:
        v1.create_namespaced_event(ns, {"metadata": {"name": name}, "type": "Warning", "reason": "Test",
                                        "message": name, "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns}})

    rv = v1.list_namespaced_event(ns).metadata.resource_version
    event("e1")
    lines = v1.list_namespaced_event_with_http_info(ns, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                                    timeout_seconds=7, _preload_content=False).data.splitlines()
    got = [json.loads(line) for line in lines]
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in got][:1] == [("ADDED", "e1")]
    bookmarks = [e["object"] for e in got if e["type"] == "BOOKMARK"]
    assert bookmarks and bookmarks[-1]["kind"] == "Event" and int(bookmarks[-1]["metadata"]["resourceVersion"]) > int(rv)
    assert kube.requests("watch", "events", ns) == 1 and kube.requests("list", "events", ns) == 1

    async def expire_while_watching() -> list[dict]:
        def stream() -> list[dict]:
            resp = v1.list_namespaced_event_with_http_info(ns, watch=True, resource_version=rv, timeout_seconds=20,
                                                           _preload_content=False)
            return [json.loads(line) for line in resp.data.splitlines()]
        task = asyncio.ensure_future(asyncio.to_thread(stream))
        while kube.requests("watch", "events", ns) < 2:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        assert kube.end_watches("events", expire=True) == 1
        return await task
    got = asyncio.run(expire_while_watching())
    assert got[0]["type"] == "ADDED" and got[-1]["type"] == "ERROR"
    assert got[-1]["object"]["code"] == 410 and got[-1]["object"]["reason"] == "Expired"
    assert got[-1]["object"]["message"].startswith("too old resource version: ")
    with pytest.raises(ApiException) as ei:
        list(watch.Watch().stream(v1.list_namespaced_event, ns, resource_version=rv, timeout_seconds=1))
    assert ei.value.status == 410


def test_pod_runs_volumes_logs_fallback_message(kube):
    v1 = kube.core()
    v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "cfg"}, "data": {"k": "from-configmap"}})
    v1.create_namespaced_pod(namespace_of(kube), pod_body(
        "p1", "echo hi; cat /etc/cfg/k; echo; hostname; exit 3",
        container={"terminationMessagePolicy": "FallbackToLogsOnError",
                   "volumeMounts": [{"name": "c", "mountPath": "/etc/cfg"}]},
        volumes=[{"name": "c", "configMap": {"name": "cfg"}}]))
    p = wait_phase(kube, v1, "p1")
    assert p.status.phase == "Failed"
    t = p.status.container_statuses[0].state.terminated
    assert t.exit_code == 3 and t.reason == "Error"
    log = v1.read_namespaced_pod_log("p1", namespace_of(kube))
    assert log == "hi\nfrom-configmap\np1\n"
    assert t.message == log
    assert v1.read_namespaced_pod_log("p1", namespace_of(kube), tail_lines=1) == "p1\n"
    assert not os.path.exists("/etc/cfg/k")          # mounted only inside the pod
    hist = kube.history("pods", namespace_of(kube), "p1")
    assert [h["phase"] for h in hist][0] == "Pending" and hist[-1]["phase"] == "Failed"
    assert any(h["phase"] == "Running" for h in hist)
    assert {c["type"]: c["status"] for c in hist[-1]["conditions"]}["PodScheduled"] == "True"


def test_secret_mount_env_field_ref_and_termination_log(kube):
    v1 = kube.core()
    v1.create_namespaced_secret(namespace_of(kube), {"metadata": {"name": "tok"}, "stringData": {"token": "s3cret"},
                                     "data": {"b": base64.b64encode(b"bin").decode()}})
    v1.create_namespaced_pod(namespace_of(kube), pod_body(
        "p2", 'cat /var/run/nni/sec/token; echo " $POD $NSP $LBL $IP $SEC"; stat -c %a /var/run/nni/sec/token;'
              ' echo bye > /dev/termination-log',
        labels={"role": "trial"},
        container={"volumeMounts": [{"name": "s", "mountPath": "/var/run/nni/sec"}],
                   "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                           {"name": "NSP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                           {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
                           {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                           {"name": "SEC", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "b"}}}]},
        volumes=[{"name": "s", "secret": {"secretName": "tok", "defaultMode": 0o400}}]))
    p = wait_phase(kube, v1, "p2")
    assert p.status.phase == "Succeeded", v1.read_namespaced_pod_log("p2", namespace_of(kube))
    assert v1.read_namespaced_pod_log("p2", namespace_of(kube)) == f"s3cret p2 {namespace_of(kube)} trial 127.0.0.1 bin\n400\n"
    t = p.status.container_statuses[0].state.terminated
    assert t.reason == "Completed" and t.message == "bye\n"
    assert p.status.pod_ip == "127.0.0.1" and p.status.host_ip == "127.0.0.1"
    assert not os.path.exists("/var/run/nni/sec")
    assert "emulator.nni/started-at" in p.metadata.annotations


def test_run_as_user_fs_group_and_run_as_non_root(kube):
    """securityContext as runc and the kubelet apply it: the process runs as runAsUser/runAsGroup
    with fsGroup among its groups; with fsGroup a 0400 Secret file becomes 0440 of that group
    (readable by the non-root user), without it stays root's; an emptyDir is world-writable;
    runAsNonRoot with no runAsUser is a CreateContainerConfigError."""
    v1 = kube.core()
    v1.create_namespaced_secret(namespace_of(kube), {"metadata": {"name": "tok"}, "stringData": {"token": "s3cret"}})
    script = ('id -u; id -g; id -G; stat -c "%a %g" /var/run/s/token; { cat /var/run/s/token && echo; } || echo unreadable; '
              'touch /var/run/w/f && echo writable')
    volumes = [{"name": "s", "secret": {"secretName": "tok", "defaultMode": 0o400}}, {"name": "w", "emptyDir": {}}]
    mounts = {"volumeMounts": [{"name": "s", "mountPath": "/var/run/s"}, {"name": "w", "mountPath": "/var/run/w"}]}
    for name, security in (("with-fs-group", {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000}),
                           ("without", {"runAsUser": 1000, "runAsGroup": 3000})):
        v1.create_namespaced_pod(namespace_of(kube), pod_body(name, script, image="python:3.11-slim", container=mounts,
                                              volumes=volumes, securityContext=security))
    assert wait_phase(kube, v1, "with-fs-group").status.phase == "Succeeded"
    log = v1.read_namespaced_pod_log("with-fs-group", namespace_of(kube)).split("\n")
    assert log[:2] == ["1000", "3000"] and "2000" in log[2].split()
    assert log[3:6] == ["440 2000", "s3cret", "writable"], log
    wait_phase(kube, v1, "without")
    log = v1.read_namespaced_pod_log("without", namespace_of(kube)).split("\n")
    assert log[:2] == ["1000", "3000"] and "2000" not in log[2].split()
    assert log[3] == "400 0" and "unreadable" in log and "writable" in log, log
    v1.create_namespaced_pod(namespace_of(kube), pod_body("as-root", "true", securityContext={"runAsNonRoot": True}))
    pod = kube.wait_for(lambda: (lambda p: p if (p.status.container_statuses or [None])[0] is not None and
                                 p.status.container_statuses[0].state.waiting is not None and
                                 p.status.container_statuses[0].state.waiting.reason == "CreateContainerConfigError"
                                 else None)(v1.read_namespaced_pod("as-root", namespace_of(kube))), 20, what="CreateContainerConfigError")
    assert "runAsNonRoot and image will run as root" in pod.status.container_statuses[0].state.waiting.message


def test_unschedulable_then_scheduled_after_set_node(kube_factory):
    kube = kube_factory()  # changes the nodes: a cluster of its own
    v1 = kube.core()
    v1.create_namespaced_pod(namespace_of(kube), pod_body("gpu", "echo ok", container={
        "resources": {"limits": {"nvidia.com/gpu": "2"}}}))
    msg = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
           "1 No preemption victims found for incoming pod.")

    def unsched():
        p = v1.read_namespaced_pod("gpu", namespace_of(kube))
        c = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
        return c and c[0].status == "False" and c[0]
    c = kube.wait_for(unsched, what="Unschedulable")
    assert c.reason == "Unschedulable" and c.message == msg
    evs = v1.list_namespaced_event(namespace_of(kube), field_selector="involvedObject.name=gpu,reason=FailedScheduling").items
    assert evs and evs[0].type == "Warning" and evs[0].message == msg and evs[0].involved_object.kind == "Pod"
    kube.set_node("node-1", gpus=4)
    p = wait_phase(kube, v1, "gpu")
    assert p.status.phase == "Succeeded" and p.spec.node_name == "node-1"


def test_image_pull_backoff(kube):
    v1 = kube.core()
    v1.create_namespaced_pod(namespace_of(kube), pod_body("img", "true", image="nosuch/image:1"))

    def waiting():
        p = v1.read_namespaced_pod("img", namespace_of(kube))
        cs = p.status.container_statuses
        return cs and cs[0].state.waiting and cs[0].state.waiting.reason == "ImagePullBackOff" and p
    p = kube.wait_for(waiting, what="ImagePullBackOff")
    assert p.status.phase == "Pending"
    assert p.status.container_statuses[0].state.waiting.message == 'Back-off pulling image "nosuch/image:1"'
    reasons = {e.reason for e in v1.list_namespaced_event(namespace_of(kube), field_selector="involvedObject.name=img").items}
    assert {"Failed", "BackOff"} <= reasons
    assert any(h.get("containerStatuses", [{}])[0].get("state", {}).get("waiting", {}).get("reason") == "ErrImagePull"
               for h in kube.history("pods", namespace_of(kube), "img"))


def test_graceful_delete_kills_trap_ignoring_process(kube):
    v1 = kube.core()
    v1.create_namespaced_pod(namespace_of(kube), pod_body(
        "stubborn", "trap '' TERM; (sleep 300 &); echo ready; while true; do sleep 0.1; done",
        termination_grace_period_seconds=None))
    kube.wait_for(lambda: "ready" in v1.read_namespaced_pod_log("stubborn", namespace_of(kube)) if
                  v1.read_namespaced_pod("stubborn", namespace_of(kube)).status.phase == "Running" else False, what="running")
    # the shell and its `sleep 300` (not the loop's `sleep 0.1`s, which end on their own any moment)
    pids = [pid for pid in kube.pod_processes(namespace_of(kube), "stubborn") if not _cmdline(pid).endswith(b"0.1\0")]
    assert len(pids) >= 2
    w = watch.Watch()
    # a grace long enough that a loaded machine still looks inside it (the check below is not timed)
    v1.delete_namespaced_pod("stubborn", namespace_of(kube), grace_period_seconds=4)
    p = v1.read_namespaced_pod("stubborn", namespace_of(kube))
    assert p.metadata.deletion_timestamp is not None and p.metadata.deletion_grace_period_seconds == 4
    assert all(alive(pid) for pid in pids)       # SIGTERM ignored: still alive in grace
    types = [e["type"] for e in w.stream(v1.list_namespaced_pod, namespace_of(kube), field_selector="metadata.name=stubborn",
                                         timeout_seconds=60) if not (e["type"] == "DELETED" and w.stop())]
    assert types[0] == "ADDED" and types[-1] == "DELETED"
    kube.wait_for(lambda: not any(alive(pid) for pid in pids), what="SIGKILLed after the grace period")
    with pytest.raises(ApiException) as ei:
        v1.read_namespaced_pod("stubborn", namespace_of(kube))
    assert ei.value.status == 404
    assert kube.leftover_processes() == []


def test_oom_killed_and_evicted(kube):
    v1 = kube.core()
    v1.create_namespaced_pod(namespace_of(kube), pod_body("oom", "echo up; sleep 60"))
    v1.create_namespaced_pod(namespace_of(kube), pod_body("ev", "echo up; sleep 60"))
    for n in ("oom", "ev"):
        kube.wait_for(lambda n=n: v1.read_namespaced_pod_log(n, namespace_of(kube)) if v1.read_namespaced_pod(n, namespace_of(kube)).status.phase == "Running" else "", what=n)
    kube.oom_kill(namespace_of(kube), "oom")
    p = wait_phase(kube, v1, "oom")
    t = p.status.container_statuses[0].state.terminated
    assert p.status.phase == "Failed" and t.reason == "OOMKilled" and t.exit_code == 137
    kube.evict(namespace_of(kube), "ev")
    p = wait_phase(kube, v1, "ev")
    assert p.status.phase == "Failed" and p.status.reason == "Evicted"
    assert p.status.message.startswith("The node was low on resource: memory.")
    assert kube.pod_processes(namespace_of(kube), "ev") == []


def test_owner_reference_garbage_collection(kube):
    v1 = kube.core()
    owner = v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "owner"}})
    ref = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]
    v1.create_namespaced_pod(namespace_of(kube), {**pod_body("child", "sleep 60"), "metadata": {"name": "child", "ownerReferences": ref}})
    v1.create_namespaced_secret(namespace_of(kube), {"metadata": {"name": "child-s", "ownerReferences": ref}})
    v1.create_namespaced_secret(namespace_of(kube), {"metadata": {"name": "free"}})
    kube.wait_for(lambda: v1.read_namespaced_pod("child", namespace_of(kube)).status.phase == "Running", what="running")
    v1.delete_namespaced_config_map("owner", namespace_of(kube), grace_period_seconds=0)

    def gone():
        names = [p.metadata.name for p in v1.list_namespaced_pod(namespace_of(kube)).items]
        return "child" not in names
    kube.wait_for(gone, timeout=40, what="child GC")
    assert [s.metadata.name for s in v1.list_namespaced_secret(namespace_of(kube)).items] == ["free"]
    # Orphan keeps dependents and strips the ownerReference
    o2 = v1.create_namespaced_config_map(namespace_of(kube), {"metadata": {"name": "o2"}})
    v1.create_namespaced_secret(namespace_of(kube), {"metadata": {"name": "kept", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "o2", "uid": o2.metadata.uid}]}})
    v1.delete_namespaced_config_map("o2", namespace_of(kube), propagation_policy="Orphan")
    kept = v1.read_namespaced_secret("kept", namespace_of(kube))
    assert kept.metadata.owner_references is None


def test_node_lost(kube_factory):
    kube = kube_factory()  # changes the nodes: a cluster of its own
    v1 = kube.core()
    v1.create_namespaced_pod(namespace_of(kube), pod_body("onnode", "sleep 60"))
    kube.wait_for(lambda: v1.read_namespaced_pod("onnode", namespace_of(kube)).status.phase == "Running", what="running")
    kube.node_lost("node-1")
    with pytest.raises(ApiException) as ei:
        v1.read_namespaced_pod("onnode", namespace_of(kube))
    assert ei.value.status == 404
    assert kube.history("pods", namespace_of(kube), "onnode")[-1]["phase"] == "Failed"
    assert v1.list_node().items == []


def test_restart_policy_on_failure_crashloop(kube):
    v1 = kube.core()
    v1.create_namespaced_pod(namespace_of(kube), pod_body("crash", "echo run; [ -e /tmp/emu-crash-$POD_UID ] && exit 0; "
                                          "touch /tmp/emu-crash-$POD_UID; exit 1", restart="OnFailure",
                                          container={"env": [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]}))
    p = wait_phase(kube, v1, "crash")
    uid = p.metadata.uid
    os.unlink(f"/tmp/emu-crash-{uid}")
    cs = p.status.container_statuses[0]
    assert p.status.phase == "Succeeded" and cs.restart_count == 1
    assert cs.last_state.terminated.exit_code == 1
    assert v1.read_namespaced_pod_log("crash", namespace_of(kube), previous=True) == "run\n"
    assert any(h.get("containerStatuses", [{}])[0].get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
               for h in kube.history("pods", namespace_of(kube), "crash"))


def test_aio_client_and_watch(kube):
    from kubernetes.aio import client as aclient, config as aconfig, watch as awatch

    async def main():
        cfg = aclient.Configuration()
        await aconfig.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=cfg)
        async with aclient.ApiClient(cfg) as api:
            v1 = aclient.CoreV1Api(api)
            # watch from before the creation: every phase is seen, however fast the pod runs
            since = (await v1.list_namespaced_pod(namespace_of(kube))).metadata.resource_version
            await v1.create_namespaced_pod(namespace_of(kube), pod_body("ap", "echo aio"))
            seen = []
            w = awatch.Watch()
            async for e in w.stream(v1.list_namespaced_pod, namespace_of(kube), field_selector="metadata.name=ap", timeout_seconds=15,
                                    resource_version=since):
                seen.append(e["object"].status.phase)
                if e["object"].status.phase == "Succeeded":
                    w.stop()
            log = await v1.read_namespaced_pod_log("ap", namespace_of(kube))
            return seen, log
    seen, log = asyncio.run(main())
    assert seen[0] == "Pending" and seen[-1] == "Succeeded" and log == "aio\n"


_namespaces_seen: list[str] = []


@pytest.mark.parametrize("turn", ["first", "second"])
def test_each_test_gets_a_namespace_of_its_own_and_leaves_nothing_running(kube, turn):
    """`kube_ns`: one emulator for the session, a fresh namespace per test; the pod the first turn
    leaves running is gone, with its process, before the second turn starts."""
    v1 = kube.core()
    assert kube.namespace not in _namespaces_seen and kube.namespace != "default"
    assert v1.read_namespace(kube.namespace).status.phase == "Active"
    for ns in _namespaces_seen:
        assert v1.list_namespaced_pod(ns).items == []
    assert kube.leftover_processes() == []
    _namespaces_seen.append(kube.namespace)
    v1.create_namespaced_pod(kube.namespace, pod_body("left-running", "sleep 300"))
    wait_phase(kube, v1, "left-running", phases=("Running",))
    assert kube.pod_processes(kube.namespace, "left-running")


def test_a_restart_refuses_connections_and_keeps_its_port(kube_factory):
    """While the API server is down its port stays bound (connections refused, as a restarting server
    answers): a CI run once lost it to another worker's emulator, and the restart never listened again."""
    import socket
    import time

    kube = kube_factory()
    kube.restart(down=3)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # the restart begins once the answer is out
        try:
            socket.create_connection(("127.0.0.1", kube.port), timeout=2).close()
        except ConnectionRefusedError:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the API server never went down")
    other = socket.socket()
    try:
        with pytest.raises(OSError):  # EADDRINUSE: nobody else can listen there meanwhile
            other.bind(("127.0.0.1", kube.port))
    finally:
        other.close()

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", kube.port), timeout=2).close()
            return True
        except OSError:
            return False

    kube.wait_for(listening, 30, what="the API server back on its port")
    assert kube.core().list_namespace().items
