"""Exec plugins that return client certificates (Pinniped, Teleport; issue 30, Part 2 item 8): the
emulator authenticates by client certificate against its client CA on every request and refuses
one that has expired (401, as kube-apiserver's x509 authenticator), and a real plugin script
(tests/support/kube/cert_plugin.py) hands out certificates that live a few seconds. The manager
must run the plugin again before they expire and use the new certificate, on its API calls and on
the hub tunnel's port-forwards. Before the fix it kept the first certificate: once it expired every
call was refused, and the experiment failed."""
from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import json
import re
import ssl
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

from nni_manager.backends.kubernetes.client import load_client
from nni_manager.backends.kubernetes.config import KubeConfig
from tests.support.experiment.fixtures import processes_under
from tests.support.kube import cert_plugin
from tests.support.kube.harness import IMAGE

NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
LIFETIME = 4.0


def _issue(kube, lifetime: float) -> dict:
    return kube._call("POST", "/emulator/v1/certificates", {"user": "alice", "groups": ["devs"], "lifetime": lifetime})


def test_the_emulator_refuses_an_expired_client_certificate_on_its_next_request(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(client_ca=True)
    issued = _issue(kube, 2.0)
    (tmp_path / "c.pem").write_text(issued["certificate"])
    (tmp_path / "k.pem").write_text(issued["key"])
    ctx = ssl.create_default_context(cafile=str(kube.state_dir / "ca.crt"))
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    conn = http.client.HTTPSConnection("127.0.0.1", kube.port, context=ctx, timeout=10)
    try:
        conn.request("GET", "/api/v1/namespaces/default/pods")
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
        time.sleep(2.5)  # expired now: the same (kept-alive) connection is refused on its next request
        conn.request("GET", "/api/v1/namespaces/default/pods")
        r = conn.getresponse()
        assert r.status == 401 and json.loads(r.read())["reason"] == "Unauthorized"
    finally:
        conn.close()
    # neither token nor certificate: 401 as well
    plain = http.client.HTTPSConnection("127.0.0.1", kube.port, timeout=10,
                                        context=ssl.create_default_context(cafile=str(kube.state_dir / "ca.crt")))
    plain.request("GET", "/api/v1/namespaces/default/pods")
    assert plain.getresponse().status == 401
    plain.close()


def test_the_client_renews_an_exec_plugins_client_certificate(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(client_ca=True)
    from kubernetes.aio import client as aio

    path, runs = cert_plugin.kubeconfig(kube, tmp_path, LIFETIME)

    async def body() -> None:
        api = await load_client(KubeConfig(kube_config=path))
        try:
            core = aio.CoreV1Api(api)
            await core.list_namespaced_pod("default")
            issued = runs.read_text().split()
            expires = dt.datetime.strptime(issued[-1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
            await asyncio.sleep(max(0.0, (expires - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.5)
            await core.list_namespaced_pod("default")  # the certificate in use has expired: renewed, not refused
            assert len(runs.read_text().split()) > len(issued)
        finally:
            await api.close()

    asyncio.run(body())


TRIAL = textwrap.dedent("""
    import time
    import nni_agent as nni
    p = nni.get_next_parameter()
    for i in range(4):
        nni.report_intermediate_result(i)
        time.sleep(0.5)
    nni.report_final_result(p["x"])
""")


def test_an_experiment_outlives_its_client_certificates(kube_factory, short_dir: Path) -> None:
    """`nni-manager run` with certificates living LIFETIME s, a run several times as long, agents
    reaching the hub only through the tunnel (its port-forwards authenticate with the certificate)."""
    kube = kube_factory(pod_network="bridged", client_ca=True)
    base = short_dir
    kubeconfig, runs = cert_plugin.kubeconfig(kube, base, LIFETIME)
    trials = 3
    (base / "code").mkdir()
    (base / "code" / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({  # no nniManagerIp: the hub tunnel
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": trials, "searchSpace": {"x": {"_type": "choice", "_value": list(range(trials))}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kubeconfig), "dockerImage": IMAGE,
                            "cpuNumber": 0.5, "memorySize": "256mb", "reuseMode": False}}))
    started = time.monotonic()
    run = subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=base,
                         capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"stopped: maxTrialNumber ({trials}) reached" in run.stdout, run.stdout + run.stderr
    (exp_dir,) = (base / "exps").iterdir()
    table = subprocess.run([NNI_MANAGER, "trials", str(exp_dir)], cwd=base, capture_output=True, text=True,
                           timeout=60)
    assert len(re.findall(r"SUCCEEDED", table.stdout)) == trials, table.stdout + table.stderr
    # the run outlived several certificates: the plugin ran again for each (how long it took is only told)
    assert len(runs.read_text().split()) >= 3, (took, runs.read_text())
    assert processes_under(base) == []
