"""The hub tunnel through the API server (hubTunnel), on an emulator whose pods each live in a network
namespace of their own on a bridge (`pod_network="bridged"`): the manager's loopback, where the hub listens, is out of their reach
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
from tests.support.kube.harness import config, pod_json, pods_service
from tests.support.manager.helpers import form, release, sleeper, until, wait_status
from tests.support.bounded import run_bounded

NS = "default"
T = 90.0


def run(coro: Any) -> Any:
    return run_bounded(coro, 240)


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
    kube = kube_factory(pod_network="bridged")
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
            relay_ip = kube.core().read_namespaced_service(tunnel.relay_name(ts.experiment_id), NS).spec.cluster_ip
            assert relay_ip.startswith("10.96.")  # netns only: a ClusterIP of the bridged pod network
            assert hub.public_address == f"{relay_ip}:{tunnel.AGENT_PORT}"  # the relay Service's
            assert _manager_arg(kube, f"nniexp{ts.experiment_id.lower()}") == hub.public_address
            assert backend._tunnel.paired >= 1
            objs = _relay_objects(kube, ts.experiment_id)
            name = tunnel.relay_name(ts.experiment_id)
            assert objs == {"pods": [name], "services": [name],
                            "configmaps": [tunnel.program_config_map_name(ts.experiment_id)]}
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


def test_non_reuse_trials_succeed_through_the_tunnel(kube_factory, base: Path) -> None:
    """One pod per trial: every trial's agent dials the relay's Service afresh, from a pod with no route
    to the manager (its own network namespace on the emulator's bridge)."""
    kube = kube_factory(pod_network="bridged")
    cfg = config(kube, base, pods_service(reuseMode=False), trialConcurrency=2, nniManagerIp=None)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            assert ts._backend.tunnelled
            jobs = [await ts.submit_trial_job(form(i, x=i, steps=2)) for i in range(3)]
            for j in jobs:
                done = await wait_status(ts, j.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=T)
                assert done.status.value == "SUCCEEDED", done.message
            assert ts._backend._tunnel.paired >= 3
            ips = {p["status"].get("podIP") for p in pod_json(kube) if p["metadata"]["name"].startswith("nni")}
            assert all(ip and ip.startswith("10.244.") for ip in ips), ips  # netns only

    run(main())


def test_metrics_exactly_once_across_dropped_port_forward_streams(kube_factory, base: Path) -> None:
    kube = kube_factory(pod_network="bridged")
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
                await until(lambda paired=paired: tun.paired > paired, T, "the agent back through a new stream")
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


# ----------------------------------------------------------------------------- bind one, advertise another

def _plan(tmp_path: Path, ts: dict[str, Any], ip: str | None) -> Any:
    from nni_manager.backends.registry import backend_class
    from nni_manager.loader import load_config
    from nni_manager.service.hub_setup import plan

    cfg = load_config({"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path),
                       **({"nniManagerIp": ip} if ip else {}),
                       "trainingService": {"platform": "kubernetes", "dockerImage": "x", **ts}})
    return asyncio.run(plan(backend_class("kubernetes")(cfg), None, tmp_path, "exp1"))  # type: ignore[arg-type]


@pytest.mark.parametrize("ip, bind, listen", [
    ("203.0.113.7", None, "0.0.0.0:8443"),  # a public IP or NAT port-forward  # not dialed
    ("nni.example.org", None, "0.0.0.0:8443"),  # a DNS name, e.g. a Service in front of the manager
    ("2001:db8::7", None, "[::]:8443"),  # an IPv6 address  # not dialed
    ("203.0.113.7", "127.0.0.1", "127.0.0.1:8443"),  # hubBindAddress wins  # not dialed
    ("127.0.0.1", None, "127.0.0.1:8443"),  # a loopback address binds itself, never every interface
])
def test_the_hub_binds_one_address_and_advertises_another(tmp_path, ip, bind, listen) -> None:
    from cryptography import x509

    hub = _plan(tmp_path, {"hubPort": 8443, **({"hubBindAddress": bind} if bind else {})}, ip)
    assert (hub.listen, hub.advertise) == (listen, ip)
    cert = x509.load_pem_x509_certificate(hub.tls.certificate)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = [str(v) for v in san.get_values_for_type(x509.IPAddress)] + san.get_values_for_type(x509.DNSName)
    assert ip in names  # the certificate names what agents dial


def test_hub_bind_address_must_be_an_ip_and_the_tunnel_is_kubernetes_only(tmp_path) -> None:
    from nni_manager.loader import load_config

    base = {"trialCommand": "python3 t.py", "trialConcurrency": 1, "trialCodeDirectory": str(tmp_path)}
    with pytest.raises(ConfigError) as e:
        load_config({**base, "trainingService": {"platform": "kubernetes", "dockerImage": "x",
                                                 "hubBindAddress": "nni.example.org"}})
    assert e.value.field == "trainingService.hubBindAddress" and "nniManagerIp" in e.value.fix
    with pytest.raises(ConfigError) as e:
        load_config({**base, "trainingService": {"platform": "local", "hubTunnel": True}})
    assert e.value.field == "trainingService.hubTunnel"


def test_agents_dial_the_advertised_name_while_the_hub_binds_an_address(kube, base: Path) -> None:
    """nniManagerIp `localhost` (a DNS name) is what agents dial and what the certificate names; the hub
    binds 127.0.0.1 (hubBindAddress): the pod's --manager says one, the hub listens on the other."""
    cfg = config(kube, base, pods_service(hubBindAddress="127.0.0.1"), nniManagerIp="localhost")

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=T)
            hub = ts.core.hub
            port = hub.address.rpartition(":")[2]
            assert hub.address == f"127.0.0.1:{port}" and hub.public_address == f"localhost:{port}"
            assert _manager_arg(kube, f"nniexp{ts.experiment_id.lower()}") == f"localhost:{port}"
            assert not ts._backend.tunnelled

    run(main())


