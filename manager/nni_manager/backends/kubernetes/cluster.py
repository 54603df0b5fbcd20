"""An experiment's connection to its cluster and what it makes there once: the API client, the
RBAC check, the owner object every other object names (owner.py), the hub relay and its tunnel
(`hubTunnel`), the agent's wheel and dependencies as ConfigMaps, the image pull Secret.
`common.KubeBackend` builds the job pattern (jobs.py) on it.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import yaml

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_wheel import AgentWheel
from nni_manager.backends.base import DryRun, EnvironmentRequest, HubRoute
from nni_manager.backends.jobs import JobBackend
from nni_manager.backends.kubernetes import access, deps, owner, probe, tunnel
from nni_manager.backends.kubernetes import objects as kube_objects
from nni_manager.backends.kubernetes.client import Credentials, KubeError, api_error, load_client, manager_ip_for
from nni_manager.backends.kubernetes.config import KubeConfig, RoleConfig
from nni_manager.backends.kubernetes.hub_relay import HubRelay
from nni_manager.backends.kubernetes.main_objects import MainObjects
from nni_manager.backends.kubernetes.objects import Objects
from nni_manager.config import ConfigError
from nni_manager.hub.address import bare_host, host_port
from nni_manager.hub.relay_token import FILE as RELAY_TOKEN_FILE, relay_digest, relay_token

if TYPE_CHECKING:
    from kubernetes.aio import client as k8s

log = logging.getLogger(__name__)
DRY_RUN_TRIAL = "Abc12"  # a trial id as the manager makes them, for the dry run's per-trial names

KubeOptionsT = TypeVar("KubeOptionsT", bound=KubeConfig)  # the platform's own options class (config.py, adl.py)


class ClusterBackend(JobBackend[KubeOptionsT, "list[dict[str, Any]]"]):
    """The cluster side every Kubernetes platform shares (its jobs: common.KubeBackend)."""

    # the main object: None for plain pods, else (group, version, plural, kind)
    custom: ClassVar[tuple[str, str, str, str] | None] = None
    experiment_id: str = "dryrun"  # set by start(); before it (render) a placeholder valid in names and labels
    operator_name: ClassVar[str] = "operator"  # for "is the ... installed?"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._api: Any = None
        self._core: k8s.CoreV1Api | None = None
        self._custom: k8s.CustomObjectsApi | None = None
        self._wheel: AgentWheel | None = None
        self._wheel_sha256 = ""  # the pods' command carries it: the boot step runs no other wheel
        self._pull_secret: str | None = None
        self._tunnel: tunnel.Tunnel | None = None
        self._relay_token = ""  # the experiment's (tunnelled): agents prove it to the relay
        self._access_checked = False
        self._deps: dict[str, deps.Shipped] = {}  # image -> the agent's dependencies shipped for it
        self.deps_uploaded = 0  # bytes of dependency wheels this experiment uploaded (0: all cached)
        self._owner: dict[str, Any] | None = None  # the ownerReference every object names (owner.py)

    @property
    def kube(self) -> KubeOptionsT:
        return self.opts

    def trial_output_directory(self, agent_id: str, trial_id: str, role: str = "", index: int = 0) -> str:
        """NNI's layout on the experiment's storage: <mount>/nni/<exp>/<trial>/output/<role>_output
        (one folder per replica when a role has several), so checkpoints outlive the pod."""
        root = kube_objects.storage_mount(self.kube.storage)
        if not root:
            return ""
        replicas = next((r.replicas for r in self.kube.roles if r.name == role), 1)
        leaf = f"{role or 'trial'}_{index}_output" if replicas > 1 else f"{role or 'trial'}_output"
        return f"{root}/nni/{self.experiment_id}/{trial_id}/output/{leaf}"

    @property
    def reuse(self) -> bool:
        return self.kube.reuse_mode

    @property
    def namespace(self) -> str:
        return self.kube.namespace

    @property
    def objects(self) -> Objects:
        """What the objects are built from, now (objects.py builds them without a cluster)."""
        ts = self.config.training_service
        return Objects(self.kube, self.experiment_id, self.dry_run_hub(), ts.hub_tls, self.config.trial_grace_period,
                       self.orphan_timeout, self.reuse, self.tunnelled, dict(self.agent_env), self._wheel,
                       self._wheel_sha256, self._pull_secret, self._deps, self._relay_token)

    def pod_template(self, role: RoleConfig, env: EnvironmentRequest | None, meta: dict[str, Any],
                     container: str, command_prefix: str = "") -> dict[str, Any]:
        """The pod of one role (objects.Objects.pod_template)."""
        return self.objects.pod_template(role, env, meta, container, command_prefix)


    async def _client(self) -> tuple[Any, Any]:
        if self._core is None:
            from kubernetes.aio import client

            self._api = await load_client(self.kube)
            self._core, self._custom = client.CoreV1Api(self._api), client.CustomObjectsApi(self._api)
        return self._core, self._custom

    async def _clients(self) -> tuple[Any, Any, Any]:
        core, custom = await self._client()
        return self._api, core, custom

    async def _close_client(self) -> None:
        """Close the ApiClient (and its aiohttp session) when the experiment stops before stop() would."""
        if self._core is not None:
            await self._api.close()
            self._core = self._custom = None

    @property
    def tunnelled(self) -> bool:
        """Agents reach the hub through the relay and the API server (`hubTunnel`; default: on
        unless `nniManagerIp` says where the cluster can reach this machine)."""
        ts = self.config.training_service
        return ts.hub_tunnel if ts.hub_tunnel is not None else ts.nni_manager_ip is None

    async def manager_address(self) -> str | None:
        await self._client()
        host = self._api.configuration.host
        address = manager_ip_for(host)
        if _loopback(address):  # kind, minikube: pods would dial their own loopback and wait 6 minutes
            await self._close_client()  # refused before the hub (and so stop()) started
            raise ConfigError("trainingService.hubTunnel",
                              f"is false and nniManagerIp is not set, but the API server ({host}) is on this "
                              "machine's loopback: pods cannot reach the manager at a loopback address",
                              "remove `hubTunnel: false` (agents then reach the manager through the API server), "
                              "or set nniManagerIp to an address or DNS name of this machine that pods can reach")
        return address

    async def hub_route(self, experiment_id: str, experiment_dir: Path) -> HubRoute | None:
        """With the tunnel: the hub listens on loopback only and agents dial the relay's Service."""
        if not self.tunnelled:
            return None
        self.experiment_id = experiment_id
        self._relay_token = relay_token(experiment_dir)
        ns = self.namespace
        await self._client()
        try:
            await self._check_access()  # before the relay: a refused experiment leaves nothing behind
            await self._ensure_pull_secret()
            try:
                cluster_ip = await self._relay().ensure()
            except BaseException:  # nothing half-made stays behind: the hub (and so stop()) never started
                await self._delete_relay()
                raise
        except BaseException:  # nor an open client (its aiohttp session), nor the owner
            await self._delete_owner()
            await self._close_client()
            raise
        ts = self.config.training_service
        return HubRoute(bind=host_port(ts.hub_bind_address or "127.0.0.1", ts.hub_port or 0),
                        advertise=tunnel.advertise(cluster_ip),
                        names=tunnel.certificate_names(experiment_id, ns, cluster_ip))

    def _relay_objects(self, experiment_id: str) -> list[dict[str, Any]]:
        overrides: dict[str, Any] = {}
        if self._pull_secret:
            overrides["imagePullSecrets"] = [{"name": self._pull_secret}]
        # not the trials' nodeSelector / tolerations: they name the GPU pool, where the relay would
        # keep a node up (and an autoscaler from removing it) for the whole experiment
        for key in ("priorityClassName",):
            if key in self.kube.pod_spec:
                overrides[key] = copy.deepcopy(self.kube.pod_spec[key])
        image = self.config.training_service.hub_tunnel_image or tunnel.DEFAULT_IMAGE
        token_sha256 = relay_digest(self._relay_token) if self._relay_token else "<sha256 of the experiment's relay token>"
        return tunnel.relay_objects(experiment_id, self.namespace, image, token_sha256, overrides, self.reconnect_window,
                                    annotations=self.kube.pod_annotations)

    def _relay(self) -> HubRelay:
        return HubRelay(self._core, self.namespace, self.experiment_id,
                        lambda: self._relay_objects(self.experiment_id), self._owned)

    async def _ensure_relay_pod(self) -> None:
        """The relay pod again (the tunnel's `on_gone`: it ended or was evicted)."""
        await self._relay().ensure_pod()

    def required_access(self) -> list[access.Need]:
        """Every verb the experiment uses in its namespace (checked at start)."""
        needs = access.platform_needs(self.custom)
        if self.tunnelled:  # the hub relay: its pod, Service and program, reached by port-forward
            needs += access.tunnel_needs()
        return needs

    async def _check_access(self) -> None:
        """One line per verb the cluster denies, before anything is created (once: the tunnel's
        hub_route asks before start does)."""
        if self._access_checked:
            return
        denied = await access.missing(self._api, self.namespace, self.required_access())
        if denied:
            lines = "\n".join("  " + n.line(self.namespace) for n in denied)
            raise KubeError(f"Kubernetes RBAC denies what the experiment needs:\n{lines}\ngrant these verbs to your "
                            "user or service account (the minimal Role is in docs/platforms/kubernetes.md; check with "
                            f"`kubectl auth can-i --list -n {self.namespace}`)")
        self._access_checked = True

    def preflight(self) -> None:
        Credentials(self.kube).check_present()

    def dry_run_hub(self) -> str:
        ts = self.config.training_service
        return host_port(ts.nni_manager_ip or "<nniManagerIp>", ts.hub_port or "<hubPort>")

    async def _mains(self) -> MainObjects:
        core, custom = await self._client()
        return MainObjects(self._api, core, custom, self.namespace, self.custom)

    async def _owned(self, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` naming the experiment's owner ConfigMap (made on first use, after the access check)."""
        if self._owner is None:
            self._owner = await owner.ensure(self._core, self.namespace, self.experiment_id)
        return owner.adopt(obj, self._owner)

    async def _delete_owner(self) -> None:
        """Last: the garbage collector takes whatever of the experiment is still there."""
        if self._owner is not None and self._core is not None:
            try:
                await owner.delete(self._core, self.namespace, self.experiment_id)
            except Exception as e:
                log.error("cleaning up experiment %s: %s", self.experiment_id, e)
            self._owner = None

    async def _delete_relay(self) -> None:
        if not self.tunnelled or self._core is None:
            return
        await self._relay().delete()

    # ------------------------------------------------------------------ objects (objects.py builds them)
    async def _ensure_wheel_configmap(self) -> None:
        core, _ = await self._client()
        body = self.objects.wheel_config_map()
        try:  # an earlier one of this experiment is kept only if it holds this very wheel (pods check its digest)
            await deps.ensure_config_map(core, self.namespace, body["metadata"]["name"], await self._owned(body))
        except agent_deps.DependencyError:
            raise  # one line already
        except Exception as e:
            raise api_error(e, "creating the agent ConfigMap") from None

    async def _ship_deps(self) -> None:
        """Per image: learn its Python (a probe pod, or the manager's cache of probes) and, where it
        lacks the agent's dependencies, ship wheels for it as ConfigMaps (see deps.py)."""
        core, _ = await self._client()
        roles = {r.docker_image: r for r in self.kube.roles}
        for i, (image, role) in enumerate(sorted(roles.items())):
            report = deps.cached_probe(image)
            if report is None:
                report = await probe.run_probe(core, self.namespace, kube_objects.probe_pod_name(self.experiment_id, i),
                                               await self._owned(self.objects.probe_pod(role, i)), image,
                                               self.kube.environment_start_timeout)
                if report is None:
                    continue
                await asyncio.to_thread(deps.remember_probe, image, report)
            if not deps.needs_shipping(report):
                continue
            worker = deps.worker_python(report)
            try:
                wheels = await asyncio.to_thread(partial(agent_deps.resolve, worker, self.config.agent_wheelhouse,
                                                         where=f"the image {image}"))
            except agent_deps.DependencyError:  # said on the console; its pods fail with the boot step's line
                continue
            shipped, uploaded = await deps.ship(core, self.namespace, wheels, worker.key)
            self._deps[image] = shipped
            self.deps_uploaded += uploaded
            log.info("the agent's dependencies for the image %s (%s): %d bytes in %d ConfigMaps, %d uploaded now",
                     image, worker.key, shipped.size, len(shipped.config_maps), uploaded)

    async def _ensure_pull_secret(self) -> None:
        paths = kube_objects.pull_secret_paths(self.kube)
        if not paths:
            return
        core, _ = await self._client()
        body = self.objects.pull_secret_object(paths[0])
        try:
            await core.create_namespaced_secret(self.namespace, await self._owned(body), field_validation="Strict")
        except Exception as e:
            if getattr(e, "status", None) != 409:
                raise api_error(e, "creating the image pull secret") from None
        self._pull_secret = body["metadata"]["name"]

    def extra_objects(self) -> list[dict[str, Any]]:
        """Per-experiment objects a platform adds to the dry run."""
        return []

    # ------------------------------------------------------------------ dry run
    def render(self) -> DryRun:
        # the names the manager gives: a pool's environments env1, env2...; without reuse one per
        # trial, named after it (elastic.py: trial-<id>), shown for a sample trial id
        trial_id = None if self.reuse else DRY_RUN_TRIAL
        env = self.dry_run_env(f"trial-{trial_id.lower()}" if trial_id else "env1")
        if trial_id:
            env = dataclasses.replace(env, trial_id=trial_id)
        import nni_agent

        if kube_objects.pull_secret_paths(self.kube):  # the pods name it
            self._pull_secret = kube_objects.pull_secret_name(self.experiment_id)
        shared = self.objects.dry_run_shared(nni_agent.__version__)
        secret, main = self.build_request(env)
        # placeholders as stringData: `data` must be base64, or the API server refuses the dry run
        secret["stringData"] = {k: "<the experiment's CA certificate>" if k == "ca.crt" else
                                "<the experiment's relay token>" if k == RELAY_TOKEN_FILE else
                                "<per-agent token, minted at start>" for k in secret.pop("data")}
        objects = [*shared, *self.extra_objects(), secret, main]
        per_env = (f"a pool of up to {self.config.trial_concurrency} environment(s) like this one" if self.reuse else
                   f"one environment per trial (up to {self.config.trial_concurrency} at a time), named after its "
                   f"trial; here for a trial with id {trial_id}")
        text = (f"# {self.platform}: once per experiment the agent ConfigMap"
                f"{' and the image pull Secret' if self._pull_secret else ''}, then {per_env}, "
                f"in namespace {self.namespace}\n" + yaml.safe_dump_all(objects, sort_keys=False))
        if self.tunnelled:  # first, so that the environment's main object stays the last request
            relay = self._relay_objects(self.experiment_id)
            relay[0]["data"] = {tunnel.RELAY_FILE: "<the relay program, nni_manager/backends/kubernetes/relay.py>"}
            text = ("# the hub relay, once per experiment (hubTunnel): agents dial its Service; the manager "
                    "reaches it through the API server's pods/portforward\n" + yaml.safe_dump_all(relay, sort_keys=False)
                    + "---\n" + text)
            objects = relay + objects
        return DryRun(self.platform, objects, text)


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(bare_host(host)).is_loopback
    except ValueError:
        return host == "localhost"
