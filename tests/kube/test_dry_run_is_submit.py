"""The dry run is what `provision` submits (issue 21): both come from `build_request`, so the pod
and Secret an experiment creates on the emulator are the dry run's, but for what only `start`
knows (the hub's port, the tokens and CA, which the dry run shows as placeholders)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from nni_manager.service import create_training_service
from tests.support.kube.fixtures import KubeNamespace, namespace_of
from tests.support.kube.harness import config, pod_json, pods_service
from tests.support.manager.helpers import form, wait_status



@pytest.fixture
def kube(kube_ns: KubeNamespace) -> KubeNamespace:
    """This module's tests share the session's emulator, each in a namespace of its own."""
    return kube_ns


def _pod_fields(pod: dict[str, Any]) -> dict[str, Any]:
    """What the backend decides of a pod (the API server adds defaults and status to the rest)."""
    c = pod["spec"]["containers"][0]
    return {"name": pod["metadata"]["name"], "labels": pod["metadata"]["labels"],
            "container": {k: c.get(k) for k in ("name", "image", "command", "env", "resources", "volumeMounts")},
            "volumes": pod["spec"]["volumes"], "restartPolicy": pod["spec"]["restartPolicy"]}


def test_created_pod_and_secret_are_the_dry_runs(kube, short_dir: Path) -> None:
    cfg = config(kube, short_dir, pods_service())

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, list[str]]:
        async with create_training_service(cfg) as ts:
            trial = await ts.submit_trial_job(form(0, x=1, steps=1))
            await wait_status(ts, trial.id, "SUCCEEDED", timeout=90)
            env = ts.environments()[0]
            dry = ts.core.backend.render()  # the live backend: its experiment id and agent wheel
            created = [p for p in pod_json(kube, namespace_of(kube)) if p["metadata"]["name"] == dry.requests[-1]["metadata"]["name"]]
            secret = kube.core().read_namespaced_secret(dry.requests[-2]["metadata"]["name"], namespace_of(kube))
            return dry.requests, created, env.members[0].hub_address, sorted(secret.data or {})

    requests, created, hub, secret_keys = asyncio.run(asyncio.wait_for(main(), 150))
    placeholder = ts_hub = "127.0.0.1:<hubPort>"
    assert placeholder in json.dumps(requests) and ts_hub != hub
    rendered = json.loads(json.dumps(requests).replace(placeholder, hub))
    *_, dry_secret, dry_pod = rendered
    assert [r["kind"] for r in rendered] == ["ConfigMap", "Secret", "Pod"]  # the agent ConfigMap: once per experiment
    assert len(created) == 1, [p["metadata"]["name"] for p in pod_json(kube, namespace_of(kube))]
    assert _pod_fields(created[0]) == _pod_fields(dry_pod)
    # the Secret: the same entries, placeholders in the dry run, the minted token and CA when submitted
    assert sorted(dry_secret["stringData"]) == secret_keys
    assert all(v.startswith("<") for v in dry_secret["stringData"].values())
