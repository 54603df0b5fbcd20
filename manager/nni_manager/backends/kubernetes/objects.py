"""The objects the Kubernetes platforms create, built without a cluster: an environment's
Secret and pod template, the per-experiment agent ConfigMap and image pull Secret, the image
probe pod, and what the dry run shows of them.

Pure: every input is a field of `Objects`, which the backend makes from its state when asked
(`KubeBackend.objects`), so these are tested on their own (tests/kube/test_objects.py).
"""
from __future__ import annotations

import base64
import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nni_manager.backends.agent_command import DRY_RUN_SHA256
from nni_manager.backends.agent_wheel import AgentWheel
from nni_manager.backends.base import EnvironmentRequest
from nni_manager.backends.kubernetes import boot, deps, tunnel
from nni_manager.backends.kubernetes.config import KubeConfig, RoleConfig, Storage
from nni_manager.backends.kubernetes.podspec import merge_pod_spec
from nni_manager.hub.relay_token import FILE as RELAY_TOKEN_FILE

APP = "nni-kubernetes-trial"  # NNI's label value
# The token Secret's file mode: readable by whatever user the image or the cluster picks (an image's
# USER 1000, OpenShift's UID from the namespace's range), with no fsGroup of ours: a fixed group is
# refused where the namespace prescribes a range (OpenShift's restricted-v2), and the pod is the
# trial's own, so no other user shares its files.
SECRET_MODE = 0o444
STORAGE_MOUNT = "/tmp/mount"  # where NNI mounted `storage` (nfs, pvc) in every pod


def storage_mount(storage: Storage | None) -> str:
    """Where the experiment's storage is in the pods, or "" when nothing is mounted (azureStorage;
    v1 `pvc: {path}`: wherever the Framework template mounts its claim)."""
    if storage is None:
        return ""
    if storage.kind == "nfs" or storage.claim_name:
        return STORAGE_MOUNT
    return storage.path if storage.kind == "pvc" else ""


def labels(experiment_id: str, env: EnvironmentRequest | None = None) -> dict[str, str]:
    out = {"app": APP, "expId": experiment_id}
    if env is not None:
        out["envId"] = env.env_id
        if env.trial_id:
            out["trialId"] = env.trial_id
    return out


def selector(items: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in items.items())


def wheel_config_map_name(experiment_id: str) -> str:
    return f"nni-agent-{experiment_id.lower()}"


def pull_secret_name(experiment_id: str) -> str:
    return f"nni-registry-{experiment_id.lower()}"


def probe_pod_name(experiment_id: str, i: int) -> str:
    return f"nni-probe-{experiment_id.lower()}-{i}"


def pull_secret_paths(opts: KubeConfig) -> list[Path]:
    """The roles' `privateRegistryAuthPath`s (the first one is the experiment's pull Secret)."""
    return sorted({r.private_registry_auth_path for r in opts.roles if r.private_registry_auth_path})


