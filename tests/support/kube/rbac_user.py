"""A least-privilege user on the Kubernetes emulator: the Role docs/platforms/kubernetes.md ships,
bound to user alice, and alice's kubeconfig (tests/kube/test_rbac.py, test_tunnel_rbac.py)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.kube.harness import kubeconfig_with_token

ROOT = Path(__file__).resolve().parents[3]
NS = "default"
USER_TOKEN = "alice-token"


def doc_role() -> dict[str, Any]:
    """The Role exactly as docs/platforms/kubernetes.md ships it."""
    text = (ROOT / "docs" / "platforms" / "kubernetes.md").read_text()
    section = text[text.index("## Permissions (RBAC)"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "no yaml block under Permissions (RBAC)"
    role = yaml.safe_load(block.group(1))
    assert role["kind"] == "Role"
    return role


def rbac_api(kube: Any):
    from kubernetes import client
    return client.RbacAuthorizationV1Api(kube.api_client())


def bind_alice(kube: Any, role: dict[str, Any]) -> Path:
    """Apply `role` as the admin, bind it to user alice; alice's kubeconfig."""
    api = rbac_api(kube)
    api.create_namespaced_role(NS, role)
    api.create_namespaced_role_binding(NS, {
        "metadata": {"name": "alice"}, "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}})
    return kubeconfig_with_token(kube, kube.state_dir / "alice-kubeconfig", USER_TOKEN)
