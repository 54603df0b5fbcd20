"""An exec credential plugin that returns short-lived client certificates, as Pinniped's
(`pinniped login static|oidc`) and Teleport's (`tsh kube credentials`) do: it asks the identity
provider (here the emulator's certificate issuer, standing in for Pinniped's Concierge) for a
certificate signed by the cluster's client CA and prints an ExecCredential
(client.authentication.k8s.io/v1) with clientCertificateData, clientKeyData and
expirationTimestamp. Each run appends a line to $RUNS. Run by the client as
`python cert_plugin.py` (stdlib only); `kubeconfig()` writes a kubeconfig that names it."""
import json
import os
import ssl
import sys
import urllib.request
from pathlib import Path
from typing import Any

API_VERSION = "client.authentication.k8s.io/v1"


def main() -> None:
    info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}")  # what the client tells its plugins
    if info and info.get("apiVersion") != API_VERSION:
        sys.exit(f"cert_plugin: asked for {info.get('apiVersion')}, speaks {API_VERSION}")
    req = urllib.request.Request(os.environ["EMU_URL"] + "/emulator/v1/certificates", method="POST",
                                 data=json.dumps({"user": os.environ.get("CERT_USER", "cert-user"),
                                                  "lifetime": float(os.environ["LIFETIME"])}).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["EMU_ADMIN"]})
    with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=os.environ["EMU_CA"])) as r:
        issued = json.loads(r.read())
    with open(os.environ["RUNS"], "a") as f:
        f.write(issued["expirationTimestamp"] + "\n")
    print(json.dumps({"apiVersion": API_VERSION, "kind": "ExecCredential", "status": {
        "clientCertificateData": issued["certificate"], "clientKeyData": issued["key"],
        "expirationTimestamp": issued["expirationTimestamp"]}}))


def kubeconfig(kube: Any, directory: Path, lifetime: float) -> tuple[Path, Path]:
    """(kubeconfig, runs file): the emulator's kubeconfig whose user is this plugin, certificates
    living `lifetime` seconds."""
    import yaml

    runs = directory / "cert-runs.txt"
    data = yaml.safe_load(Path(kube.kubeconfig).read_text())
    env = {"EMU_URL": kube.url, "EMU_ADMIN": kube.token, "EMU_CA": str(kube.state_dir / "ca.crt"),
           "RUNS": str(runs), "LIFETIME": str(lifetime)}
    data["users"][0]["user"] = {"exec": {"apiVersion": API_VERSION, "command": sys.executable, "args": [__file__],
                                         "env": [{"name": k, "value": v} for k, v in env.items()],
                                         "interactiveMode": "Never", "provideClusterInfo": False}}
    path = directory / "cert-kubeconfig"
    path.write_text(yaml.safe_dump(data))
    return path, runs


if __name__ == "__main__":
    main()
