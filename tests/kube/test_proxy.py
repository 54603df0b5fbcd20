"""The manager behind a corporate proxy (issue 30, item 3): API calls and the hub tunnel's
port-forward WebSocket both go the way the official client goes: the kubeconfig's `proxy-url`, else
HTTPS_PROXY unless NO_PROXY names the server, with the kubeconfig's `tls-server-name` for SNI and
verification. The test bed enforces it: `nni-manager run` runs in a network namespace of the
test's own holding only `lo`, whose only way to the API server is a real HTTP CONNECT proxy
(Debian's tinyproxy, in the root namespace on loopback). The kubeconfig names the API server's real
address, which inside the namespace answers nothing: a connection that dials around the proxy is
refused, as a corporate firewall drops it. Before the fix, everything started and no agent connected."""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.backends.kubernetes import proxy, tunnel
from tests.support import http_proxy
from tests.support.kube.harness import IMAGE
from tests.support.netns_forward import Laptop

NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
NS = "default"
TRIALS = 2
RUN_TIMEOUT = 240  # a run takes under a minute; without the fix it waits for agents that never come
TRIAL = textwrap.dedent("""
    import nni_agent as nni
    p = nni.get_next_parameter()
    nni.report_final_result(p["x"] * 10)
""")
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy",
              "WSS_PROXY", "wss_proxy", "ALL_PROXY", "all_proxy")


def _env(**extra: str) -> dict[str, str]:
    """This process's environment with no proxy settings but `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    return {**env, **extra}


def _kubeconfig(kube: Any, path: Path, server: str | None = None, **cluster: str) -> Path:
    data = yaml.safe_load(Path(kube.kubeconfig).read_text())
    for c in data["clusters"]:
        if server is not None:
            c["cluster"]["server"] = server
        c["cluster"].update(cluster)
    path.write_text(yaml.safe_dump(data))
    return path


def _config(base: Path, kubeconfig: Path) -> Path:
    code = base / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({  # no nniManagerIp: pods reach the manager only through the hub tunnel
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": TRIALS,
        "maxTrialNumber": TRIALS, "searchSpace": {"x": {"_type": "choice", "_value": list(range(1, TRIALS + 1))}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kubeconfig), "dockerImage": IMAGE,
                            "cpuNumber": 0.5, "memorySize": "256mb"}}))
    return config


def _succeeded(base: Path, run: subprocess.CompletedProcess) -> str:
    """Asserts the run ended with every trial SUCCEEDED; returns the experiment id."""
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"stopped: maxTrialNumber ({TRIALS}) reached" in run.stdout, run.stdout
    (exp_dir,) = (base / "exps").iterdir()
    table = subprocess.run([NNI_MANAGER, "trials", str(exp_dir)], cwd=base, capture_output=True, text=True,
                           timeout=60)
    assert len(re.findall(r"SUCCEEDED", table.stdout)) == TRIALS, table.stdout + table.stderr
    return exp_dir.name


def _refused_inside(laptop: Laptop, port: int, host: str = "127.0.0.1") -> bool:
    """True when a direct connection from inside the namespace to host:port is refused."""
    probe = (f"import socket\ntry:\n    socket.create_connection(({host!r}, {port}), 3)\nexcept OSError:\n"
             "    print('refused')\n")
    out = subprocess.run(laptop.exec([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=30)
    return out.stdout.strip() == "refused"


@pytest.mark.parametrize("how", ["HTTPS_PROXY", "proxy-url"])
def test_trials_succeed_with_the_proxy_as_the_only_way_to_the_api_server(kube_factory, short_dir: Path,
                                                                         how: str) -> None:
    if not http_proxy.available():
        pytest.skip("needs tinyproxy (apt-get install tinyproxy; scripts/test.sh installs it)")
    kube = kube_factory(pod_network="bridged")
    base = short_dir
    password = secrets.token_hex(8)  # the proxy asks for credentials, as corporate proxies do
    with http_proxy.TinyProxy(base, auth=("alice", password)) as corporate, \
            Laptop(f"proxied-{secrets.token_hex(4)}") as laptop:
        port = laptop.forward(corporate.port)  # inside the namespace, 127.0.0.1:port is the proxy
        assert port != kube.port and laptop.interfaces() == ["lo"]
        assert _refused_inside(laptop, kube.port)  # the API server's own address: nothing there
        proxy_url = f"http://alice:{password}@127.0.0.1:{port}"
        if how == "proxy-url":
            kubeconfig = _kubeconfig(kube, base / "kubeconfig", **{"proxy-url": proxy_url})
            env = _env()
        else:  # as users set it, loopback and in-cluster names excepted, not the API server
            kubeconfig = _kubeconfig(kube, base / "kubeconfig")
            env = _env(HTTPS_PROXY=proxy_url, NO_PROXY="localhost,.svc,.cluster.local")
        run = subprocess.run(laptop.exec([NNI_MANAGER, "run", "--plain", "--no-webui",
                                          str(_config(base, kubeconfig))]),
                             cwd=base, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        experiment_id = _succeeded(base, run)
        connects, established = corporate.connects(), corporate.established()
    # every connection went through the proxy to the API server: the API calls and the tunnel's
    # streams (POOL idle ones, and one more per agent connection carried)
    assert set(connects) == {f"127.0.0.1:{kube.port}"}, connects
    assert established > tunnel.POOL + TRIALS, (established, connects)
    logs = "".join(p.read_text(errors="replace") for p in (base / "exps").rglob("*") if p.is_file())
    assert password not in run.stdout + run.stderr + logs  # the proxy's password is never shown
    relay = [st.get("phase") for st in kube.history("pods", NS, tunnel.relay_name(experiment_id))]
    assert "Running" in relay, relay


def test_tls_server_name_names_the_certificate_for_the_tunnel_too(kube_factory, short_dir: Path) -> None:
    """The API server reached at an address its certificate does not name (a load balancer's, an
    SSH forward's), with `tls-server-name` naming one it does (the emulator's: localhost)."""
    kube = kube_factory(pod_network="bridged")
    base = short_dir
    with Laptop(f"sni-{secrets.token_hex(4)}") as laptop:
        address = "127.0.0.2"  # netns only: a loopback address inside the namespace, not in the certificate
        port = laptop.forward(kube.port, host=address)
        assert _refused_inside(laptop, port, "127.0.0.1")  # only the address above leads anywhere
        kubeconfig = _kubeconfig(kube, base / "kubeconfig", server=f"https://{address}:{port}",
                                 **{"tls-server-name": "localhost"})
        run = subprocess.run(laptop.exec([NNI_MANAGER, "run", "--plain", "--no-webui",
                                          str(_config(base, kubeconfig))]),
                             cwd=base, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
        _succeeded(base, run)
    assert "certificate verify failed" not in run.stdout + run.stderr


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:6443", {proxy}}}}}]
users: [{{name: u, user: {{token: t0ken}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u, namespace: default}}}}]
current-context: c
"""


