"""The hub tunnel through the API server (hubTunnel), on an emulator whose pods live in a network
namespace of their own: the manager's loopback, where the hub listens, is out of their reach
(tests/kube/test_portforward.py proves it), so trials succeed only through the relay pod and
`pods/portforward`. The kubeconfig is kind's shape: the API server on 127.0.0.1, no nniManagerIp."""
from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.kubernetes import tunnel
from nni_manager.config import ConfigError
from nni_manager.service import create_training_service
from tests.kube.harness import config, pod_json, pods_service
from tests.manager.helpers import form, release, sleeper, until, wait_status

NS = "default"
T = 90.0


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 240))


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


def _relay_objects(kube: Any, experiment_id: str) -> dict[str, list[str]]:
    core, sel = kube.core(), f"app={tunnel.APP},expId={experiment_id}"
    return {"pods": [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=sel).items],
            "services": [s.metadata.name for s in core.list_namespaced_service(NS, label_selector=sel).items],
            "configmaps": [c.metadata.name for c in core.list_namespaced_config_map(NS, label_selector=sel).items]}


def _manager_arg(kube: Any, prefix: str) -> str:
    for pod in pod_json(kube):
        if pod["metadata"]["name"].startswith(prefix):
            args = pod["spec"]["containers"][0]["command"]
            text = " ".join(args)
            return text.split("--manager", 1)[1].split()[0].strip("'\"")
    raise AssertionError("no agent pod")


def test_trials_succeed_through_the_tunnel_with_a_loopback_api_server(kube_factory, base: Path) -> None:
    kube = kube_factory(pod_network="isolated")
    cfg = config(kube, base, pods_service(), trialConcurrency=2, nniManagerIp=None)
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            backend = ts._backend
            assert backend.tunnelled
            jobs = [await ts.submit_trial_job(form(i, x=10 + i, steps=3)) for i in range(3)]
            for j in jobs:
                await wait_status(ts, j.id, "SUCCEEDED", timeout=T)
            # agents were told the relay's Service, the hub listens elsewhere, on loopback only
            hub = ts.core.hub
            assert hub.address.startswith("127.0.0.1:") and hub.address != "127.0.0.1:4000"
            assert hub.public_address == f"127.0.0.1:{tunnel.AGENT_PORT}"  # the emulator's cluster IP
            assert _manager_arg(kube, f"nniexp{ts.experiment_id.lower()}") == hub.public_address
            assert backend._tunnel.paired >= 1
            objs = _relay_objects(kube, ts.experiment_id)
            assert objs == {k: [tunnel.relay_name(ts.experiment_id)] for k in objs}
            await asyncio.sleep(0.5)
            for j in jobs:
                got = [json.loads(m) for m in metrics[j.id]]
                assert [(g["type"], g["sequence"]) for g in got] == [
                    ("PERIODICAL", 0), ("PERIODICAL", 1), ("PERIODICAL", 2), ("FINAL", 0)], got
            return ts.experiment_id

    experiment_id = run(main())
    empty = {"pods": [], "services": [], "configmaps": []}
    kube.wait_for(lambda: _relay_objects(kube, experiment_id) == empty, 30, what="the relay deleted")
    kube.wait_for(lambda: not kube.leftover_processes(), 30, what="no pod process left")


def test_metrics_exactly_once_across_dropped_port_forward_streams(kube_factory, base: Path) -> None:
    kube = kube_factory(pod_network="isolated")
    cfg = config(kube, base, pods_service(), trialConcurrency=1, nniManagerIp=None)
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            tun = ts._backend._tunnel
            job = await ts.submit_trial_job(sleeper(base, 0, "a", steps=40, step_sleep=0.05))
            await wait_status(ts, job.id, "RUNNING", timeout=T)
            await until(lambda: len(metrics[job.id]) >= 3, T, "first metrics")
            for _ in range(3):  # the API server drops every stream, the agent's included, mid-trial
                paired = tun.paired
                assert kube.drop_port_forwards() >= 1
                await until(lambda: tun.paired > paired, T, "the agent back through a new stream")
                await asyncio.sleep(0.3)
            release(base, "a")
            await wait_status(ts, job.id, "SUCCEEDED", timeout=T)
            await asyncio.sleep(0.5)
            got = [json.loads(m) for m in metrics[job.id]]
            assert [(g["type"], g["sequence"]) for g in got] == [("PERIODICAL", i) for i in range(40)] + [
                ("FINAL", 0)], got

    run(main())


def test_a_setup_that_cannot_work_is_refused_at_start(kube, base: Path) -> None:
    """kind's kubeconfig (API server on 127.0.0.1), hubTunnel off, no nniManagerIp: pods would dial their
    own loopback; refused at once with the fix."""
    cfg = config(kube, base, pods_service(hubTunnel=False), nniManagerIp=None)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            await ts.submit_trial_job(form(0))

    with pytest.raises(ConfigError) as e:
        run(main())
    text = str(e.value)
    assert "hubTunnel" in text and "loopback" in text and "nniManagerIp" in text, text


def test_dry_run_prints_the_relay_objects(kube, base: Path) -> None:
    from nni_manager.backends.registry import backend_class

    cfg = config(kube, base, pods_service(), nniManagerIp=None)
    dry = backend_class("kubernetes")(cfg).render()
    kinds = [o["kind"] for o in dry.requests]
    assert kinds[:3] == ["ConfigMap", "Pod", "Service"] and "nni-relay-" in dry.text and "portforward" in dry.text
    relay_pod = dry.requests[1]
    assert relay_pod["spec"]["containers"][0]["image"] == tunnel.DEFAULT_IMAGE
    # with nniManagerIp the hub is dialled directly: no relay
    direct = backend_class("kubernetes")(config(kube, base, pods_service())).render()
    assert "Service" not in [o["kind"] for o in direct.requests]
