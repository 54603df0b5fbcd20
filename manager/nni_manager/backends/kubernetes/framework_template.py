"""NNI v1's FrameworkController `configPath`: a whole Framework YAML used as the template of every
trial's Framework (NNI's `fcTemplate`).

As NNI does, the task roles come from the template (`name`, `taskNumber`, the one container's
`command` and `image`, `frameworkAttemptCompletionPolicy`), and each trial's Framework is a copy
of it whose container runs the role's command (here: the agent, which runs it). Everything else
the template says is kept: volumes, init containers, serviceAccountName, hostNetwork, the
container's ports, resources and env. Only what the manager must own is ours: the Framework's
name, namespace and labels, the retry policies (the manager retries trials itself; an attempt
retried by the controller would re-run a finished trial's pods) and the agent's own env,
volumes and command.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nni_manager.config import ConfigError, yaml_file

KIND = "Framework"


def load(path: Path, field_path: str) -> dict[str, Any]:
    """The template, checked enough that every refusal names what to fix in it."""
    doc = yaml_file(path, field_path, "point it at a Framework YAML (NNI's fc_template.yml)")
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ConfigError(field_path, f"{path} is not a FrameworkController Framework (kind: {KIND})",
                          "use a Framework YAML: `apiVersion: frameworkcontroller.microsoft.com/v1`, `kind: Framework`")
    roles = (doc.get("spec") or {}).get("taskRoles")
    if not isinstance(roles, list) or not roles:
        raise ConfigError(field_path, f"{path} has no spec.taskRoles", "add the task roles under `spec.taskRoles`")
    for i, role in enumerate(roles):
        where = f"{path}: spec.taskRoles[{i}]"
        containers = (((role or {}).get("task") or {}).get("pod") or {}).get("spec", {}).get("containers")
        if not isinstance(containers, list) or len(containers) != 1:  # NNI's own rule
            raise ConfigError(field_path, f"{where}.task.pod.spec.containers must hold exactly one container "
                              "(init containers go under initContainers)",
                              "keep one container per task role: the one whose command is the trial's")
        if not isinstance(containers[0].get("command"), list) or not containers[0].get("image"):
            raise ConfigError(field_path, f"{where}.task.pod.spec.containers[0] needs `image` and a `command` list",
                              'add e.g. `image: msranni/nni:latest` and `command: ["python3", "mnist.py"]`')
    return doc


def role_fields(role: dict[str, Any]) -> dict[str, Any]:
    """What NNI reads of one template task role."""
    container = role["task"]["pod"]["spec"]["containers"][0]
    resources = container.get("resources") or {}
    policy = role.get("frameworkAttemptCompletionPolicy") or role["task"].get("frameworkAttemptCompletionPolicy") or {}
    return {
        "name": role.get("name", ""),
        "replicas": int(role.get("taskNumber") or 1),
        "command": " ".join(str(a) for a in [*container["command"], *(container.get("args") or [])]),
        "docker_image": str(container["image"]),
        # GPUs the template asks for: the agent then leaves CUDA_VISIBLE_DEVICES to the device plugin
        "gpu_number": int(str(resources.get("limits", {}).get("nvidia.com/gpu")
                              or resources.get("requests", {}).get("nvidia.com/gpu") or 0)),
        "min_failed": int(policy.get("minFailedTaskCount", 1)),
        "min_succeeded": int(policy.get("minSucceededTaskCount", -1)),
    }


def container_name(template: dict[str, Any], index: int) -> str:
    return str(template["spec"]["taskRoles"][index]["task"]["pod"]["spec"]["containers"][0].get("name") or "framework")


def port(template: dict[str, Any], index: int) -> int | None:
    """The role container's first containerPort, if the template names one."""
    ports = template["spec"]["taskRoles"][index]["task"]["pod"]["spec"]["containers"][0].get("ports") or []
    return int(ports[0]["containerPort"]) if ports and isinstance(ports[0], dict) and ports[0].get("containerPort") else None


def merge_pod(template_pod: dict[str, Any], ours: dict[str, Any],
              merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """The template's pod with ours merged over it: our container command, env, mounts and
    volumes win; what the template adds (ports, resources, volumes, init containers) stays."""
    pod = copy.deepcopy(template_pod)
    container = pod["spec"]["containers"][0]
    container.pop("args", None)
    spec = merge(copy.deepcopy(ours["spec"]), {k: v for k, v in pod["spec"].items() if k != "restartPolicy"})
    if (container.get("resources") or {}).keys():  # the template's resources replace ours whole
        spec["containers"][0]["resources"] = copy.deepcopy(container["resources"])
    spec["containers"][0]["command"] = ours["spec"]["containers"][0]["command"]
    metadata = copy.deepcopy(pod.get("metadata") or {})
    metadata["labels"] = {**(metadata.get("labels") or {}), **ours["metadata"]["labels"]}
    if ours["metadata"].get("annotations"):
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **ours["metadata"]["annotations"]}
    return {"metadata": metadata, "spec": spec}
