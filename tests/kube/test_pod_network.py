"""The emulator's bridged pod network (`--pod-network bridged`, tests/support/kube/emulator/podnet.py):
every pod in a network namespace of its own on a bridge, pod IPs, Service ClusterIPs and names, no
route to the manager's loopback; and an experiment whose pods reach the hub by a real route (the
user's host on the bridge, a NAT port-forward to the hub on loopback)."""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from nni_manager.service import create_training_service
from tests.support.kube.emulator import podnet
from tests.support.kube.harness import config, pods_service
from tests.support.kube.pods import pod_body, wait_phase
from tests.support.manager.helpers import form, wait_status
from tests.support.bounded import run_bounded

NS = "default"
POD_CIDR = ipaddress.ip_network("10.244.0.0/16")  # netns only
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/12")  # netns only

# answers every connection with the address it came from, then the pod's name
SERVER = ("import os, socket\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', 8080)); s.listen()\n"
          "while True:\n"
          "    c, peer = s.accept(); c.sendall(f'{peer[0]} {os.environ[\"HOSTNAME\"]}'.encode()); c.close()\n")

# dials every target given as JSON [[host, port], ...] (up to argv[2] tries each: a server may still be
# starting); prints {"host:port": answer or error}
CLIENT = ("import json, socket, sys, time\n"
          "out = {}\n"
          "for host, port in json.loads(sys.argv[1]):\n"
          "    for _ in range(int(sys.argv[2])):\n"
          "        try:\n"
          "            with socket.create_connection((host, port), timeout=3) as c:\n"
          "                out[f'{host}:{port}'] = c.recv(200).decode(); break\n"
          "        except OSError as e:\n"
          "            out[f'{host}:{port}'] = f'error: {e}'; time.sleep(0.1)\n"
          "print('RESULT ' + json.dumps(out), flush=True)\n")


def _run_client(kube, v1, name: str, targets: list, ns: str = NS, tries: int = 50) -> dict:
    body = pod_body(name, "", container={"command": ["python3", "-c", CLIENT, json.dumps(targets), str(tries)]})
    v1.create_namespaced_pod(ns, body)
    kube.wait_for(lambda: v1.read_namespaced_pod(name, ns).status.phase in ("Succeeded", "Failed"), 60,
                  what=f"client pod {name} done")
    log = v1.read_namespaced_pod_log(name, ns)
    line = next(x for x in log.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _root_addresses() -> str:
    return subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "route"], capture_output=True, text=True).stdout


def test_pods_reach_each_other_by_pod_ip_and_by_service_name(kube_factory) -> None:
    kube = kube_factory(pod_network="bridged", namespaces=["other"])
    v1 = kube.core()
    v1.create_namespaced_pod(NS, pod_body("web", "", labels={"app": "web"},
                                          container={"command": ["python3", "-c", SERVER],
                                                     "ports": [{"name": "http", "containerPort": 8080}]}))
    web = wait_phase(kube, v1, "web", phases=("Running",), timeout=30)
    web_ip = web.status.pod_ip
    assert ipaddress.ip_address(web_ip) in POD_CIDR, web_ip
    assert [p.ip for p in web.status.pod_ips] == [web_ip]
    svc = v1.create_namespaced_service(NS, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}})
    cluster_ip = svc.spec.cluster_ip
    assert ipaddress.ip_address(cluster_ip) in SERVICE_CIDR, cluster_ip
    names = ["web", "web.default", "web.default.svc", "web.default.svc.cluster.local"]
    got = _run_client(kube, v1, "client", [[web_ip, 8080], [cluster_ip, 80]] + [[n, 80] for n in names])
    client = v1.read_namespaced_pod("client", NS)
    client_ip = client.status.pod_ip
    assert ipaddress.ip_address(client_ip) in POD_CIDR and client_ip != web_ip
    # by pod IP the server sees the client's own pod IP: one namespace, one address per pod
    assert got.pop(f"{web_ip}:8080") == f"{client_ip} web", got
    for target, answer in got.items():  # through the Service (kube-proxy): the web pod answers
        assert answer.endswith(" web"), (target, answer)
    # from another namespace: the short name is not the Service's, the qualified ones are
    other = _run_client(kube, v1, "client2", [["web.default", 80], ["web.default.svc.cluster.local", 80]],
                        ns="other")
    assert all(a.endswith(" web") for a in other.values()), other
    short = _run_client(kube, v1, "client3", [["web", 80]], ns="other", tries=1)
    assert short["web:80"].startswith("error"), short
    # no endpoint (the pod deleted): the ClusterIP refuses
    v1.delete_namespaced_pod("web", NS, grace_period_seconds=0)
    kube.wait_for(lambda: not v1.list_namespaced_pod(NS, label_selector="app=web").items, 30, what="web gone")
    gone = _run_client(kube, v1, "client4", [[cluster_ip, 80]], tries=1)
    assert gone[f"{cluster_ip}:80"].startswith("error"), gone


