"""Fixtures `kube` and `kube_factory`: a Kubernetes API server emulator in its own process."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import ssl
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.emulators import EmulatorHandle, emulator_factory, start_emulator_process
from tests.support.images import SLIM_IMAGE, slim_python_dir
from tests.support.schemas import schemas_dir

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = str(Path(sys.executable).parent)



class Kube(EmulatorHandle):
    """A running emulator. See tests/support/kube/emulator/README.md."""

    marker = "KUBE_EMULATOR_INSTANCE"

    def __init__(self, state_dir: Path, proc: subprocess.Popen, token: str, instance: str):
        self.state_dir, self.proc, self.token, self.instance = state_dir, proc, token, instance
        self.kubeconfig = state_dir / "kubeconfig"
        self.port = int((state_dir / "port").read_text())
        self.url = f"https://127.0.0.1:{self.port}"
        self._ssl = ssl.create_default_context(cafile=str(state_dir / "ca.crt"))

    # ------------------------------------------------------------ clients
    def api_client(self, token: str | None = None):
        from kubernetes import client, config
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        if token is not None:
            cfg.api_key = {"BearerToken": "Bearer " + token, "authorization": "Bearer " + token}
            cfg.api_key_prefix = {}
            cfg.refresh_api_key_hook = None
        return client.ApiClient(cfg)

    def core(self, token: str | None = None):
        from kubernetes import client
        return client.CoreV1Api(self.api_client(token))

    def raw(self, method: str, path: str, body=None, query: list | None = None, headers: dict | None = None):
        """A request through the official client's transport, without its model validation (to send what
        the typed API refuses, e.g. unknown fields). Returns (status, headers, body bytes)."""
        api = self.api_client()
        m, url, h, b, post = api.param_serialize(method, path, query_params=query or [],
                                                 header_params=dict(headers or {}), body=body,
                                                 auth_settings=["BearerToken"])
        r = api.call_api(m, url, h, b, post)
        r.read()
        return r.status, r.getheaders(), r.data

    # ------------------------------------------------------------ controls
    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self._ssl, timeout=30) as r:
            return json.loads(r.read())

    def oom_kill(self, ns: str, pod: str, container: str | None = None) -> None:
        self._call("POST", f"/emulator/v1/namespaces/{ns}/pods/{pod}/oomkill", {"container": container})

    def evict(self, ns: str, pod: str, message: str | None = None) -> None:
        self._call("POST", f"/emulator/v1/namespaces/{ns}/pods/{pod}/evict", {"message": message})

    def node_lost(self, node: str) -> None:
        self._call("POST", f"/emulator/v1/nodes/{node}/lost", {})

    def set_node(self, name: str, cpu=None, memory=None, gpus=None, labels: dict | None = None) -> None:
        self._call("PUT", f"/emulator/v1/nodes/{name}", {"cpu": cpu, "memory": memory, "gpus": gpus, "labels": labels})

    def pod_processes(self, ns: str, pod: str) -> list[int]:
        return self._call("GET", f"/emulator/v1/namespaces/{ns}/pods/{pod}/processes")["pids"]

    def issue_token(self, user: str = "rotated-user", lifetime: float = 600) -> str:
        """A bearer token from the emulator's identity provider (what OIDC / exec plugins obtain)."""
        return self._call("POST", "/emulator/v1/tokens", {"user": user, "lifetime": lifetime})["token"]

    def revoke_token(self, token: str) -> bool:
        """The identity provider revokes an issued token: the API server answers 401 to it from now on."""
        return self._call("POST", "/emulator/v1/tokens/revoke", {"token": token})["revoked"]

    # ------------------------------------------------------------ the OIDC issuer (emulator/oidc.py)
    @property
    def oidc_issuer(self) -> str:
        return self.url + "/oidc"

    def oidc_login(self, user: str, *, email: str | None = None, groups: list[str] = (), client_id: str = "kubernetes",
                   client_secret: str | None = None, lifetime: float = 3600,
                   refresh_lifetime: float | None = None) -> dict:
        """A user's login at the issuer: {"issuer", "idToken", "refreshToken"} (what `kubectl oidc-login`
        writes into the kubeconfig); registers the client with its secret. `refresh_lifetime`: that of
        the id-tokens its refreshes return (default `lifetime`)."""
        return self._call("POST", "/emulator/v1/oidc/login", {
            "user": user, "email": email, "groups": list(groups), "clientId": client_id,
            "clientSecret": client_secret, "lifetime": lifetime, "refreshLifetime": refresh_lifetime})

    def oidc_revoke(self, user: str) -> int:
        """The issuer's administrator ends every session of `user` (their refresh tokens stop working)."""
        return self._call("POST", "/emulator/v1/oidc/revoke", {"user": user})["revoked"]

    def oidc_apiserver(self, client_id: str = "kubernetes", username_claim: str = "sub",
                       username_prefix: str | None = None, groups_claim: str | None = "groups") -> None:
        """The API server's --oidc-client-id / --oidc-username-claim / -prefix / --oidc-groups-claim."""
        self._call("PUT", "/emulator/v1/oidc/apiserver", {"clientId": client_id, "usernameClaim": username_claim,
                                                          "usernamePrefix": username_prefix, "groupsClaim": groups_claim})

    def oidc_stats(self) -> dict:
        """{"issuer", "refreshGrants": answered refresh grants, "refused": {error: count}}."""
        return self._call("GET", "/emulator/v1/oidc")

    def drop_port_forwards(self) -> int:
        """End every open `pods/portforward` stream (an API server restart, a proxy timing out)."""
        return self._call("POST", "/emulator/v1/portforward/drop", {})["dropped"]

    def history(self, kind: str, ns: str | None, name: str) -> list[dict]:
        """Every distinct .status the object went through; kind is the plural ('pods', 'tfjobs')."""
        return self._call("GET", f"/emulator/v1/history/{kind}/{ns or '-'}/{name}")["statuses"]

    def storm(self, status: int, count: int, retry_after: int = 1, path: str = "", method: str = "") -> None:
        """The next `count` API requests (with `method`, whose path `path`, a regular expression, is
        found in) answer `status` (429 with Retry-After); a count of 0 ends the storm."""
        self._call("POST", "/emulator/v1/faults/storm", {"status": status, "count": count,
                                                         "retryAfter": retry_after, "path": path, "method": method})

    def faults(self) -> dict:
        """{"answered": {"429": n, ...}, "left": requests the current storm will still answer}."""
        return self._call("GET", "/emulator/v1/faults")

    def requests(self, verb: str, resource: str, namespace: str = "") -> int:
        """How many `verb` requests on `resource` (plural, or plural/subresource) in `namespace`
        the API server served (after RBAC), e.g. requests("list", "events", ns)."""
        return sum(r["count"] for r in self._call("GET", "/emulator/v1/requests")["requests"]
                   if (r["verb"], r["resource"], r["namespace"]) == (verb, resource, namespace))

    def end_watches(self, resource: str | None = None, expire: bool = False) -> int:
        """End every open watch (of `resource`, a plural); `expire`: with the 410 Expired ERROR
        event, and every older resourceVersion compacted away (a resume gets 410 Gone)."""
        return self._call("POST", "/emulator/v1/watches/end", {"resource": resource, "expire": expire})["ended"]

    def restart(self, down: float = 1.0, delete_pods: list[tuple[str, str]] = ()) -> None:
        """Restart the API server (every connection drops; listening again after `down` s); the
        (namespace, name) pods are deleted while it is down."""
        self._call("POST", "/emulator/v1/restart", {"down": down, "deletePods": [
            {"namespace": ns, "name": n} for ns, n in delete_pods]})

    def forward_from_host(self, port: int, target_port: int | None = None) -> str:
        """--host-netns: HOST:port (in the emulator's host namespace on the pod bridge) forwards to
        127.0.0.1:target_port here, as a NAT port-forward on the user's router; returns HOST."""
        return self._call("POST", "/emulator/v1/network/forward",
                          {"port": port, "targetPort": target_port or port})["address"]

    def netns(self) -> list[str]:
        """This emulator's network namespaces still present (`ip netns list`)."""
        from tests.support.kube.emulator.podnet import list_netns, prefix
        return [n for n in list_netns() if n.startswith(prefix(self.instance))]

    def stop(self) -> None:
        super().stop()
        from tests.support.kube.emulator.kubelet import tmp_root
        from tests.support.kube.emulator.podnet import sweep
        shutil.rmtree(tmp_root(self.instance), ignore_errors=True)  # its containers' /tmp, even if it was killed
        if shutil.which("ip") and os.geteuid() == 0:
            sweep(self.instance)  # even if it was killed: none of its namespaces stays behind

    def set_operator(self, name: str, running: bool) -> None:
        """Stop or start an operator's controller: tfjob, pytorchjob, framework."""
        self._call("PUT", f"/emulator/v1/operators/{name}", {"running": running})



