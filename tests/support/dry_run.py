"""What `nni-manager run --dry-run` needs besides a platform section, now that it checks what `run`
checks: a tuner and a search space, and for the Kubernetes family the kubeconfig a user with a
cluster has (a dry run never dials it)."""
from __future__ import annotations

import os
from pathlib import Path

ALGORITHM = {"tuner": {"name": "Random"}, "searchSpace": {"x": {"_type": "choice", "_value": [1]}}}
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t0ken}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: default}}]
current-context: c
"""


def dry_run_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment plus KUBECONFIG naming a kubeconfig written under `tmp_path`."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return {**os.environ, "KUBECONFIG": str(path)}