@dataclass
class Objects:
    """What the objects depend on: the options, the experiment, and what start made (the wheel,
    the pull Secret, the dependencies shipped per image)."""

    opts: KubeConfig
    experiment_id: str
    dry_run_hub: str  # the hub in a pod spec when no environment is given (dry run, probe)
    hub_tls: bool
    grace_period: float  # trialGracePeriod
    orphan_timeout: float
    reuse: bool
    tunnelled: bool
    agent_env: dict[str, str] = field(default_factory=dict)
    wheel: AgentWheel | None = None
    wheel_sha256: str = ""
    pull_secret: str | None = None
    shipped: dict[str, deps.Shipped] = field(default_factory=dict)  # image -> the dependencies shipped for it
    relay_token: str = ""

    @property
    def namespace(self) -> str:
        return self.opts.namespace

    # ------------------------------------------------------------------ per environment
    def secret(self, env: EnvironmentRequest, name: str, meta: dict[str, Any]) -> dict[str, Any]:
        """`<object>-nni`: the CA, one token file per member (named for its pod) and, tunnelled, the
        relay token; mounted read-only, never in a pod spec, argv or log."""
        data = {m.agent_id: base64.b64encode(m.token.encode()).decode() for m in env.members}
        if env.members and env.members[0].ca_certificate:
            data["ca.crt"] = base64.b64encode(env.members[0].ca_certificate).decode()
        if self.tunnelled:  # what the agents prove to the hub relay (the relay holds only its digest)
            data[RELAY_TOKEN_FILE] = base64.b64encode(self.relay_token.encode()).decode()
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                "metadata": {**meta, "name": f"{name}-nni"}}

    def pod_template(self, role: RoleConfig, env: EnvironmentRequest | None, meta: dict[str, Any],
                     container: str, command_prefix: str = "") -> dict[str, Any]:
        """The pod of one role: the agent in the role's image, with resources as NNI set them."""
        hub = (env.members[0].hub_address if env and env.members and env.members[0].hub_address
               else self.dry_run_hub)
        tls = bool(env.members[0].ca_certificate) if env and env.members else self.hub_tls
        wheel = self.wheel.path.name if self.wheel else "nni_agent-<version>-py3-none-any.whl"
        tag = self.wheel.tag if self.wheel else "<version>-<hash>"
        command = boot.agent_command(hub, tls, self.orphan_timeout,
                                     single_trial=bool(env.trial_id) if env else not self.reuse,
                                     wheel=wheel, tag=tag, image=role.docker_image,
                                     wheel_sha256=self.wheel_sha256 or DRY_RUN_SHA256,
                                     relay_token=self.tunnelled)
        shipped = self.shipped.get(role.docker_image)
        if shipped is not None:  # the agent's dependencies, in ConfigMaps (deps.py), verified by their digests
            command = dataclasses.replace(command, parts=(deps.DEPS_DIR,), deps_to=f"{boot.WORK_DIR}/deps-{shipped.key}",
                                          sha256=command.sha256 + shipped.sha256)
        resources: dict[str, str] = {"cpu": f"{role.cpu_number:g}", "memory": f"{role.memory_mb}Mi"}
        if role.gpu_number:
            resources["nvidia.com/gpu"] = str(role.gpu_number)
        env_vars = [
            {"name": "NNI_AGENT_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ]
        if not role.gpu_number:  # the NVIDIA device plugin shows every GPU to containers asking for none
            env_vars.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
        env_vars += [{"name": k, "value": v} for k, v in self.agent_env.items()]
        mounts = [{"name": "nni-secret", "mountPath": boot.SECRET_DIR, "readOnly": True},
                  {"name": "nni-agent", "mountPath": boot.WHEEL_DIR, "readOnly": True},
                  {"name": "nni-work", "mountPath": boot.WORK_DIR}]
        secret_name = f"{meta['name']}-nni"
        volumes: list[dict[str, Any]] = [
            {"name": "nni-secret", "secret": {"secretName": secret_name, "defaultMode": SECRET_MODE}},
            {"name": "nni-agent", "configMap": {"name": wheel_config_map_name(self.experiment_id)}},
            {"name": "nni-work", "emptyDir": {}},
        ]
        if shipped is not None:
            mounts += shipped.mounts()
            volumes += shipped.volumes()
        storage = self.opts.storage
        if storage is not None and (storage.kind == "nfs" or storage.claim_name):  # where NNI mounted it, for trial outputs
            mounts.append({"name": "nni-vol", "mountPath": STORAGE_MOUNT})
            volumes.append({"name": "nni-vol", "nfs": {"server": storage.server, "path": storage.path}}
                           if storage.kind == "nfs" else
                           {"name": "nni-vol", "persistentVolumeClaim": {"claimName": storage.claim_name}})
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": int(self.grace_period) + 15,
            "containers": [{
                "name": container, "image": role.docker_image,
                "command": boot.container_command(command, command_prefix),
                "env": env_vars, "resources": {"requests": resources, "limits": dict(resources)},
                "volumeMounts": mounts, "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": volumes,
        }
        if self.pull_secret:
            spec["imagePullSecrets"] = [{"name": self.pull_secret}]
        if self.opts.service_account_name:
            spec["serviceAccountName"] = self.opts.service_account_name
        spec = merge_pod_spec(spec, copy.deepcopy(self.opts.pod_spec))
        if role.pod_spec:  # the role's own (a GPU worker's tolerations, a parameter server's memory)
            spec = merge_pod_spec(spec, copy.deepcopy(role.pod_spec))
        metadata: dict[str, Any] = {"labels": dict(meta["labels"])}
        if self.opts.pod_annotations:
            metadata["annotations"] = dict(self.opts.pod_annotations)
        return {"metadata": metadata, "spec": spec}

    # ------------------------------------------------------------------ per experiment
    def wheel_config_map(self) -> dict[str, Any]:
        """The manager's own agent wheel, immutable (the pods check its digest)."""
        assert self.wheel is not None
        return {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
                "metadata": {"name": wheel_config_map_name(self.experiment_id), "namespace": self.namespace,
                             "labels": labels(self.experiment_id)},
                "binaryData": {self.wheel.path.name: base64.b64encode(self.wheel.path.read_bytes()).decode()}}

    def pull_secret_object(self, path: Path) -> dict[str, Any]:
        """The image pull Secret, from the docker config.json at `path`."""
        return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                "metadata": {"name": pull_secret_name(self.experiment_id), "namespace": self.namespace,
                             "labels": labels(self.experiment_id)},
                "data": {".dockerconfigjson": base64.b64encode(path.read_bytes()).decode()}}

    def dry_run_shared(self, agent_version: str) -> list[dict[str, Any]]:
        """The per-experiment agent ConfigMap and image pull Secret as a dry run shows them: their
        names and labels as made at start, placeholders for the wheel and the registry credentials
        (never printed)."""
        meta = {"namespace": self.namespace, "labels": labels(self.experiment_id)}
        wheel = self.wheel.path.name if self.wheel else f"nni_agent-{agent_version}-py3-none-any.whl"
        objects: list[dict[str, Any]] = [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": wheel_config_map_name(self.experiment_id), **meta},
            "immutable": True, "data": {wheel: "<the manager's own agent wheel, as binaryData>"}}]
        paths = pull_secret_paths(self.opts)
        if paths:
            objects.append({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                            "metadata": {"name": pull_secret_name(self.experiment_id), **meta},
                            "stringData": {".dockerconfigjson": json.dumps({"auths": {f"<from {paths[0]}>": {}}})}})
        return objects

    def probe_pod(self, role: RoleConfig, i: int) -> dict[str, Any]:
        """A pod of the role's image (scheduled as its agent pods are) that only runs the boot step's check."""
        name = probe_pod_name(self.experiment_id, i)
        meta = {"name": name, "labels": {"app": deps.PROBE_APP, "expId": self.experiment_id}}
        template = self.pod_template(role, None, meta, "probe")
        spec = template["spec"]
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "nni-secret"]
        c = spec["containers"][0]
        # podSpec.containers entries are named for the trial's container (`trial`, `tensorflow`, ...):
        # the probe's one container takes the fields of those that only adjust it (securityContext,
        # imagePullPolicy) instead of gaining a second, imageless container; sidecars stay out
        for extra in spec["containers"][1:]:
            if "image" not in extra:
                merge_pod_spec(c, {k: copy.deepcopy(v) for k, v in extra.items() if k != "name"})
        spec["containers"] = [c]
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "nni-secret"]
        assert self.wheel is not None
        command = boot.agent_command("", False, 0, False, wheel=self.wheel.path.name, tag=self.wheel.tag,
                                     image=role.docker_image, wheel_sha256=self.wheel_sha256)
        c["command"] = ["sh", "-c", deps.probe_script(command)]
        c["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
        c.pop("terminationMessagePolicy", None)
        for key in ("nodeSelector", "tolerations", "affinity"):  # any node runs the image: not the GPU pool's
            spec.pop(key, None)
        annotations = {**(template["metadata"].get("annotations") or {}), **tunnel.SAFE_TO_EVICT}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], **meta,
                "namespace": self.namespace, "labels": meta["labels"], "annotations": annotations}, "spec": spec}