def start_emulator(base: Path, *, nodes=None, images=None, tokens=None, crd_groups=(), namespaces=(),
                   pod_start_delay: float = 0.05, watch_history: int | None = None, default_images: bool = True,
                   pod_network: str = "host", host_netns: bool = False, client_ca: bool = False,
                   sidecar_image: str | None = None) -> Kube:
    if set(crd_groups) - {"trainer.kubeflow.org"}:  # Trainer v2's CRDs are fixtures of the emulator's own
        schemas_dir()  # custom resources are validated with the published schemas: SchemasMissing skips
    state = base / f"kube-{secrets.token_hex(3)}"
    state.mkdir(parents=True)
    instance = secrets.token_hex(8)
    token = f"tok-{secrets.token_hex(12)}"
    imgs = dict(images or {})
    if default_images:
        imgs.setdefault("nni-test/python:3.11", VENV_BIN)
        imgs.setdefault("msranni/nni:latest", VENV_BIN)
        imgs.setdefault(SLIM_IMAGE, slim_python_dir(state))
    args = ["--instance-id", instance,
            "--pod-start-delay", str(pod_start_delay)]
    toks = list(tokens or [])
    args += ["--token", f"{token}=system:admin"]
    for t in toks:
        args += ["--token", t]
    for n in nodes or []:
        args += ["--node", n]
    for k, v in imgs.items():
        args += ["--image", f"{k}={v}"]
    for g in crd_groups:
        args += ["--crd-group", g]
    for ns in namespaces:
        args += ["--namespace", ns]
    if watch_history:
        args += ["--watch-history", str(watch_history)]
    if pod_network != "host":  # "bridged": each pod in a network namespace of its own on a bridge
        if os.geteuid() != 0 or not shutil.which("ip"):
            pytest.skip("the bridged pod network needs root and iproute2 (`ip`)")
        args += ["--pod-network", pod_network]
    if host_netns:
        args += ["--host-netns"]
    if client_ca:  # client-certificate authentication (emulator/clientcerts.py)
        args += ["--client-ca"]
    if sidecar_image:  # Istio's sidecar injection in namespaces labelled istio-injection=enabled (emulator/sidecar.py)
        args += ["--sidecar-image", sidecar_image]
    proc = start_emulator_process("tests.support.kube.emulator", state, args, what="Kubernetes emulator",
                                  drop_env=("KUBE_EMULATOR_",), state_flag="--state-dir")
    return Kube(state, proc, token, instance)


