"""The dry run prints every object an experiment creates, named as the run names them: compared
with what a real run on the emulator creates (kinds, names, labels), the secrets' content never printed."""
from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.kubernetes.common import DRY_RUN_TRIAL
from nni_manager.backends.registry import backend_class
from nni_manager.service import create_training_service
from tests.support.kube.fixtures import KubeNamespace, namespace_of
from tests.support.kube.harness import config, ours, pods_service
from tests.support.manager.helpers import form, wait_status



@pytest.fixture
def kube(kube_ns: KubeNamespace) -> KubeNamespace:
    """This module's tests share the session's emulator, each in a namespace of its own."""
    return kube_ns


def _created(kube: Any, experiment_id: str) -> dict[str, dict[str, dict[str, str]]]:
    """kind -> name -> labels of what the experiment created (all are labelled as ours)."""
    core = kube.core()
    sel = ours(experiment_id)
    out: dict[str, dict[str, dict[str, str]]] = {}
    for kind, items in (("Pod", core.list_namespaced_pod(namespace_of(kube), label_selector=sel).items),
                        ("Secret", core.list_namespaced_secret(namespace_of(kube), label_selector=sel).items),
                        ("ConfigMap", core.list_namespaced_config_map(namespace_of(kube), label_selector=sel).items)):
        out[kind] = {o.metadata.name: dict(o.metadata.labels or {}) for o in items}
    return out


def _as_run(value: str, experiment_id: str, trial_id: str) -> str:
    """A dry-run name or label value as the run spells it for this experiment and trial."""
    return (value.replace("dryrun", experiment_id.lower() if value != "dryrun" else experiment_id)
            .replace(DRY_RUN_TRIAL.lower(), trial_id.lower()).replace(DRY_RUN_TRIAL, trial_id))


def test_dry_run_objects_are_what_a_non_reuse_run_creates(kube, tmp_path: Path) -> None:
    auth = tmp_path / "docker-config.json"
    secret_auth = base64.b64encode(b"user:registry-password").decode()
    auth.write_text(json.dumps({"auths": {"registry.example": {"auth": secret_auth}}}))
    cfg = config(kube, tmp_path, pods_service(reuseMode=False, privateRegistryAuthPath=str(auth)))
    dry = backend_class("kubernetes")(cfg).render()
    kinds = [o["kind"] for o in dry.requests]
    assert kinds == ["ConfigMap", "Secret", "Secret", "Pod"], kinds  # agent, pull secret, token, the trial's pod
    assert secret_auth not in dry.text and "registry-password" not in dry.text  # credentials never printed
    pull = dry.requests[1]
    assert pull["type"] == "kubernetes.io/dockerconfigjson"
    pod = dry.requests[-1]
    assert pod["spec"]["imagePullSecrets"] == [{"name": pull["metadata"]["name"]}]
    assert pod["metadata"]["labels"]["trialId"] == DRY_RUN_TRIAL and f"a trial with id {DRY_RUN_TRIAL}" in dry.text
    core = kube.core()  # every object passes the API server's own validation
    for obj in dry.requests:
        create = {"ConfigMap": core.create_namespaced_config_map, "Secret": core.create_namespaced_secret,
                  "Pod": core.create_namespaced_pod}[obj["kind"]]
        create(namespace_of(kube), obj, dry_run="All", field_validation="Strict")

    async def run() -> tuple[str, str, dict[str, Any], Any]:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, step_sleep=3))  # running while we look
            await wait_status(ts, job.id, "RUNNING", timeout=90)
            created = _created(kube, ts.experiment_id)
            pods = core.list_namespaced_pod(namespace_of(kube), label_selector=ours(ts.experiment_id)).items
            return ts.experiment_id, job.id, created, pods[0].spec.image_pull_secrets

    exp, trial, created, pulls = asyncio.run(run())
    expected: dict[str, dict[str, dict[str, str]]] = {"Pod": {}, "Secret": {}, "ConfigMap": {}}
    for obj in dry.requests:
        name = _as_run(obj["metadata"]["name"], exp, trial)
        expected[obj["kind"]][name] = {k: _as_run(v, exp, trial) for k, v in obj["metadata"]["labels"].items()}
    assert created == expected  # same objects, same names, same labels
    assert [p.name for p in pulls] == [_as_run(pull["metadata"]["name"], exp, trial)]


def test_dry_run_of_a_pool_names_its_first_environment(kube, tmp_path: Path) -> None:
    cfg = config(kube, tmp_path, pods_service(reuseMode=True))
    dry = backend_class("kubernetes")(cfg).render()
    assert [o["kind"] for o in dry.requests] == ["ConfigMap", "Secret", "Pod"]
    pod = dry.requests[-1]
    assert "trialId" not in pod["metadata"]["labels"] and pod["metadata"]["labels"]["envId"] == "env1"
    assert "a pool of up to" in dry.text
