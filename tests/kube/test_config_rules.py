"""Config the cluster would reject is refused at load, naming the field and the fix (issue 18);
IPv6 manager addresses are bracketed wherever an agent dials them or a certificate names them.
The emulator only where the API server's answer or a real dial (IPv6 loopback) is the point."""
from __future__ import annotations

import asyncio
import copy
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.backends.registry import backend_class
from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.hub.address import advertised, bare_host, host_port
from nni_manager.service.hub_setup import plan
from tests.support.kube.emulator import crds
from tests.support.bounded import run_bounded

FC = ("frameworkcontroller.microsoft.com", "v1")


def _fc(tmp_path: Path, *names: str) -> dict[str, Any]:
    return {"trialConcurrency": 1, "trialCodeDirectory": str(tmp_path), "trainingService": {
        "platform": "frameworkcontroller",
        "taskRoles": [{"name": n, "taskNumber": 1, "command": "python3 t.py", "cpuNumber": 1, "memorySize": "1gb",
                       "gpuNumber": 0} for n in names]}}


@pytest.mark.parametrize("bad", ["ps-1", "Worker", "work_er", "w" * 64])
def test_task_role_name_outside_the_crd_pattern_is_refused(tmp_path, bad):
    with pytest.raises(ConfigError) as info:
        load_config(_fc(tmp_path, "worker", bad))
    assert info.value.field == "trainingService.taskRoles[1].name"
    assert "^[a-z0-9]{1,63}$" in str(info.value) and "rename it" in info.value.fix