# ----------------------------------------------------------------------------- the operators, through the tunnel

@pytest.mark.parametrize("platform", ["kubeflow", "frameworkcontroller"])
def test_operator_trials_succeed_through_the_tunnel(kube_factory, tmp_path: Path, platform: str) -> None:
    from tests.support.kube.operators import experiment, role, task_role

    kube = kube_factory(pod_network="bridged", crd_groups=["kubeflow.org", "frameworkcontroller.microsoft.com"])
    if platform == "kubeflow":  # a pool: both trials on the environments the tunnel already carries
        cfg = experiment(kube, tmp_path, "kubeflow", concurrency=2, manager_ip=None, operator="tf-operator",
                         apiVersion="v1", reuseMode=True, worker=role(2))
    else:  # one Framework per trial: every trial's agents dial the relay afresh
        cfg = experiment(kube, tmp_path, "frameworkcontroller", manager_ip=None, reuseMode=False,
                         taskRoles=[task_role("worker", 2, 1, 1)])

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            assert ts._backend.tunnelled
            jobs = [await ts.submit_trial_job(form(i, linger={"worker-0": 0.3})) for i in range(2)]
            for j in jobs:
                done = await wait_status(ts, j.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=T)
                assert done.status.value == "SUCCEEDED", done.message
            assert ts._backend._tunnel.paired >= 2  # two agents per environment, each through a stream

    run(main())


def test_port_forward_forbidden_is_refused_at_start_naming_it(kube_factory, base: Path) -> None:
    """`create` on pods never grants pods/portforward: the start-time access review names both verbs,
    before any relay object exists (not a relay that never carries an agent)."""
    from nni_manager.backends.kubernetes.client import KubeError
    from tests.support.kube.harness import kubeconfig_with_token

    kube = kube_factory(pod_network="bridged", tokens=[
        "no-pf-token=alice:*/pods,*/secrets,*/configmaps,*/services,*/nodes,*/events"])
    cfg = config(kube, base, pods_service(kubeConfig=str(kubeconfig_with_token(kube, base / "kc", "no-pf-token"))),
                 nniManagerIp=None)

    async def main() -> str:
        ts = create_training_service(cfg)
        with pytest.raises(KubeError) as e:
            await ts.start()
        assert ts._backend._core is None  # its ApiClient closed too: no aiohttp session left unclosed
        return str(e.value)

    msg = run(main())
    denied = [line.strip() for line in msg.splitlines() if line.startswith("  ")]
    assert denied == ["cannot get pods/portforward in namespace default",
                      "cannot create pods/portforward in namespace default"], msg
    pods = [p.metadata.name for p in kube.core().list_namespaced_pod("default").items]
    assert not [n for n in pods if n.startswith("nni-relay-")], pods  # no relay was started
    assert not kube.core().list_namespaced_config_map("default", label_selector="app=nni-experiment").items  # no owner


def test_an_unreadable_hub_certificate_is_one_line_and_leaves_no_relay(kube_factory, base: Path) -> None:
    """The relay is made before the hub's TLS material is read: a `hubKeyFile` gone by start is
    one line naming the field, and the relay just made is removed with the refusal."""
    import subprocess

    tls = base / "tls"
    tls.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(tls / "hub.key"), "-out", str(tls / "hub.crt"), "-days", "1", "-subj", "/CN=hub"],
                   check=True, capture_output=True)
    kube = kube_factory(pod_network="bridged")
    cfg = config(kube, base, pods_service(hubCertFile=str(tls / "hub.crt"), hubKeyFile=str(tls / "hub.key")),
                 nniManagerIp=None)
    (tls / "hub.key").unlink()

    async def main() -> str:
        ts = create_training_service(cfg)
        with pytest.raises(ConfigError) as e:
            await ts.start()
        return str(e.value)

    msg = run(main())
    assert "hubKeyFile" in msg and "cannot be read" in msg and "\n" not in msg, msg
    kube.wait_for(lambda: not [p for p in kube.core().list_namespaced_pod("default").items
                               if p.metadata.name.startswith("nni-relay-")], 30, what="the relay pod is gone")
    # nor the experiment's owner ConfigMap (owner.py)
    assert not kube.core().list_namespaced_config_map("default", label_selector="app=nni-experiment").items
    services = [s.metadata.name for s in kube.core().list_namespaced_service("default").items]
    assert not [n for n in services if n.startswith("nni-relay-")], services
