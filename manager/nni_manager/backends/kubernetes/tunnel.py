"""The hub tunnel through the API server: agents reach a manager the cluster cannot route to.

The experiment owns a relay in its namespace (relay.py in a plain-Python pod, a ClusterIP Service,
and an immutable ConfigMap holding the program, named for its content; the pod's command carries
the program's sha256 and runs it only when it matches, so a ConfigMap someone else replaced is
refused, never run); agents dial the Service, proving with the experiment's relay token
(nni_manager/hub/relay_token.py) that they are its agents before the relay pairs them. The manager keeps POOL idle
port-forward streams (`pods/portforward`, websocket `v4.channel.k8s.io`, the path `kubectl
port-forward` takes) open to the relay's back port; the relay pairs each agent connection with one
of them and signals it with one byte, then the manager dials its hub on loopback and copies bytes.
TLS stays end to end between agent and hub. A dropped stream is replaced (with backoff while the
API server or the relay is away); an agent whose connection dropped redials and resends what was
not acknowledged, so nothing is lost; a restarted manager opens new streams to the same relay.
"""
from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from nni_manager.backends.kubernetes import proxy
from nni_manager.hub.address import host_port

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger(__name__)

AGENT_PORT = 4000  # the Service's and the relay's agent port
BACK_PORT = 4001  # the relay's back port, on the pod's loopback only
POOL = 4  # idle streams kept open; one more is opened for every agent that pairs
QUIET = 30.0  # failures this young are the relay pod starting: logged at INFO only
PROTOCOL = "v4.channel.k8s.io"
APP = "nni-hub-relay"
RELAY_FILE = "relay.py"
DEFAULT_IMAGE = "python:3.11-slim"


def relay_name(experiment_id: str) -> str:
    return f"nni-relay-{experiment_id.lower()}"


def relay_labels(experiment_id: str) -> dict[str, str]:
    return {"app": APP, "expId": experiment_id}


# OpenShift's SCC admission refusing a pod (its runAsUser outside the namespace's UID range)
SCC_REFUSAL = "unable to validate against any security context constraint"
# the cluster autoscaler may move the pod to remove its node (it is re-created or re-run)
SAFE_TO_EVICT = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}


# runs the relay program only when its bytes are the ones the pod spec names (argv: sha256, path,
# the program's own arguments); else one line in the termination message, and the pod fails
VERIFY = (
    "import hashlib,sys\n"
    "sha,path=sys.argv[1],sys.argv[2]\n"
    "src=open(path,'rb').read()\n"
    "if hashlib.sha256(src).hexdigest()!=sha:\n"
    " why='nni hub relay: %s is not the program the manager shipped (its sha256 differs: someone replaced "
    "the ConfigMap); stop the experiment and start it again' % path\n"
    " try:\n"
    "  open('/dev/termination-log','w').write(why)\n"
    " except OSError:\n"
    "  pass\n"
    " sys.exit(why)\n"
    "sys.argv=[path]+sys.argv[3:]\n"
    "exec(compile(src,path,'exec'),{'__name__':'__main__','__file__':path})\n"
)


def relay_program() -> str:
    return Path(__file__).with_name(RELAY_FILE).read_text()


def program_config_map_name(experiment_id: str) -> str:
    """The relay program's ConfigMap: the experiment's, named for the program's content."""
    digest = hashlib.sha256(relay_program().encode()).hexdigest()
    return f"{relay_name(experiment_id)}-{digest[:16]}"


