"""The emulator's `pods/portforward` (websocket v4.channel.k8s.io) through the official client's
`kubernetes.stream.portforward`, dialled inside the pod's own network namespace on the bridged pod
network (which has no route to the manager's loopback)."""
from __future__ import annotations

import socket
import time

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward

from tests.support.kube.pods import pod_body, wait_phase

NS = "default"
ECHO = ("import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', 7071)); s.listen()\n"
        "while True:\n"
        "    c,_=s.accept(); d=c.recv(100); c.sendall(b'pod says '+d); c.close()\n")


def _running(kube, v1, name):
    return wait_phase(kube, v1, name, phases=("Running",), timeout=30)


def _forwarded(kube, v1, name, port):
    pf = portforward(v1.connect_get_namespaced_pod_portforward, name, NS, ports=str(port))
    return pf, pf.socket(port)


def test_portforward_reaches_a_port_on_the_pods_own_loopback(kube_factory):
    kube = kube_factory(pod_network="bridged")
    v1 = kube.core()
    v1.create_namespaced_pod(NS, pod_body("echo", "", container={"command": ["python3", "-c", ECHO]}))
    _running(kube, v1, "echo")
    deadline = time.monotonic() + 20
    while True:  # the server may still be starting: a refused forward shows on the error channel
        pf, sock = _forwarded(kube, v1, "echo", 7071)
        sock.settimeout(10)
        got = b""
        try:
            # inside the try: while the server is not listening yet the forward fails, the client
            # closes the local end, and the send itself can meet a broken pipe (the old flake)
            sock.sendall(b"hello")
            while len(got) < len(b"pod says hello"):
                chunk = sock.recv(100)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        sock.close()
        if got or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert got == b"pod says hello"
    v1.delete_namespaced_pod("echo", NS, grace_period_seconds=0)


def test_portforward_to_a_closed_port_reports_on_the_error_channel(kube_factory):
    kube = kube_factory(pod_network="bridged")
    v1 = kube.core()
    v1.create_namespaced_pod(NS, pod_body("idle", "sleep 60"))
    _running(kube, v1, "idle")
    pf, sock = _forwarded(kube, v1, "idle", 7072)
    sock.settimeout(10)
    assert sock.recv(10) == b""  # the forward failed: the client closes the local end
    deadline = time.monotonic() + 10
    while pf.error(7072) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "7072" in (pf.error(7072) or "")
    v1.delete_namespaced_pod("idle", NS, grace_period_seconds=0)


@pytest.mark.parametrize("gate", [False, True], ids=["before-1.35", "1.35"])
def test_portforward_is_authorized_by_the_upgrades_verb(kube_factory, gate: bool):
    """A WebSocket upgrade is a GET: RBAC checks `get` on pods/portforward (`create` on pods, or on
    pods/portforward alone, never grants it); 1.35's AuthorizePodWebsocketUpgradeCreatePermission
    also checks `create`."""
    from tests.support.kube.policy import set_policy

    kube = kube_factory(tokens=["viewer-token=viewer:get/pods,list/pods,create/pods",
                                "create-token=creator:get/pods,create/pods/portforward",
                                "get-token=getter:get/pods,get/pods/portforward",
                                "both-token=both:get/pods,get/pods/portforward,create/pods/portforward"])
    set_policy(kube, websocketCreateCheck=gate)
    admin = kube.core()
    admin.create_namespaced_pod(NS, pod_body("idle", "", container={"command": ["python3", "-c", ECHO]}))
    _running(kube, admin, "idle")

    def forwards(token: str) -> bool:
        """Whether the API server accepts the upgrade (the handshake is made at once)."""
        try:
            pf = portforward(kube.core(token).connect_get_namespaced_pod_portforward, "idle", NS, ports="7071")
        except ApiException as e:
            assert "403" in str(e), e  # the client wraps the refused upgrade (status 0, "Handshake status 403")
            return False
        pf.close()
        return True

    got = {t: forwards(f"{t}-token") for t in ("viewer", "create", "get", "both")}
    assert got == {"viewer": False, "create": False, "get": not gate, "both": True}, got
    admin.delete_namespaced_pod("idle", NS, grace_period_seconds=0)


def test_bridged_pods_cannot_reach_the_hosts_loopback(kube_factory):
    kube = kube_factory(pod_network="bridged")
    v1 = kube.core()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = (f"import socket,sys\ns=socket.socket(); s.settimeout(3)\n"
                 f"sys.exit(0 if s.connect_ex(('127.0.0.1', {port})) else 1)\n")
        v1.create_namespaced_pod(NS, pod_body("probe", "", container={"command": ["python3", "-c", probe]}))
        pod = wait_phase(kube, v1, "probe", timeout=30)
        assert pod.status.phase == "Succeeded"  # exit 0: refused, the host's loopback is not the pod's
    # and the same probe on the default (host) pod network does connect: the test can fail
    host = kube_factory()
    hv1 = host.core()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = (f"import socket,sys\ns=socket.socket(); s.settimeout(3)\n"
                 f"sys.exit(0 if s.connect_ex(('127.0.0.1', {port})) else 1)\n")
        hv1.create_namespaced_pod(NS, pod_body("probe", "", container={"command": ["python3", "-c", probe]}))
        pod = wait_phase(host, hv1, "probe", timeout=30)
        assert pod.status.phase == "Failed"


def test_portforward_to_an_evicted_pod_is_the_kubelets_500(kube_factory):
    """The API server hands the upgrade to the kubelet, which has no running sandbox for an evicted
    pod: 500 with its bare error text (streaming/errors.go), not the 400 an unscheduled pod gets."""
    kube = kube_factory(pod_network="bridged")
    v1 = kube.core()
    v1.create_namespaced_pod(NS, pod_body("idle", "", container={"command": ["python3", "-c", ECHO]}))
    _running(kube, v1, "idle")
    pf, sock = _forwarded(kube, v1, "idle", 7071)  # accepted while it runs
    sock.close()
    pf.close()
    kube.evict(NS, "idle")
    wait_phase(kube, v1, "idle", phases=("Failed",), timeout=30)
    with pytest.raises(ApiException) as e:
        portforward(v1.connect_get_namespaced_pod_portforward, "idle", NS, ports="7071")
    assert "500" in str(e.value) and f'pod not found ("idle_{NS}")' in str(e.value), e.value
    # a pod no node can hold stays unscheduled: the API server itself answers 400
    v1.create_namespaced_pod(NS, pod_body("huge", "sleep 60", container={
        "resources": {"requests": {"cpu": "100000"}}}))
    kube.wait_for(lambda: any(ev.reason == "FailedScheduling" for ev in v1.list_namespaced_event(NS).items
                              if ev.involved_object.name == "huge"), 30, what="huge unschedulable")
    with pytest.raises(ApiException) as e:
        portforward(v1.connect_get_namespaced_pod_portforward, "huge", NS, ports="7071")
    assert "400" in str(e.value) and "does not have a host assigned" in str(e.value), e.value
    for name in ("idle", "huge"):
        v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)
