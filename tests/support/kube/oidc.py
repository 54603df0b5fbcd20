"""alice's OIDC login on the Kubernetes emulator and the kubeconfig kubectl's oidc
auth-provider would hold after it (shared by the OIDC and proxy tests)."""
from __future__ import annotations

import base64
from pathlib import Path

import yaml

CLIENT_ID, CLIENT_SECRET = "nni-cli", "oidc-client-secret-0123456789"
EMAIL = "alice@example.com"


def oidc_kubeconfig(kube, tmp_path: Path, lifetime: float) -> tuple[Path, dict]:
    """alice logs in at the issuer; her kubeconfig holds what the login wrote (kubectl's oidc
    auth-provider fields); the API server takes the `email` claim as the user name, and RBAC
    gives that user what an experiment needs."""
    kube.oidc_apiserver(client_id=CLIENT_ID, username_claim="email")
    rbac = kube.api_client()
    from kubernetes import client
    auth = client.RbacAuthorizationV1Api(rbac)
    auth.create_cluster_role({"metadata": {"name": "oidc-experimenter"}, "rules": [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})
    auth.create_cluster_role_binding({"metadata": {"name": "oidc-experimenter"},
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": "oidc-experimenter"},
                                      "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                                    "name": EMAIL}]})
    login = kube.oidc_login("alice", email=EMAIL, groups=["ml"], client_id=CLIENT_ID, client_secret=CLIENT_SECRET,
                            lifetime=lifetime)
    data = yaml.safe_load(kube.kubeconfig.read_text())
    data["users"] = [{"name": "alice", "user": {"auth-provider": {"name": "oidc", "config": {
        "client-id": CLIENT_ID, "client-secret": CLIENT_SECRET, "id-token": login["idToken"],
        "refresh-token": login["refreshToken"], "idp-issuer-url": login["issuer"],
        "idp-certificate-authority-data": base64.b64encode((kube.state_dir / "ca.crt").read_bytes()).decode()}}}}]
    data["contexts"] = [{"name": "alice@emulator", "context": {"cluster": "emulator", "user": "alice",
                                                               "namespace": "default"}}]
    data["current-context"] = "alice@emulator"
    path = tmp_path / "oidc-kubeconfig"
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o600)
    return path, login
