"""An evicted hub relay is re-created (issue 30, Part 2 item 8): the kubelet evicts the relay pod
(node pressure) mid-experiment; a port-forward to it then gets the kubelet's 500 (no running
sandbox), not a 400, and the manager must read that as "maybe gone", find the pod Failed and make a
new one. `nni-manager run` in the root namespace, pods on the bridged network with no route to it:
the relay is the agents' only way to the hub. Before the fix the tunnel retried the 500 forever,
no agent got back, and the run never ended."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.backends.kubernetes import tunnel
from nni_manager.store import Store
from tests.support.experiment.fixtures import processes_under
from tests.support.kube.harness import IMAGE

NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIALS = 4
STEPS = 10
RUN_TIMEOUT = 240  # a run takes under a minute; without the fix it waits for agents that never come back
TRIAL = textwrap.dedent(f"""
    import time
    import nni_agent as nni
    p = nni.get_next_parameter()
    for i in range({STEPS}):
        nni.report_intermediate_result(p["x"] * 100 + i)
        time.sleep(0.4)
    nni.report_final_result(p["x"])
""")


def _config(base: Path, kube: Any) -> Path:
    code = base / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({  # no nniManagerIp: pods reach the manager only through the hub tunnel
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 2,
        "maxTrialNumber": TRIALS, "searchSpace": {"x": {"_type": "choice", "_value": list(range(1, TRIALS + 1))}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "dockerImage": IMAGE,
                            "cpuNumber": 0.5, "memorySize": "256mb"}}))
    return config


def _metric_count(base: Path) -> int:
    dirs = list((base / "exps").glob("*/")) if (base / "exps").is_dir() else []
    if not dirs:
        return 0
    try:
        store = Store.open_readonly(dirs[0])
    except (FileNotFoundError, OSError):
        return 0
    try:
        return len(store.metrics())
    except Exception:  # noqa: BLE001 - the store is being created: no metric yet
        return 0
    finally:
        store.close()


@pytest.mark.slow
def test_an_evicted_relay_is_recreated_and_no_metric_is_lost(kube_factory, short_dir: Path) -> None:
    kube = kube_factory(pod_network="bridged")
    base = short_dir
    proc = subprocess.Popen([NNI_MANAGER, "run", "--plain", "--no-webui", str(_config(base, kube))], cwd=base,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the agents report through the relay: evict it once metrics flow, mid-trial
        kube.wait_for(lambda: _metric_count(base) >= 2 or proc.poll() is not None, 120, what="metrics through the relay")
        assert proc.poll() is None, proc.communicate()
        (exp_dir,) = (base / "exps").iterdir()
        relay = tunnel.relay_name(exp_dir.name)
        kube.evict(NS, relay)
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:  # it hung: stopped as a user would (Ctrl-C), so that it cleans up
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            print(out, err)
    assert proc.returncode == 0, out + err
    assert f"stopped: maxTrialNumber ({TRIALS}) reached" in out, out + err

    # the relay was evicted (Failed) and a new pod of the same name ran after it
    phases = [(st.get("phase"), st.get("reason")) for st in kube.history("pods", NS, relay)]
    evicted = phases.index(("Failed", "Evicted"))
    assert ("Running", None) in phases[evicted + 1:], phases
    table = subprocess.run([NNI_MANAGER, "trials", str(exp_dir)], cwd=base, capture_output=True, text=True,
                           timeout=60)
    assert len(re.findall(r"SUCCEEDED", table.stdout)) == TRIALS, table.stdout + table.stderr
    store = Store.open_readonly(exp_dir)
    try:
        trials, metrics = store.trials(), store.metrics()
    finally:
        store.close()
    assert sorted(t.status.value for t in trials) == ["SUCCEEDED"] * TRIALS
    for t in trials:  # every metric exactly once, in order, across the relay's eviction
        x = json.loads(t.form.hyper_parameters.value)["parameters"]["x"]
        got = [(m["type"], m["sequence"]) for m in metrics if m["trial_id"] == t.id]
        assert got == [("PERIODICAL", i) for i in range(STEPS)] + [("FINAL", 0)], (x, got)
    kube.wait_for(lambda: not kube.core().list_namespaced_pod(NS, label_selector=f"app={tunnel.APP}").items, 30,
                  what="the relay deleted")
    kube.wait_for(lambda: not kube.leftover_processes(), 30, what="no pod process left")
    assert processes_under(base) == []