@pytest.mark.parametrize("how", ["proxy-url", "HTTPS_PROXY"])
def test_a_socks_proxy_is_refused_in_one_line(tmp_path: Path, how: str) -> None:
    socks = "socks5://user:s3cret@127.0.0.1:1080"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(proxy=f"proxy-url: {socks!r}" if how == "proxy-url" else ""))
    (tmp_path / "code").mkdir()
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "tuner": {"name": "Random"},
        "experimentWorkingDirectory": "exps",
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kubeconfig), "dockerImage": IMAGE}}))
    env = _env(HTTPS_PROXY=socks) if how == "HTTPS_PROXY" else _env()
    run = subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    lines = [line for line in out.splitlines() if "socks5 proxies are not supported" in line]
    assert len(lines) == 1, out
    assert how in lines[0] and "HTTP CONNECT" in lines[0] and "http://host:port" in lines[0], lines
    assert "s3cret" not in out and "Traceback" not in out, out


class _Cfg:
    """The fields of a kubernetes.aio Configuration that pick the route."""

    def __init__(self, host: str = "https://api.example.test:6443", proxy: str | None = None,  # not dialed
                 tls_server_name: str | None = None) -> None:
        self.host, self.proxy, self.tls_server_name, self.proxy_headers = host, proxy, tls_server_name, None


@pytest.mark.parametrize("no_proxy, proxied", [
    ("", True), ("localhost,.svc", True), ("api.example.test", False), (".example.test", False),
    ("example.test", False), ("*", False), ("other.test,api.example.test", False)])
