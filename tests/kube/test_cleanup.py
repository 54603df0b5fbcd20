"""Nothing left behind after a crash (issue 30, item 7): `nni-manager run` on the emulator, the
manager SIGKILLed while its trials run (its stop never runs), then `nni-manager cleanup ID` (or
`--all-orphans`) deletes the experiment's owner ConfigMap and the emulator's garbage collector,
which follows the real one's ownerReferences rules, removes every pod, custom object, Secret,
ConfigMap, Service, ServiceAccount, Role and RoleBinding of the experiment."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.backends.kubernetes import owner
from tests.support.kube.harness import IMAGE

NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIAL = textwrap.dedent("""
    import os, time
    import nni_agent as nni
    nni.get_next_parameter()
    nni.report_intermediate_result(1)
    while True:  # runs until its pod is deleted
        time.sleep(0.2)
""")
GROUPS = {"kubeflow": ("kubeflow.org", "v1", "tfjobs"), "trainer": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
          "frameworkcontroller": ("frameworkcontroller.microsoft.com", "v1", "frameworks")}


def _training_service(platform: str, kubeconfig: str) -> dict[str, Any]:
    common = {"platform": platform, "kubeConfig": kubeconfig, "reuseMode": False}
    if platform == "kubernetes":
        return {**common, "dockerImage": IMAGE, "cpuNumber": 1, "memorySize": "512mb"}
    if platform in ("kubeflow", "trainer"):  # trainer: Kubeflow Trainer v2's TrainJob
        version = {"operator": "tf-operator", "apiVersion": "v1"} if platform == "kubeflow" else {"operator": "trainer"}
        return {**common, "platform": "kubeflow", **version, "worker": {
            "replicas": 1, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
            "dockerImage": IMAGE}}
    return {**common, "taskRoles": [{
        "name": "worker", "taskNumber": 1, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
        "gpuNumber": 0, "dockerImage": IMAGE,
        "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceedTaskCount": 1}}]}


def everything_of(kube: Any, experiment_id: str, platform: str) -> dict[str, list[str]]:
    """Every object in the namespace labelled with the experiment's id (any app), by kind."""
    from kubernetes import client

    api = kube.api_client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    sel = f"expId={experiment_id}"
    found = {
        "pods": core.list_namespaced_pod(NS, label_selector=sel).items,
        "secrets": core.list_namespaced_secret(NS, label_selector=sel).items,
        "configmaps": core.list_namespaced_config_map(NS, label_selector=sel).items,
        "services": core.list_namespaced_service(NS, label_selector=sel).items,
        "serviceaccounts": core.list_namespaced_service_account(NS, label_selector=sel).items,
        "roles": rbac.list_namespaced_role(NS, label_selector=sel).items,
        "rolebindings": rbac.list_namespaced_role_binding(NS, label_selector=sel).items,
    }
    out = {k: sorted(o.metadata.name for o in v) for k, v in found.items()}
    if platform in GROUPS:
        group, version, plural = GROUPS[platform]
        items = client.CustomObjectsApi(api).list_namespaced_custom_object(group, version, NS, plural,
                                                                           label_selector=sel)["items"]
        out[plural] = sorted(o["metadata"]["name"] for o in items)
    return {k: v for k, v in out.items() if v}