class KubeNamespace:
    """The session's shared emulator as one test sees it: every attribute of `Kube`, plus `namespace`,
    a namespace made for this test alone. Objects the test creates go there; what is cluster-wide
    (nodes, faults, restarts, tokens, OIDC, operators) stays with a private `kube_factory()` one."""

    def __init__(self, shared: Kube, namespace: str) -> None:
        self.shared, self.namespace = shared, namespace

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


def namespace_of(kube: Any) -> str:
    """Where a test's objects live: its own namespace on a shared emulator, else "default"."""
    return getattr(kube, "namespace", None) or "default"


@pytest.fixture(scope="session")
def kube_shared() -> Iterator[Kube]:
    """One emulator (default options) for the whole session; tests reach it through `kube_ns`."""
    if os.geteuid() != 0:
        pytest.skip("the Kubernetes emulator needs root (mount namespaces for pod volumes)")
    with emulator_factory("kube-emu-", start_emulator, "the Kubernetes emulator") as make:
        yield make()


@pytest.fixture
def kube_ns(kube_shared: Kube) -> Iterator[KubeNamespace]:
    """The shared emulator with a fresh namespace for this test (`.namespace`). Afterwards the
    namespace's pods are deleted and the test fails if any of their processes is left, as a private
    emulator's teardown would."""
    with _test_namespace(kube_shared) as ns:
        yield ns


