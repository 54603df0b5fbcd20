"""The Kubernetes client (official `kubernetes.aio`), its credentials, and its errors in one line."""
from __future__ import annotations

import json
import os
import socket
from typing import Any
from urllib.parse import urlparse

from nni_manager.backends.base import BackendError
from nni_manager.backends.kubernetes.config import KubeConfig


class KubeError(BackendError):
    """One clear line about a Kubernetes API error."""


def api_error(e: Exception, doing: str) -> KubeError:
    """ApiException -> one line naming the status and the likely fix."""
    status = getattr(e, "status", None)
    body: Any = getattr(e, "body", None)
    message = ""
    if isinstance(body, (bytes, str)):
        try:
            parsed = json.loads(body)
            message = parsed.get("message", "") if isinstance(parsed, dict) else ""
        except ValueError:
            message = (body.decode(errors="replace") if isinstance(body, bytes) else body).strip()
    message = message or getattr(e, "reason", "") or str(e)
    if status == 401:
        return KubeError(f"{doing}: the cluster refused the credentials (401 Unauthorized): check the token or "
                         "certificate in your kubeconfig (`kubectl auth whoami`)")
    if status == 403:
        return KubeError(f"{doing}: forbidden (403): {message}; grant that verb on that resource to your user "
                         "or service account (RBAC)")
    if status == 404 and message.startswith("404 page not found"):
        return KubeError(f"{doing}: the API server does not serve this resource (404): is the operator "
                         "installed, and does it serve this apiVersion?")
    if status is None:
        return KubeError(f"{doing}: cannot reach the API server: {e}")
    return KubeError(f"{doing}: {status} {message}")


def manager_ip_for(url: str) -> str:
    """The address this machine uses to reach `url` (a UDP 'connect' sends no packet)."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or (443 if parsed.scheme == "https" else 80)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


async def load_client(kube: KubeConfig) -> Any:
    """An ApiClient from the kubeconfig (`kubeConfig`, `context`, KUBECONFIG, ~/.kube/config), or
    the pod's service account when the manager runs in the cluster and no kubeconfig is named."""
    from kubernetes.aio import client, config

    cfg = client.Configuration()
    try:
        if kube.kube_config is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            config.load_incluster_config(client_configuration=cfg)
        else:
            await config.load_kube_config(config_file=str(kube.kube_config) if kube.kube_config else None,
                                          context=kube.context, client_configuration=cfg)
    except Exception as e:  # ConfigException, missing files, bad YAML
        raise KubeError(f"cannot load Kubernetes credentials: {e} (set trainingService.kubeConfig, "
                        "KUBECONFIG, or run inside a cluster)") from None
    return client.ApiClient(configuration=cfg)
