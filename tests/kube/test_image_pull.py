"""Images that take minutes to pull (a multi-GB training image on a fresh node): the probe pod that
learns the image's Python waits while its image is pulled, up to the start deadline, and says the
pull's progress, instead of giving up after its short budget and shipping nothing (then every
trial pod of an image without the agent's dependencies fails). Scaled down: the emulator's kubelet
takes 8 s to pull `python:3.11-slim` (the system Python alone), the probe's budget is 4 s."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nni_manager.backends import agent_deps
from nni_manager.store import Store
from tests.support.kube.harness import SLIM_IMAGE
from tests.support.kube.policy import set_policy

NS = "default"
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"
TRIAL = "import nni_agent as nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'] * 10)\n"
# `nni-manager run`, with the probe's check budget (120 s once its container runs) scaled to 4 s: an
# 8 s pull outlasts it, so the test fails if the pull counted against it
RUN = ("import sys\nfrom nni_manager.backends.kubernetes import probe\nprobe.RUN_TIMEOUT = 4.0\n"
       "from nni_manager.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def test_the_probe_waits_for_a_slow_pull_and_trials_succeed(kube, short_dir: Path) -> None:
    if not any(WHEELHOUSE.glob("grpcio-*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    set_policy(kube, pullSeconds={SLIM_IMAGE: 8})
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = short_dir / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "nniManagerIp": "127.0.0.1", "agentWheelhouse": str(WHEELHOUSE),
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "reuseMode": False,
                            "dockerImage": SLIM_IMAGE, "cpuNumber": 1, "memorySize": "512mb",
                            "environmentStartTimeout": "120s"}}))
    env = {**os.environ, agent_deps.CACHE_ENV: str(short_dir / "wheel-cache")}  # no probe answer cached
    run = subprocess.run([sys.executable, "-c", RUN, "run", "--plain", "--no-webui", str(config)], cwd=short_dir,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (exp_dir,) = (short_dir / "exps").iterdir()
    store = Store.open_readonly(exp_dir)
    try:
        trials = store.trials()
    finally:
        store.close()
    assert [t.status.value for t in trials] == ["SUCCEEDED"], [(t.status.value, t.message) for t in trials]
    logged = (exp_dir / "log" / "nnimanager.log").read_text()
    assert f'is pulling its image (Pulling image "{SLIM_IMAGE}"): ' in logged, logged[-3000:]
    assert "so far, waiting up to environmentStartTimeout (120 s)" in logged, logged[-3000:]
    shipped = kube.core().list_namespaced_config_map(NS, label_selector="app=nni-agent-deps").items
    assert shipped  # the probe answered: the image's dependencies were shipped