def relay_objects(experiment_id: str, namespace: str, image: str, token_sha256: str,
                  pod_overrides: dict[str, Any] | None = None, expire_s: float = 0.0,
                  annotations: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The ConfigMap (the relay program), the Pod and the ClusterIP Service of the relay.
    `token_sha256`: the relay token's digest (relay_token.relay_digest), which the relay checks; the
    relay ends (its pod Succeeded) after `expire_s` seconds without the manager (0: never).
    `annotations`: the config's podAnnotations, on the relay pod as on the trials' (a mesh's opt-out,
    `sidecar.istio.io/inject: "false"`: an injected proxy would keep the pod Running after the relay
    ended, and a NetworkPolicy or mesh policy may key on them)."""
    name = relay_name(experiment_id)
    labels = relay_labels(experiment_id)
    meta = {"name": name, "namespace": namespace, "labels": labels}
    program = relay_program()
    program_sha256 = hashlib.sha256(program.encode()).hexdigest()
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
                  "metadata": {**meta, "name": program_config_map_name(experiment_id)}, "data": {RELAY_FILE: program}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, "annotations": {**SAFE_TO_EVICT, **(annotations or {})}}, "spec": {
        "restartPolicy": "OnFailure",  # a crash is restarted; its own end (the manager gone for good) is final
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "relay", "image": image,
            "command": ["python3", "-u", "-c", VERIFY, program_sha256, f"/nni-relay/{RELAY_FILE}",
                        str(AGENT_PORT), str(BACK_PORT), token_sha256],
            "ports": [{"name": "agents", "containerPort": AGENT_PORT, "protocol": "TCP"}],
            "env": [{"name": "NNI_RELAY_EXPIRE_S", "value": f"{expire_s:g}"}],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
            "volumeMounts": [{"name": "relay", "mountPath": "/nni-relay", "readOnly": True}],
            # what Pod Security "restricted" asks for: the relay needs no privilege at all; the image
            # (python:3.11-slim) runs as root, so a non-root UID is named, except on OpenShift,
            # whose SCC refuses a UID outside the namespace's range and sets one (without_fixed_user)
            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65534,
                                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        }],
        "volumes": [{"name": "relay", "configMap": {"name": program_config_map_name(experiment_id)}}],
        **(pod_overrides or {}),
    }}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": dict(meta), "spec": {
        "type": "ClusterIP", "selector": labels,
        "ports": [{"name": "agents", "port": AGENT_PORT, "targetPort": AGENT_PORT, "protocol": "TCP"}],
    }}
    return [config_map, pod, service]


def without_fixed_user(pod: dict[str, Any]) -> dict[str, Any]:
    """The relay pod for a namespace that prescribes the UID (OpenShift): the SCC sets it."""
    out = copy.deepcopy(pod)
    for c in out["spec"]["containers"]:
        c.get("securityContext", {}).pop("runAsUser", None)
    return out


def certificate_names(experiment_id: str, namespace: str, cluster_ip: str) -> tuple[str, ...]:
    name = relay_name(experiment_id)
    return (cluster_ip, name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local")


class Tunnel:
    """Keeps idle port-forward streams to the relay and joins each paired one to the hub."""

    def __init__(self, api: ApiClient, namespace: str, pod: str, hub: Callable[[], str],
                 on_gone: Callable[[], Awaitable[object]] | None = None, pool: int = POOL) -> None:
        self._api = api  # kubernetes.aio ApiClient: its host, credentials and TLS settings
        self.namespace, self.pod, self.pool = namespace, pod, pool
        self._hub = hub  # the hub's listening "host:port" (known once it started)
        self._on_gone = on_gone  # re-creates the relay pod when the API server says it is gone
        self._gone_lock = asyncio.Lock()  # one re-creation at a time: the pool's streams all fail together
        self._session: Any = None
        self._route = proxy.Route(None)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._failures = 0
        self._failing_since: float | None = None
        self._warned = False
        self.opened = 0  # streams opened so far (tests, bench)
        self.paired = 0  # agent connections carried so far
        self.idle = 0

    async def start(self) -> None:
        import aiohttp

        ssl_context = self._api.rest_client.ssl_context
        self._route = proxy.route(self._api.configuration)  # the API calls' way: proxy, NO_PROXY, SNI
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context))
        for _ in range(self.pool):
            self._spawn()

    async def stop(self) -> None:
        self._stopping = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _spawn(self, delay: float = 0.0) -> None:
        if self._stopping:
            return
        task = asyncio.create_task(self._stream(delay), name="hub-tunnel-stream")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _headers(self) -> dict[str, str]:
        cfg = self._api.configuration
        headers: dict[str, str] = {}
        token = (await cfg.auth_settings()).get("BearerToken", {}).get("value")  # refreshed as for any call
        if token:
            headers["Authorization"] = token
        elif cfg.username or cfg.password:
            headers["Authorization"] = cfg.get_basic_auth_token()
        return headers

    def _url(self) -> str:
        host = self._api.configuration.host.rstrip("/")
        ws = "wss" + host[len("https"):] if host.startswith("https") else "ws" + host[len("http"):]
        return f"{ws}/api/v1/namespaces/{self.namespace}/pods/{self.pod}/portforward?ports={BACK_PORT}"

    async def _stream(self, delay: float) -> None:
        """One idle stream: open it, wait to be paired, then carry one agent connection."""
        if delay:
            await asyncio.sleep(delay)
        import aiohttp

        paired = False
        fresh = getattr(self._api, "fresh_credentials", None)
        if fresh is not None:  # a client certificate renewed before it expires (exec plugins)
            try:
                await fresh()
            except Exception as e:  # noqa: BLE001 - one line (KubeError says why), retried with backoff
                await self._failed(f"cannot renew the credentials for the port-forward: {e}", urgent=True)
                return
        try:
            r = self._route
            ws = await self._session.ws_connect(self._url(), protocols=(PROTOCOL,), headers=await self._headers(),
                                                ssl=self._api.rest_client.ssl_context,  # its current certificate
                                                heartbeat=30.0, max_msg_size=0, proxy=r.proxy, proxy_auth=r.auth,
                                                proxy_headers=r.headers, server_hostname=r.server_hostname)
        except aiohttp.WSServerHandshakeError as e:
            if e.status in (401, 403):  # no waiting this out: say what to grant at once
                why = (f"the API server refused the port-forward to pod {self.pod} ({e.status}): grant `get` and "
                       f"`create` on `pods/portforward` in namespace {self.namespace} to your user or service "
                       f"account (RBAC; a WebSocket upgrade is checked as `get`, and from Kubernetes 1.35 also `create`)")
            else:
                why = f"the API server refused the port-forward to pod {self.pod}: {e.status} {e.message}"
            # 404: gone; 400: not scheduled; 500: the kubelet has no running sandbox for it (evicted,
            # ended; streaming/errors.go): on_gone reads the pod and re-creates it only if it ended
            await self._failed(why, gone=e.status in (400, 404, 500), urgent=e.status in (401, 403))
            return
        except aiohttp.ClientHttpProxyError as e:
            await self._failed(f"port-forward to pod {self.pod}: {proxy.refusal(e)}", urgent=True)
            return
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            await self._failed(f"cannot reach the API server for the port-forward: {e}")
            return
        self.opened += 1
        self.idle += 1
        writer: asyncio.StreamWriter | None = None
        pump: asyncio.Task[None] | None = None
        started: set[int] = set()
        error = ""
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                    continue
                channel, payload = msg.data[0], msg.data[1:]
                if channel not in started:  # the first frame of each channel names its port
                    started.add(channel)
                    if int.from_bytes(payload[:2], "little") != BACK_PORT:
                        error = f"unexpected port in the first frame of channel {channel}"
                        break
                    continue
                if channel == 1:  # the forward failed (the relay not listening yet): this stream is done
                    error += payload.decode(errors="replace")
                    break
                if channel != 0:
                    continue
                if writer is None:  # the relay's signal: an agent is waiting on the other end
                    if payload[:1] != b"\x01":
                        error = "the relay spoke out of turn"
                        break
                    paired = True
                    self.idle -= 1
                    self.paired += 1
                    self._failures, self._failing_since, self._warned = 0, None, False  # it works
                    self._spawn()  # keep the pool full for the next agent
                    payload = payload[1:]
                    host, _, port = self._hub().rpartition(":")
                    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
                    pump = asyncio.create_task(_hub_to_ws(reader, ws))
                if payload:
                    writer.write(payload)
                    await writer.drain()
        except (ConnectionError, OSError, aiohttp.ClientError) as e:
            error = error or str(e)
        finally:
            if not paired:
                self.idle -= 1
            if pump is not None:
                pump.cancel()
            if writer is not None:
                writer.close()
            await ws.close()
        if not paired and not self._stopping:  # an idle stream ended: the relay or the API server went away
            if error:
                await self._failed(f"the port-forward to the hub relay failed: {error.strip()}")
            else:
                self._spawn(0.2)

    async def _failed(self, why: str, gone: bool = False, urgent: bool = False) -> None:
        """Retry with backoff. Quiet while the relay pod starts; a warning once it lasts
        (`QUIET` s), or at once when `urgent` (refused credentials), and every 50 failures after."""
        if self._stopping:
            return
        self._failures += 1
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if (urgent or now - self._failing_since > QUIET) and (not self._warned or self._failures % 50 == 0):
            self._warned = True
            log.warning("hub tunnel: %s (failing for %.0f s; retrying): agents cannot reach the manager meanwhile",
                        why, now - self._failing_since)
        else:
            log.info("hub tunnel: %s (retrying)", why)
        if gone and self._on_gone is not None:
            try:
                async with self._gone_lock:  # the next caller then finds the new pod and leaves it be
                    await self._on_gone()
            except Exception as e:  # noqa: BLE001 - logged, retried with the next stream
                log.warning("hub tunnel: cannot re-create the relay: %s", e)
        self._spawn(min(5.0, 0.2 * 2 ** min(self._failures, 5)))


async def _hub_to_ws(reader: asyncio.StreamReader, ws: Any) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await ws.send_bytes(b"\x00" + data)
    except (ConnectionError, OSError):
        pass
    finally:
        await ws.close()


def advertise(cluster_ip: str) -> str:
    return host_port(cluster_ip, AGENT_PORT)

