"""A manager of a Kubernetes experiment whose pods reach the hub only through the hub tunnel is
SIGKILLed mid-trial and restarted on the same directory: it listens on the same hub port with the
same certificate, the agents in the running pods (on the bridged pod network) redial through the
same relay pod, over new port-forward streams; their trials are re-attached (not restarted), every
metric is stored and heard exactly once, and clean_up leaves no object and no process behind.

The same with pods dialling nniManagerIp directly is the job-platform contract suite's, for each
Kubernetes platform (tests/platforms/test_job_contract.py, tests/support/job_platforms.py)."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.manager.helpers import TRIAL, check_resumed, sigkill_after_metrics, start_manager


def start(config: Path, mode: str):  # -> Popen[str]
    return start_manager("KubeRestart1", mode, 2, "--config", str(config), "--step-sleep", "0.3")


def test_manager_sigkill_and_restart_reattaches_running_pods_through_the_tunnel(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(pod_network="bridged")
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 2,
        "trialGracePeriod": 2, "experimentWorkingDirectory": str(tmp_path / "exps"),
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "reuseMode": True,
                            "dockerImage": "nni-test/python:3.11", "cpuNumber": 1, "memorySize": "256mb"},
    }))
    exp_dir = tmp_path / "exps" / "KubeRestart1"
    first = start(config, "new")
    out1, before = sigkill_after_metrics(first, exp_dir, trials=2, timeout=90)
    ours = "app=nni-kubernetes-trial,expId=KubeRestart1"
    pods = {p.metadata.name for p in kube.core().list_namespaced_pod("default", label_selector=ours).items}
    assert len(pods) == 2  # the trials' pods keep running without a manager
    relay = "app=nni-hub-relay,expId=KubeRestart1"
    assert len(kube.core().list_namespaced_pod("default", label_selector=relay).items) == 1

    second = start(config, "resume")
    out2, err2 = second.communicate(timeout=120)
    assert second.returncode == 0, err2[-3000:]

    trials = check_resumed(exp_dir, out2, before)
    # re-attached, not restarted: the same pods ran the trials to their end
    assert {t.environment_id for t in trials} == {"env1", "env2"}
    core = kube.core()
    kube.wait_for(lambda: not core.list_namespaced_pod("default", label_selector=ours).items, 30, what="pods gone")
    assert not core.list_namespaced_secret("default", label_selector=ours).items
    assert not core.list_namespaced_config_map("default", label_selector=ours).items
    kube.wait_for(lambda: not core.list_namespaced_pod("default", label_selector=relay).items, 30, what="relay gone")
    assert not core.list_namespaced_service("default", label_selector=relay).items
    kube.wait_for(lambda: not kube.leftover_processes(), 30, what="no pod process left")