def _sigkilled_experiment(kube: Any, base: Path, platform: str, experiment_id: str, env: dict[str, str],
                          before_kill: Any = None, **ts: Any) -> dict[str, list[str]]:
    """Run the experiment until both trials' pods run (then `before_kill()`), SIGKILL the manager;
    what it left."""
    code = base / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({  # no nniManagerIp: the hub tunnel (a relay pod) is on
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 2,
        "maxTrialNumber": 2, "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}},
        "tuner": {"name": "GridSearch"}, "trialGracePeriod": 2,
        # the default (~/nni-experiments), where `list --all` finds experiments run without a WebUI
        "experimentWorkingDirectory": str(Path(env["HOME"]) / "nni-experiments"),
        "trainingService": {**_training_service(platform, str(kube.kubeconfig)), **ts},
    }))
    manager = subprocess.Popen([NNI_MANAGER, "run", "--plain", "--no-webui", "--experiment-id", experiment_id,
                                str(config)], cwd=base, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    core = kube.core()
    try:
        def trials_run() -> bool:
            assert manager.poll() is None, "the manager ended before its trials ran"
            pods = core.list_namespaced_pod(NS, label_selector=f"app=nni-kubernetes-trial,expId={experiment_id}")
            return sum(p.status.phase == "Running" for p in pods.items) == 2

        kube.wait_for(trials_run, 180, what="both trials' pods running")
        if before_kill is not None:
            before_kill()
    finally:
        manager.send_signal(signal.SIGKILL)
        manager.wait()
    left = everything_of(kube, experiment_id, platform)
    # the crash left the experiment in the cluster, all of it naming the owner
    assert owner.owner_name(experiment_id) in left["configmaps"], left
    assert len(left["pods"]) >= 3, left  # both trials and the relay
    assert left["services"] == [f"nni-relay-{experiment_id.lower()}"], left
    if platform == "frameworkcontroller":
        assert left["serviceaccounts"] and left["roles"] and left["rolebindings"], left
    return left


@pytest.mark.slow
@pytest.mark.parametrize("how", ["id", "all-orphans"])
@pytest.mark.parametrize("platform", ["kubernetes", "kubeflow", "trainer", "frameworkcontroller"])
def test_cleanup_after_a_manager_sigkill_leaves_nothing(kube_factory, short_dir: Path, platform: str,
                                                        how: str) -> None:
    if how == "all-orphans" and platform != "kubernetes":
        pytest.skip("--all-orphans is the same command on every platform: once is enough")
    kube = kube_factory(pod_network="bridged", crd_groups=["kubeflow.org", "frameworkcontroller.microsoft.com",
                                                           "trainer.kubeflow.org"])
    if platform == "trainer":
        from kubernetes import client
        from tests.support.kube.operators import TORCH_DISTRIBUTED

        client.CustomObjectsApi(kube.api_client()).create_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", TORCH_DISTRIBUTED)
    experiment_id = f"Clean{platform[:4].capitalize()}1"
    env = {**os.environ, "HOME": str(short_dir / "home")}  # the experiments' manifest: this test's own
    (short_dir / "home").mkdir()
    def refused_while_running() -> None:  # never under a live manager (it holds the experiment's lock)
        live = subprocess.run([NNI_MANAGER, "cleanup", *args], cwd=short_dir, env=env, capture_output=True,
                              text=True, timeout=120)
        if how == "id":
            assert live.returncode == 1 and len(live.stderr.splitlines()) == 1, live.stdout + live.stderr
            assert f"nni-manager stop {experiment_id}" in live.stderr, live.stderr
        else:
            assert live.returncode == 0 and "left alone" in live.stdout, live.stdout + live.stderr
        assert owner.owner_name(experiment_id) in everything_of(kube, experiment_id, platform)["configmaps"]

    args = [experiment_id] if how == "id" else ["--all-orphans"]
    _sigkilled_experiment(kube, short_dir, platform, experiment_id, env,
                          refused_while_running if platform == "kubernetes" else None)

    run = subprocess.run([NNI_MANAGER, "cleanup", *args], cwd=short_dir, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines == [f"nni-manager: experiment {experiment_id}: deleted its owner ConfigMap "
                     f"{owner.owner_name(experiment_id)} in namespace {NS}; the garbage collector removed its "
                     "objects"], run.stdout
    assert everything_of(kube, experiment_id, platform) == {}
    kube.wait_for(lambda: not kube.leftover_processes(), 30, what="no pod process left")

    again = subprocess.run([NNI_MANAGER, "cleanup", experiment_id], cwd=short_dir, env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.splitlines() == [
        f"nni-manager: experiment {experiment_id}: nothing of it is left in namespace {NS}"], again.stdout


def test_cleanup_names_a_running_experiment_and_an_unknown_one(short_dir: Path) -> None:
    env = {**os.environ, "HOME": str(short_dir / "home")}
    (short_dir / "home").mkdir()
    run = subprocess.run([NNI_MANAGER, "cleanup", "NoSuchExp"], cwd=short_dir, env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 1 and len(run.stderr.splitlines()) == 1 and "no experiment 'NoSuchExp'" in run.stderr
    both = subprocess.run([NNI_MANAGER, "cleanup", "X", "--all-orphans"], cwd=short_dir, env=env,
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and both.stderr.splitlines() == [
        "nni-manager: cleanup takes an experiment id or --all-orphans (one of the two)"]


def _relay(kube: Any, experiment_id: str) -> Any:
    return kube.core().read_namespaced_pod(f"nni-relay-{experiment_id.lower()}", NS)


@pytest.mark.slow
def test_the_relay_ends_once_its_manager_is_gone_for_the_reconnect_window(kube_factory, short_dir: Path) -> None:
    """While the manager runs, the relay runs past reconnectWindow; once the manager is SIGKILLed
    the relay exits by itself after reconnectWindow (its pod Succeeded, holding nothing), saying why;
    the next experiment run in the namespace then deletes the dead one's owner (by the uid its relay
    names), so the garbage collector removes the rest."""
    kube = kube_factory(pod_network="bridged")
    experiment_id = "RelayEnds1"
    env = {**os.environ, "HOME": str(short_dir / "home")}
    (short_dir / "home").mkdir()
    window = 6

    def relay_outlives_the_window() -> None:
        started = _relay(kube, experiment_id).status.start_time
        assert started is not None
        time.sleep(window + 2)  # the manager is connected all along: the relay must not end
        assert _relay(kube, experiment_id).status.phase == "Running"

    _sigkilled_experiment(kube, short_dir, "kubernetes", experiment_id, env, relay_outlives_the_window,
                          reconnectWindow=f"{window}s")
    kube.wait_for(lambda: _relay(kube, experiment_id).status.phase == "Succeeded", 120,
                  what="the relay pod to end by itself")
    log = kube.core().read_namespaced_pod_log(f"nni-relay-{experiment_id.lower()}", NS)
    assert f"no connection from the manager for {window}s" in log and "exiting" in log, log
    assert everything_of(kube, experiment_id, "kubernetes")  # the rest waits for a cleanup

    # the next experiment run in the namespace deletes what the dead one left (its relay ended)
    later = short_dir / "later"
    (later / "code").mkdir(parents=True)
    (later / "code" / "trial.py").write_text("import nni_agent as nni\nnni.get_next_parameter()\n"
                                             "nni.report_final_result(1)\n")
    (later / "config.yml").write_text(yaml.safe_dump({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"name": "GridSearch"}, "trialGracePeriod": 2,
        "experimentWorkingDirectory": str(Path(env["HOME"]) / "nni-experiments"),
        "trainingService": _training_service("kubernetes", str(kube.kubeconfig)),
    }))
    run = subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", "--experiment-id", "LaterRun1", "config.yml"],
                         cwd=later, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    kube.wait_for(lambda: everything_of(kube, experiment_id, "kubernetes") == {}, 60,
                  what="the dead experiment's objects deleted by the next run")
    assert everything_of(kube, "LaterRun1", "kubernetes") == {}  # and the later one cleaned up after itself
    again = subprocess.run([NNI_MANAGER, "cleanup", experiment_id], cwd=short_dir, env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and "nothing of it is left" in again.stdout, again.stdout + again.stderr


@pytest.mark.slow
def test_a_finished_tfjob_goes_after_its_ttl_without_the_manager(kube_factory, short_dir: Path) -> None:
    """runPolicy.ttlSecondsAfterFinished (the v1 schema's field; the emulated operator honours it as
    the training operator does): after a manager SIGKILL the agents give up after reconnectWindow,
    the TFJobs finish, and the operator deletes them and their pods, with no cleanup command."""
    kube = kube_factory(pod_network="bridged", crd_groups=["kubeflow.org"])
    experiment_id = "TtlJobs1"
    env = {**os.environ, "HOME": str(short_dir / "home")}
    (short_dir / "home").mkdir()
    left = _sigkilled_experiment(kube, short_dir, "kubeflow", experiment_id, env, reconnectWindow="5s")
    assert len(left["tfjobs"]) == 2, left
    from kubernetes import client

    custom = client.CustomObjectsApi(kube.api_client())
    job = custom.get_namespaced_custom_object("kubeflow.org", "v1", NS, "tfjobs", left["tfjobs"][0])
    assert job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 5
    kube.wait_for(lambda: "tfjobs" not in everything_of(kube, experiment_id, "kubeflow"), 120,
                  what="the finished TFJobs deleted by their TTL")
    kube.wait_for(lambda: not kube.core().list_namespaced_pod(
        NS, label_selector=f"app=nni-kubernetes-trial,expId={experiment_id}").items, 60, what="their pods gone")