def test_a_pod_reaches_nothing_in_the_root_namespace(kube_factory) -> None:
    kube = kube_factory(pod_network="bridged")
    v1 = kube.core()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        got = _run_client(kube, v1, "probe", [["127.0.0.1", port], [podnet.HOST_ADDRESS, port]], tries=1)
    assert all(v.startswith("error") for v in got.values()), got
    pod = v1.read_namespaced_pod("probe", NS)
    # the root namespace got no address and no route into the pod network
    root = _root_addresses()
    assert pod.status.pod_ip not in root and "10.244." not in root and "10.96." not in root, root  # not dialed


def test_the_api_server_is_reached_through_the_kubernetes_service(kube_factory) -> None:
    kube = kube_factory(pod_network="bridged")
    v1 = kube.core()
    probe = ("import os, socket\n"
             "h, p = os.environ['KUBERNETES_SERVICE_HOST'], int(os.environ['KUBERNETES_SERVICE_PORT'])\n"
             "socket.create_connection((h, p), timeout=5).close(); print('RESULT ' + h)\n")
    v1.create_namespaced_pod(NS, pod_body("apiprobe", "", container={"command": ["python3", "-c", probe]}))
    pod = wait_phase(kube, v1, "apiprobe", timeout=30)
    assert pod.status.phase == "Succeeded", v1.read_namespaced_pod_log("apiprobe", NS)
    assert "RESULT " + podnet.KUBERNETES_IP in v1.read_namespaced_pod_log("apiprobe", NS)


def test_namespaces_are_deleted_with_their_pod_and_the_emulator(kube_factory) -> None:
    kube = kube_factory(pod_network="bridged")
    v1 = kube.core()
    v1.create_namespaced_pod(NS, pod_body("idle", "sleep 60"))
    wait_phase(kube, v1, "idle", phases=("Running",), timeout=30)
    before = kube.netns()
    assert podnet.prefix(kube.instance) + "br" in before and len(before) == 2, before
    bridge = podnet.prefix(kube.instance) + "br"

    def veths() -> str:
        return subprocess.run(["ip", "-n", bridge, "-o", "link", "show", "type", "veth"],
                              capture_output=True, text=True, check=True).stdout
    assert veths().count("master br0") == 1
    v1.delete_namespaced_pod("idle", NS, grace_period_seconds=0)
    kube.wait_for(lambda: len(kube.netns()) == 1, 30, what="the pod's namespace deleted")
    assert veths() == ""  # its veth pair went with it
    v1.create_namespaced_pod(NS, pod_body("idle2", "sleep 60"))
    wait_phase(kube, v1, "idle2", phases=("Running",), timeout=30)
    assert len(kube.netns()) == 2
    kube.stop()  # SIGTERM, with a pod still running
    assert kube.netns() == []


def test_a_crashed_emulators_namespaces_are_swept_by_the_next_one(kube_factory) -> None:
    crashed = kube_factory(pod_network="bridged")
    v1 = crashed.core()
    v1.create_namespaced_pod(NS, pod_body("idle", "sleep 60"))
    wait_phase(crashed, v1, "idle", phases=("Running",), timeout=30)
    os.kill(crashed.proc.pid, signal.SIGKILL)
    crashed.proc.wait()
    left = crashed.netns()
    assert len(left) == 2, left  # nothing ran its clean-up
    for pid in crashed.leftover_processes():
        os.kill(pid, signal.SIGKILL)
    kube_factory(pod_network="bridged")  # its start sweeps namespaces whose emulator is gone
    assert crashed.netns() == []


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_trials_succeed_over_a_direct_route_to_a_nat_port_forward(kube_factory, base: Path) -> None:
    """The user's host on the pod network (its own namespace on the bridge) forwards a port to the hub,
    which listens on loopback only: nniManagerIp is that address, hubBindAddress 127.0.0.1, no tunnel."""
    kube = kube_factory(pod_network="bridged", host_netns=True)
    port = _free_port()
    host = kube.forward_from_host(port)
    assert host == podnet.HOST_ADDRESS
    cfg = config(kube, base, pods_service(hubPort=port, hubBindAddress="127.0.0.1", hubTunnel=False),
                 trialConcurrency=2, nniManagerIp=host)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            assert not ts._backend.tunnelled
            jobs = [await ts.submit_trial_job(form(i, x=i, steps=2)) for i in range(2)]
            for j in jobs:
                await wait_status(ts, j.id, "SUCCEEDED", timeout=90)
            assert ts.core.hub.public_address == f"{host}:{port}"

    run_bounded(main(), 200)


