"""The agent's dependencies shipped through ConfigMaps to an image that lacks them (issue 19, item 3).

The image `python:3.11-slim` of the emulator is the system Python alone (no grpcio, protobuf,
psutil; not the test's environment). The manager learns its Python from a probe pod, resolves
wheels from `agentWheelhouse` (downloads are off in tests) and ships them in ConfigMaps of one
piece each, every one under the API server's 1 MiB limit; trials SUCCEED. A second experiment
starts no probe and uploads nothing. The emulator refuses what the API server refuses: objects
over 1 MiB of data, request bodies over 3 MiB."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends import agent_deps
from nni_manager.service import create_training_service
from tests.support import trial_isolation
from tests.support.kube.harness import SLIM_IMAGE, config, pods_service
from tests.support.manager.helpers import form, wait_status
from tests.support.bounded import run_bounded

NS = "default"
T = 90.0
# filled by scripts/test.sh (scripts/fill_wheelhouse.py) for /usr/bin/python3, the slim image's Python
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"


def run(coro: Any) -> Any:
    return run_bounded(coro, 240)


def deps_config_maps(kube: Any) -> dict[str, str]:
    """name -> resourceVersion of the dependency ConfigMaps in the namespace."""
    items = kube.core().list_namespaced_config_map(NS, label_selector="app=nni-agent-deps").items
    return {c.metadata.name: c.metadata.resource_version for c in items}


def probes_scheduled(kube: Any, experiment_id: str) -> set[str]:
    prefix = f"nni-probe-{experiment_id.lower()}"
    return {e.involved_object.name for e in kube.core().list_namespaced_event(NS).items
            if e.reason == "Scheduled" and e.involved_object.name.startswith(prefix)}


def test_bare_image_runs_trials_with_dependencies_shipped_in_config_maps(kube, short_dir: Path, monkeypatch) -> None:
    if not any(WHEELHOUSE.glob("grpcio-*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    # the manager's own cache (wheels, probes) starts empty and stays this test's: other tests
    # expect a manager with no wheels
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short_dir / "wheel-cache"))
    cfg = config(kube, short_dir, pods_service(dockerImage=SLIM_IMAGE), agentWheelhouse=str(WHEELHOUSE),
                 trialConcurrency=2)

    async def experiment(first: bool) -> None:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i)) for i in range(2)]
            for t in trials:
                d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
                assert d.status.value == "SUCCEEDED", d.message
            assert bool(probes_scheduled(kube, ts.experiment_id)) == first  # cached after the first
        return None

    run(experiment(True))
    shipped = deps_config_maps(kube)
    assert len(shipped) >= 3, shipped  # grpcio alone is several pieces
    total = 0
    for name in shipped:
        cm = kube.core().read_namespaced_config_map(name, NS)
        assert not cm.data and len(cm.binary_data) == 1 and cm.immutable is True, name
        size = len(base64.b64decode(next(iter(cm.binary_data.values()))))
        assert 0 < size <= 900 * 1024, (name, size)
        total += size
    assert total > 1024 * 1024

    run(experiment(False))  # the second experiment: same objects, not re-created
    assert deps_config_maps(kube) == shipped


def test_trials_import_the_images_old_protobuf_while_the_agent_runs_with_its_shipped_one(
        kube, short_dir: Path, monkeypatch) -> None:
    """The image's Python has protobuf 3.19 (on the pods' PYTHONPATH, `agentEnv`; NNI's default
    image has it in site-packages) and nothing else: the agent runs with the protobuf shipped in ConfigMaps; the
    trial (the image's Python, an old-style `_pb2` module) sees none of the agent's path and
    SUCCEEDS (tests/support/trial_isolation.py)."""
    if not any(WHEELHOUSE.glob("grpcio-*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    old = trial_isolation.old_protobuf()
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short_dir / "wheel-cache"))
    trial = trial_isolation.write_trial(short_dir / "isolation-code")
    cfg = config(kube, short_dir, pods_service(dockerImage=SLIM_IMAGE, agentEnv={"PYTHONPATH": str(old)}),
                 agentWheelhouse=str(WHEELHOUSE), trialCodeDirectory=str(short_dir / "isolation-code"),
                 trialCommand=f"python3 {trial}")

    async def experiment() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
            assert d.status.value == "SUCCEEDED", d.message

    run(experiment())
    assert deps_config_maps(kube)  # the agent had its own, shipped


def test_emulator_refuses_objects_over_one_mib_and_bodies_over_three(kube) -> None:
    from kubernetes.client.exceptions import ApiException

    big = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "too-big"},
           "binaryData": {"x": base64.b64encode(b"\0" * (1024 * 1024 + 1)).decode()}}
    with pytest.raises(ApiException) as e:
        kube.core().create_namespaced_config_map(NS, big)
    assert e.value.status == 422 and "must have at most 1048576 bytes" in e.value.body, e.value.body
    fits = dict(big, metadata={"name": "fits"}, binaryData={"x": base64.b64encode(b"\0" * (1024 * 1024)).decode()})
    kube.core().create_namespaced_config_map(NS, fits)  # 1 MiB decoded (1.33 MiB of base64) is allowed
    huge = dict(big, metadata={"name": "huge"}, data={"x": "y" * (3 * 1024 * 1024)}, binaryData=None)
    with pytest.raises(ApiException) as e:
        kube.core().create_namespaced_config_map(NS, huge)
    assert e.value.status == 413 and "Request entity too large: limit is 3145728" in e.value.body, e.value.body


def test_emulator_keeps_immutable_config_maps_as_the_api_server_does(kube) -> None:
    """`immutable: true`: a replace that changes the data or the flag is 422 (ValidateConfigMapUpdate's
    words); the same content is accepted; delete and create again is allowed."""
    from kubernetes.client.exceptions import ApiException

    core = kube.core()
    body = {"metadata": {"name": "frozen"}, "immutable": True, "data": {"a": "1"}}
    core.create_namespaced_config_map(NS, body)
    core.replace_namespaced_config_map("frozen", NS, body)  # unchanged: fine
    for change in ({"data": {"a": "2"}}, {"immutable": False}):
        with pytest.raises(ApiException) as refused:
            core.replace_namespaced_config_map("frozen", NS, {**body, **change})
        assert refused.value.status == 422
        assert "field is immutable when `immutable` is set" in refused.value.body
    core.delete_namespaced_config_map("frozen", NS)
    core.create_namespaced_config_map(NS, {**body, "data": {"a": "2"}})
    assert core.read_namespaced_config_map("frozen", NS).data == {"a": "2"}