# The operators' custom resources (kubeflow.org: TFJob, PyTorchJob; frameworkcontroller: Framework)
# installed in the shared `kube_crd_shared` emulator: (group, version, plural).
SHARED_CRD_GROUPS = ("kubeflow.org", "frameworkcontroller.microsoft.com")
SHARED_CUSTOM_RESOURCES = (("kubeflow.org", "v1", "tfjobs"), ("kubeflow.org", "v1", "pytorchjobs"),
                           ("frameworkcontroller.microsoft.com", "v1", "frameworks"))


@pytest.fixture(scope="session")
def kube_crd_shared() -> Iterator[Kube]:
    """One emulator with the kubeflow and frameworkcontroller operators for the whole session;
    tests reach it through `kube_crd_ns`. A test that needs other groups, or none, nodes, tokens,
    a pod network or cluster-wide changes (policy, faults, operators stopped) keeps `kube_factory`."""
    if os.geteuid() != 0:
        pytest.skip("the Kubernetes emulator needs root (mount namespaces for pod volumes)")
    with emulator_factory("kube-emu-", start_emulator, "the Kubernetes emulator") as make:
        yield make(crd_groups=SHARED_CRD_GROUPS)


@pytest.fixture
def kube_crd_ns(kube_crd_shared: Kube) -> Iterator[KubeNamespace]:
    """`kube_crd_shared` with a fresh namespace for this test, cleaned up as `kube_ns` is (its
    custom objects first, so that no operator makes their pods again)."""
    with _test_namespace(kube_crd_shared, SHARED_CUSTOM_RESOURCES) as ns:
        yield ns


@contextlib.contextmanager
def _test_namespace(shared: Kube, custom: tuple[tuple[str, str, str], ...] = ()) -> Iterator[KubeNamespace]:
    from kubernetes import client

    ns = f"t-{secrets.token_hex(4)}"
    core = shared.core()
    core.create_namespace({"metadata": {"name": ns}})
    yield KubeNamespace(shared, ns)
    api = client.CustomObjectsApi(shared.api_client())
    for group, version, plural in custom:
        for obj in api.list_namespaced_custom_object(group, version, ns, plural)["items"]:
            api.delete_namespaced_custom_object(group, version, ns, plural, obj["metadata"]["name"])
    shared.wait_for(lambda: not any(api.list_namespaced_custom_object(g, v, ns, p)["items"] for g, v, p in custom),
                    30, what=f"the custom objects of {ns} to go")
    for pod in core.list_namespaced_pod(ns).items:
        try:
            core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
        except client.ApiException as e:
            if e.status != 404:  # gone already: its owner's garbage collection took it since the list
                raise
    shared.wait_for(lambda: not core.list_namespaced_pod(ns).items, 30, what=f"the pods of {ns} to go")
    shared.wait_for(lambda: not shared.leftover_processes(), 15,
                    what=f"the processes of {ns}'s pods to end (left: {shared.leftover_processes()})")


@pytest.fixture
def kube_factory():
    if os.geteuid() != 0:
        pytest.skip("the Kubernetes emulator needs root (mount namespaces for pod volumes)")
    with emulator_factory("kube-emu-", start_emulator, "the Kubernetes emulator") as make:
        yield make


@pytest.fixture
def kube(kube_factory) -> Kube:
    return kube_factory()