def test_no_proxy_matching_is_the_clients(monkeypatch: pytest.MonkeyPatch, no_proxy: str, proxied: bool) -> None:
    for k in PROXY_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.test:3128")  # not dialed
    monkeypatch.setenv("NO_PROXY", no_proxy)
    r = proxy.route(_Cfg())
    assert r.proxy == ("http://proxy.example.test:3128" if proxied else None)  # not dialed


def test_proxy_url_wins_over_the_environment_and_tls_server_name_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy.example.test:3128")  # not dialed
    monkeypatch.setenv("NO_PROXY", "api.example.test")
    r = proxy.route(_Cfg(proxy="http://kubeconfig-proxy.example.test:8080", tls_server_name="kubernetes"))
    assert (r.proxy, r.server_hostname) == ("http://kubeconfig-proxy.example.test:8080", "kubernetes")  # not dialed


OIDC_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from kubernetes.aio import client as aio
    from nni_manager.backends.kubernetes.client import load_client
    from nni_manager.backends.kubernetes.config import KubeConfig

    async def main():
        api = await load_client(KubeConfig(kube_config=sys.argv[1]))
        try:
            await aio.CoreV1Api(api).list_namespaced_pod("default")
            await asyncio.sleep(2.5)  # the id-token expires: refreshed at the issuer
            await aio.CoreV1Api(api).list_namespaced_pod("default")
        finally:
            await api.close()
        print("listed")

    asyncio.run(main())
""")


def test_oidc_tokens_are_refreshed_through_the_proxy(kube, short_dir: Path) -> None:
    """The OIDC issuer (Dex, Keycloak) is reached as the API server is: through HTTPS_PROXY, as
    kubectl's oidc auth-provider does (the environment's proxy, not the cluster's proxy-url)."""
    from tests.support.kube.oidc import oidc_kubeconfig

    if not http_proxy.available():
        pytest.skip("needs tinyproxy (apt-get install tinyproxy; scripts/test.sh installs it)")
    path, _ = oidc_kubeconfig(kube, short_dir, lifetime=2)
    with http_proxy.TinyProxy(short_dir) as corporate, Laptop(f"oidc-{secrets.token_hex(4)}") as laptop:
        port = laptop.forward(corporate.port)
        assert port != kube.port and _refused_inside(laptop, kube.port)  # the issuer's and API server's address
        run = subprocess.run(laptop.exec([sys.executable, "-c", OIDC_SCRIPT, str(path)]), cwd=short_dir,
                             env=_env(HTTPS_PROXY=f"http://127.0.0.1:{port}"), capture_output=True, text=True,
                             timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "listed", run.stdout + run.stderr
    stats = kube.oidc_stats()
    assert stats["refreshGrants"] >= 1 and not stats["refused"], stats


def test_a_proxy_refusing_the_credentials_is_the_proxys_line_not_the_clusters(short_dir: Path) -> None:
    """A wrong proxy password: tinyproxy refuses the CONNECT (it answers 401 with its own realm, others
    407). Before, the line said the cluster refused the kubeconfig's credentials."""
    if not http_proxy.available():
        pytest.skip("needs tinyproxy (apt-get install tinyproxy; scripts/test.sh installs it)")
    wrong = secrets.token_hex(8)
    with http_proxy.TinyProxy(short_dir, auth=("alice", secrets.token_hex(8))) as corporate:
        proxy_url = f"http://alice:{wrong}@127.0.0.1:{corporate.port}"
        kubeconfig = short_dir / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG.format(proxy=f"proxy-url: {proxy_url!r}"))
        (short_dir / "code").mkdir()
        config = short_dir / "config.yml"
        config.write_text(yaml.safe_dump({
            "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
            "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
            "tuner": {"name": "Random"}, "experimentWorkingDirectory": "exps",
            "trainingService": {"platform": "kubernetes", "kubeConfig": str(kubeconfig), "dockerImage": IMAGE}}))
        run = subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=short_dir, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert corporate.connects() and not corporate.established()  # it was asked, and said no
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    lines = [line for line in out.splitlines() if "the proxy refused to open a connection to the API server" in line]
    assert len(lines) == 1 and "proxy-url" in lines[0], out
    assert "refused the credentials" not in out and "Traceback" not in out, out
    logs = "".join(p.read_text(errors="replace") for p in (short_dir / "exps").rglob("*") if p.is_file())
    assert wrong not in out + logs