def test_task_role_name_fix_suggests_a_valid_name(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(_fc(tmp_path, "param-server"))
    assert "`name: paramserver`" in info.value.fix
    assert load_config(_fc(tmp_path, "paramserver", "w" * 63)).training_service.options.roles[1].name == "w" * 63


def test_the_rule_is_the_pinned_crd_schema():
    """The load-time rule is the CRD's: if the schema's pattern changes, this fails."""
    from nni_manager.backends.kubernetes.config import TASK_ROLE_NAME

    schema = crds.load_schema(crds.FRAMEWORKS)
    role = schema["properties"]["spec"]["properties"]["taskRoles"]["items"]
    assert role["properties"]["name"]["pattern"] == TASK_ROLE_NAME


def test_the_emulated_api_server_answers_422_for_a_dash(kube_crd_ns):
    """What a user without the load-time check would get: the API server's schema error."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    kube = kube_crd_ns  # a dry run and a refused create: nothing is stored in "default"
    path = crds.schemas_dir() / "examples/frameworkcontroller/example__framework__basic__batchsucceeded.yaml"
    good = yaml.safe_load(path.read_text())
    api = client.CustomObjectsApi(kube.api_client())
    accepted = api.create_namespaced_custom_object(*FC, "default", "frameworks", copy.deepcopy(good), dry_run="All")
    assert accepted["metadata"]["name"] == good["metadata"]["name"]
    bad = copy.deepcopy(good)
    bad["spec"]["taskRoles"][0]["name"] = "ps-1"
    with pytest.raises(ApiException) as info:
        api.create_namespaced_custom_object(*FC, "default", "frameworks", bad)
    assert info.value.status == 422
    assert "spec.taskRoles[0].name" in info.value.body and "^[a-z0-9]{1,63}$" in info.value.body


def _pytorch(master_replicas: int) -> dict[str, Any]:
    role = {"command": "python3 t.py", "cpuNumber": 1, "memorySize": "1gb"}
    return {"trialConcurrency": 1, "trainingService": {
        "platform": "kubeflow", "operator": "pytorch-operator", "apiVersion": "v1",
        "master": {"replicas": master_replicas, **role}, "worker": {"replicas": 2, **role}}}


@pytest.mark.parametrize("replicas", [2, 3])
def test_pytorchjob_master_must_be_one_replica(tmp_path, replicas):
    with pytest.raises(ConfigError) as info:
        load_config(_pytorch(replicas), base_dir=tmp_path)
    assert info.value.field == "trainingService.master.replicas"
    assert f"is {replicas}" in str(info.value) and "master.replicas: 1" in info.value.fix
    ok = load_config(_pytorch(1), base_dir=tmp_path).training_service.options
    assert sorted((r.name, r.replicas) for r in ok.roles) == [("master", 1), ("worker", 2)]


def test_tfjob_workers_are_not_limited(tmp_path):
    role = {"command": "python3 t.py", "cpuNumber": 1, "memorySize": "1gb"}
    cfg = load_config({"trialConcurrency": 1, "trainingService": {
        "platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1",
        "worker": {"replicas": 3, **role}}}, base_dir=tmp_path)
    assert cfg.training_service.options.roles[0].replicas == 3


# ----------------------------------------------------------------------------- IPv6 manager addresses

@pytest.mark.parametrize("host,expected", [("fd00::5", "[fd00::5]:8443"), ("[fd00::5]", "[fd00::5]:8443"),
                                           ("10.0.0.5", "10.0.0.5:8443"),  # not dialed: rendering only
                                           ("manager.example", "manager.example:8443")])
def test_host_port_brackets_ipv6_only(host, expected):
    assert host_port(host, 8443) == expected
    assert bare_host(expected.rpartition(":")[0]) == host.strip("[]")


def _agent_args(obj: dict[str, Any]) -> list[str]:
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["taskRoles"][0]["task"]["pod"]["spec"]
    return spec["containers"][0]["command"]


@pytest.mark.parametrize("platform", ["kubernetes", "frameworkcontroller"])
@pytest.mark.parametrize("written", ["fd00::5", "[fd00::5]"])
def test_ipv6_manager_address_is_bracketed_in_the_agent_command(tmp_path, platform, written):
    ts: dict[str, Any] = {"platform": platform, "hubPort": 8443}
    if platform == "frameworkcontroller":
        ts["taskRoles"] = _fc(tmp_path, "worker")["trainingService"]["taskRoles"]
    cfg = load_config({"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path),
                       "nniManagerIp": written, "trainingService": ts})
    main = backend_class(platform)(cfg).render().requests[-1]
    args = _agent_args(main)
    assert args[args.index("--manager") + 1] == "[fd00::5]:8443"


def test_ipv6_hub_address_and_certificate_names(tmp_path):
    """The hub's address is bracketed and its certificate names the bare IPv6 address (rendering only:
    fd00::5 is never dialled; the hub is not started)."""
    from cryptography import x509

    cfg = load_config({"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path),
                       "nniManagerIp": "fd00::5", "trainingService": {"platform": "kubernetes", "hubPort": 8443}})
    backend = backend_class("kubernetes")(cfg)
    hub = asyncio.run(plan(backend, None, tmp_path, "exp1"))  # type: ignore[arg-type]
    # fd00::5 is advertised, not bound: the hub listens on every IPv6 interface at hubPort
    assert (hub.listen, hub.advertise) == ("[::]:8443", "fd00::5")
    assert advertised(hub.advertise, 8443) == "[fd00::5]:8443"
    tls = hub.tls
    assert tls is not None
    cert = x509.load_pem_x509_certificate(tls.certificate)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("fd00::5") in san.get_values_for_type(x509.IPAddress)
    assert not [n for n in san.get_values_for_type(x509.DNSName) if ":" in n]


def test_agents_dial_an_ipv6_manager(kube, tmp_path):
    """End to end on IPv6 loopback: pods (host network in the emulator) dial `[::1]:<port>` over TLS
    and verify the hub's certificate for the address ::1."""
    from nni_manager.service import create_training_service
    from tests.support.kube.harness import config, pods_service
    from tests.support.manager.helpers import form, wait_status

    cfg = config(kube, tmp_path, pods_service(reuseMode=False), nniManagerIp="::1")

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            (pod,) = kube.core().list_namespaced_pod("default", label_selector=f"trialId={job.id}").items
            args = pod.spec.containers[0].command
            assert args[args.index("--manager") + 1].startswith("[::1]:")

    run_bounded(body(), 120)


def test_v1_pvc_section_only_with_storage_pvc(tmp_path):
    """v1's `pvc: {path}` says where a Framework template mounts its claim; anywhere else it is refused."""
    base = {"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path)}
    with pytest.raises(ConfigError) as info:
        load_config({**base, "trainingService": {"platform": "kubernetes", "pvc": {"path": "/tmp/data"}}})
    assert info.value.field == "trainingService.pvc" and "storage: pvc" in info.value.fix
    ok = load_config({**base, "trainingService": {"platform": "kubernetes", "storage": "pvc", "pvc": {"path": "/tmp/data"}}})
    storage = ok.training_service.options.storage
    assert (storage.kind, storage.path, storage.claim_name) == ("pvc", "/tmp/data", "")
    pod = backend_class("kubernetes")(ok).render().requests[-1]
    assert not [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]  # the template mounts it
