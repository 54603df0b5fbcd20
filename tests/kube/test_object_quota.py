"""ResourceQuota on object counts (issue 30, Part 2 item 8): a namespace whose quota caps
`count/secrets` or `count/configmaps` (common in shared, multi-tenant clusters) refuses one more
with the quota admission plug-in's 403 "exceeded quota". `nni-manager run` says so in one line
naming the quota and what it counts, not as an RBAC problem and without a traceback. Before the
fix the emulator counted only pods, and the line blamed cpuNumber / memorySize."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.experiment.fixtures import processes_under
from tests.support.kube.harness import IMAGE

NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIAL = "import nni_agent as nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'] * 10)\n"


def _run(kube: Any, base: Path, trials: int = 1) -> subprocess.CompletedProcess:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": trials,
        "maxTrialNumber": trials, "searchSpace": {"x": {"_type": "choice", "_value": list(range(1, trials + 1))}}, "nniManagerIp": "127.0.0.1",
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "reuseMode": False,
                            "dockerImage": IMAGE, "cpuNumber": 0.5, "memorySize": "256mb",
                            "environmentStartTimeout": "60s"}}))
    return subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=base,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("resource", ["secrets", "configmaps"])
def test_an_object_count_quota_is_one_line_naming_the_quota(kube, short_dir: Path, resource: str) -> None:
    core = kube.core()
    used = len(getattr(core, f"list_namespaced_{resource[:-1].replace('configmap', 'config_map')}")("default").items)
    core.create_namespaced_resource_quota("default", {"metadata": {"name": "objects"},
                                                      "spec": {"hard": {f"count/{resource}": str(used)}}})
    run = _run(kube, short_dir)
    out = run.stdout + run.stderr
    line = next((x for x in out.splitlines() if "ResourceQuota objects" in x), "")
    assert f"allows no more {resource} (count/{resource}: {used} used of {used}" in line, out
    assert "not RBAC" in line and "kubectl describe resourcequota objects" in line, out
    assert "cpuNumber" not in line and "grant that verb" not in out and "Traceback" not in out, out
    assert processes_under(short_dir) == []


def test_trials_over_a_pod_count_quota_wait_for_room_instead_of_failing(kube, short_dir: Path) -> None:
    """`count/pods` leaves room for one trial pod while two are wanted: the second pod's create is
    refused (403 exceeded quota) until the first pod ends, and its trial waits for the room rather
    than failing (before the fix: FAILED at once with the quota's line)."""
    core = kube.core()
    used = sum(1 for p in core.list_namespaced_pod("default").items if p.status.phase not in ("Succeeded", "Failed"))
    core.create_namespaced_resource_quota("default", {"metadata": {"name": "pods"},
                                                      "spec": {"hard": {"count/pods": str(used + 1)}}})
    run = _run(kube, short_dir, trials=2)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "maxTrialNumber (2) reached" in out, out
    (exp_dir,) = (short_dir / "exps").iterdir()
    table = subprocess.run([NNI_MANAGER, "trials", str(exp_dir)], cwd=short_dir, capture_output=True, text=True,
                           timeout=60)
    assert table.stdout.count("SUCCEEDED") == 2, table.stdout + table.stderr
    assert "Traceback" not in out and processes_under(short_dir) == []