# PyTorch's rendezvous as torch.distributed makes it: the master listens on MASTER_PORT, every worker
# dials MASTER_ADDR (the operator's headless Service for master-0) and says its rank
RENDEZVOUS = r'''
import os, socket, sys, time
from nni_agent import get_next_parameter, report_intermediate_result
get_next_parameter()
port, world = int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"])
if os.environ["NNI_TRIAL_ROLE"] == "master":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(); s.settimeout(60)
    ranks = []
    for _ in range(world - 1):
        c, peer = s.accept(); ranks.append(c.recv(10).decode() + "@" + peer[0]); c.close()
    print("RENDEZVOUS " + " ".join(sorted(ranks)), flush=True)
else:
    for _ in range(600):  # the master's pod (and so its name) may not be up yet
        try:
            c = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit(4)
    c.sendall(os.environ["RANK"].encode()); c.close()
report_intermediate_result({"default": 1})
'''


def test_pytorchjob_workers_reach_their_master_by_name_over_the_direct_route(kube_factory, tmp_path: Path) -> None:
    from tests.support.kube.operators import experiment, role

    kube = kube_factory(pod_network="bridged", host_netns=True, crd_groups=["kubeflow.org"])
    port = _free_port()
    host = kube.forward_from_host(port)
    cfg = experiment(kube, tmp_path, "kubeflow", manager_ip=host, operator="pytorch-operator", apiVersion="v1",
                     reuseMode=False, master=role(1), worker=role(2), hubPort=port, hubBindAddress="127.0.0.1",
                     hubTunnel=False)
    (tmp_path / "code" / "trial.py").write_text(RENDEZVOUS)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            return (ts.experiment_dir / "trials" / job.id / "replicas" / "master-0" / "trial.stdout").read_text()

    out = run_bounded(main(), 200)
    line = next(x for x in out.splitlines() if x.startswith("RENDEZVOUS "))
    ranks = [r.split("@") for r in line.split()[1:]]
    assert [r for r, _ in ranks] == ["1", "2"], line
    # each worker dialled from its own pod IP on the pod network
    assert len({ip for _, ip in ranks}) == 2 and all(ipaddress.ip_address(ip) in POD_CIDR for _, ip in ranks), line


# FrameworkController's barrier hands every task the pod IPs of its peers (FB_WORKER_IPS): worker-1
# dials worker-0 there and says who it is
PEERS = r'''
import os, socket, sys, time
from nni_agent import get_next_parameter, report_intermediate_result
get_next_parameter()
ips = os.environ["FB_WORKER_IPS"].split(",")
if os.environ["NNI_TRIAL_ROLE_INDEX"] == "0":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 7777)); s.listen(); s.settimeout(60)
    c, peer = s.accept()
    print("PEER " + c.recv(20).decode() + " " + peer[0] + " " + ",".join(ips), flush=True)
    c.close()
else:
    for _ in range(600):
        try:
            c = socket.create_connection((ips[0], 7777), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit(4)
    c.sendall(ips[1].encode()); c.close()
report_intermediate_result({"default": 1})
'''


def test_framework_tasks_reach_each_other_by_the_barriers_pod_ips(kube_factory, tmp_path: Path) -> None:
    from tests.support.kube.operators import experiment, task_role

    kube = kube_factory(pod_network="bridged", host_netns=True, crd_groups=["frameworkcontroller.microsoft.com"])
    port = _free_port()
    host = kube.forward_from_host(port)
    cfg = experiment(kube, tmp_path, "frameworkcontroller", manager_ip=host, reuseMode=False,
                     taskRoles=[task_role("worker", 2, 1, 2)], hubPort=port, hubBindAddress="127.0.0.1",
                     hubTunnel=False)
    (tmp_path / "code" / "trial.py").write_text(PEERS)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            return (ts.experiment_dir / "trials" / job.id / "replicas" / "worker-0" / "trial.stdout").read_text()

    out = run_bounded(main(), 200)
    said, seen_from, ips = next(x for x in out.splitlines() if x.startswith("PEER ")).split()[1:]
    ips = ips.split(",")
    # worker-1 dialled from the pod IP the barrier gave for it: one address per pod, really its own
    assert said == seen_from == ips[1] and ips[0] != ips[1], out
    assert all(ipaddress.ip_address(ip) in POD_CIDR for ip in ips), ips
