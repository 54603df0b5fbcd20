"""`platform: kubernetes` (one plain pod per environment) end to end on the Kubernetes emulator:
the backend's real code through the official client, real agents in real pod processes dialling
the manager's TLS hub. Every status path, reuse and non-reuse, the cluster's words for WAITING
trials, pods dying under a trial, API errors at start, secrets, cleanup and the dry run."""
from __future__ import annotations

import asyncio
import base64
import json
import re
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.kubernetes.client import KubeError
from nni_manager.backends.registry import backend_class
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.kube.fixtures import KubeNamespace, namespace_of
from tests.support.kube.harness import (
    SLIM_IMAGE,
    config,
    kubeconfig_with_token,
    objects_of,
    ours,
    pod_json,
    pods_service,
)
from tests.support.manager.helpers import form, message_with, release, sleeper, until, wait_status
from tests.support.bounded import run_bounded

T = 60.0  # generous polling timeout: two cores shared with other test runs


def run(coro: Any) -> Any:
    return run_bounded(coro, 150)


@pytest.fixture
def base(short_dir: Path) -> Path:
    return short_dir


@pytest.fixture
def kube(kube_ns: KubeNamespace) -> KubeNamespace:
    """This module's tests share the session's emulator, each in a namespace of its own; those that change
    the cluster itself (nodes, tokens) start a private one with `kube_factory`."""
    return kube_ns


def scheduled_pods(kube: Any, experiment_id: str) -> set[str]:
    """Every pod of the experiment the emulator ever scheduled (its `Scheduled` events outlive the pods)."""
    prefix = f"nniexp{experiment_id.lower()}"
    return {e.involved_object.name for e in kube.core().list_namespaced_event(namespace_of(kube)).items
            if e.reason == "Scheduled" and e.involved_object.kind == "Pod"
            and e.involved_object.name.startswith(prefix)}


def phases(kube: Any, pod: str) -> list[str]:
    return [s.get("phase", "") for s in kube.history("pods", namespace_of(kube), pod)]


def terminated(kube: Any, pod: str) -> list[dict]:
    """The `terminated` states the pod's containers ever reported."""
    out = []
    for s in kube.history("pods", namespace_of(kube), pod):
        for c in s.get("containerStatuses") or []:
            term = (c.get("state") or {}).get("terminated")
            if term and term not in out:
                out.append(term)
    return out


# ----------------------------------------------------------------------------- 1. every status path

def test_status_paths_and_metrics_exactly_once(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(), trialConcurrency=4)
    metrics: dict[str, list[str]] = defaultdict(list)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics[m.id].append(m.data))
            ok = await ts.submit_trial_job(form(0, x=7, steps=3))
            bad = await ts.submit_trial_job(form(1, action="fail", steps=1))
            cancel = await ts.submit_trial_job(sleeper(base, 2, "cancel"))
            stop = await ts.submit_trial_job(sleeper(base, 3, "stop"))
            assert (await ts.get_trial_job(ok.id)).status == TrialJobStatus.WAITING

            d = await wait_status(ts, ok.id, "SUCCEEDED", timeout=T)
            assert d.message == "" and d.end_time and d.start_time
            d = await wait_status(ts, bad.id, "FAILED", timeout=T)
            assert "exit code 3" in d.message and "to stderr" in d.message, d.message
            assert not d.is_early_stopped

            await wait_status(ts, cancel.id, "RUNNING", timeout=T)
            await wait_status(ts, stop.id, "RUNNING", timeout=T)
            await ts.cancel_trial_job(cancel.id)
            await ts.cancel_trial_job(stop.id, is_early_stopped=True)
            d = await wait_status(ts, cancel.id, "USER_CANCELED", timeout=T)
            assert not d.is_early_stopped
            d = await wait_status(ts, stop.id, "EARLY_STOPPED", timeout=T)
            assert d.is_early_stopped

            # every metric of the finished trial, each once (PERIODICAL 0, 1, 2 then FINAL 7)
            await asyncio.sleep(1.0)  # room for a duplicate to show up; not a timing assertion
            got = [json.loads(m) for m in metrics[ok.id]]
            assert [(g["type"], g["sequence"], json.loads(g["value"])) for g in got] == [
                ("PERIODICAL", 0, 0), ("PERIODICAL", 1, 1), ("PERIODICAL", 2, 2), ("FINAL", 0, 7)], got
            assert all(g["trial_job_id"] == ok.id for g in got)
            assert [json.loads(m)["type"] for m in metrics[bad.id]] == ["PERIODICAL"]  # then exit 3
            stored = ts.trials.store.metrics()
            assert sorted(m["data"] for m in stored if m["trial_id"] == ok.id) == sorted(metrics[ok.id])

    run(main())


def test_max_trial_duration_early_stops(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(), maxTrialDuration="3s")

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(sleeper(base, 0, "never"))
            d = await wait_status(ts, t.id, "EARLY_STOPPED", timeout=T)
            assert d.is_early_stopped and "maximum trial duration" in d.message, d.message

    run(main())


# ----------------------------------------------------------------------------- 2. reuse and non-reuse

def test_reuse_pool_runs_ten_trials_on_two_environments(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(reuseMode=True), trialConcurrency=2)
    pool_sizes: list[int] = []

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            def sample(_d: Any) -> None:  # after every trial change: the live pool
                pool_sizes.append(len(ts.environments()))

            ts.add_trial_job_status_listener(sample)
            jobs = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(10)]
            for j in jobs:
                await wait_status(ts, j.id, "SUCCEEDED", timeout=T)
            envs = {(await ts.get_trial_job(j.id)).environment_id for j in jobs}
            assert None not in envs and len(envs) <= 2, envs
            pods = scheduled_pods(kube, ts.experiment_id)
            assert 1 <= len(pods) <= 2, pods
            assert max(pool_sizes) <= 2, pool_sizes
            # idle environments are released once nothing waits (after capacity.IDLE_RELEASE_S):
            # no pod of ours is left
            await until(lambda: not ts.environments(), T, "idle environments to be released")
            await until(lambda: not kube.core().list_namespaced_pod(namespace_of(kube), label_selector=ours(ts.experiment_id)).items,
                        T, "the idle pods to be deleted")

    run(main())


def test_non_reuse_one_pod_per_trial_whose_status_follows_the_trial(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(reuseMode=False), trialConcurrency=2)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            good = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(2)]
            bad = await ts.submit_trial_job(form(2, action="fail", steps=1))
            details = [await wait_status(ts, j.id, "SUCCEEDED", timeout=T) for j in good]
            details.append(await wait_status(ts, bad.id, "FAILED", timeout=T))
            pods = [d.agents[0] for d in details]
            assert len(set(pods)) == 3 and len({d.environment_id for d in details}) == 3
            assert scheduled_pods(kube, ts.experiment_id) == set(pods)
            for d, pod in zip(details, pods):
                assert d.environment_id and pod.endswith(d.environment_id.replace("-", ""))
            # each pod is deleted after its trial ...
            await until(lambda: not kube.core().list_namespaced_pod(namespace_of(kube), label_selector=ours(ts.experiment_id)).items,
                        T, "every trial's pod to be deleted")
            # ... and ended as its trial did: the agent ran --single-trial and exited with its outcome
            for pod in pods[:2]:
                assert "Succeeded" in phases(kube, pod), kube.history("pods", namespace_of(kube), pod)
                assert [t["exitCode"] for t in terminated(kube, pod)] == [0]
            assert "Failed" in phases(kube, pods[2]) and "Succeeded" not in phases(kube, pods[2])
            assert [t["exitCode"] for t in terminated(kube, pods[2])] == [3]
            assert (await ts.get_trial_job(bad.id)).status == TrialJobStatus.FAILED  # the pod's end changes nothing

    run(main())


# ----------------------------------------------------------------------------- 3. WAITING reasons, impossible requests

def test_waiting_for_a_gpu_then_running_when_a_node_gets_more(kube_factory, base: Path) -> None:
    kube = kube_factory(nodes=["node-1=8,16384,1"])
    cfg = config(kube, base, pods_service(reuseMode=False, gpuNumber=1), trialConcurrency=2)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            holder = await ts.submit_trial_job(sleeper(base, 0, "holder"))
            await wait_status(ts, holder.id, "RUNNING", timeout=T)
            second = await ts.submit_trial_job(form(1, x=1, steps=1))
            msg = await message_with(ts, second.id, "FailedScheduling", "Insufficient nvidia.com/gpu")
            assert "0/1 nodes are available" in msg
            assert (await ts.get_trial_job(second.id)).status == TrialJobStatus.WAITING
            kube.set_node("node-1", gpus=2)
            await wait_status(ts, second.id, "SUCCEEDED", timeout=T)
            release(base, "holder")
            await wait_status(ts, holder.id, "SUCCEEDED", timeout=T)

    run(main())


def test_unknown_image_shows_the_pull_error(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(dockerImage="nni-test/does-not-exist:1"))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))

            async def pull_error() -> str | None:
                m = (await ts.get_trial_job(t.id)).message
                return m if ("ImagePullBackOff" in m or "ErrImagePull" in m) else None

            msg = await until(pull_error, T, "the image pull error in the trial's message")
            assert "nni-test/does-not-exist:1" in msg or "does-not-exist" in msg, msg
            assert (await ts.get_trial_job(t.id)).status == TrialJobStatus.WAITING
            await ts.cancel_trial_job(t.id)
            await wait_status(ts, t.id, "USER_CANCELED", timeout=T)

    run(main())


@pytest.mark.parametrize("reuse", [True, False])
def test_request_bigger_than_every_node_waits_saying_so_until_the_start_deadline(kube, base: Path, reuse: bool) -> None:
    """An autoscaler may add a node that holds it (tests/kube/test_autoscaled.py): no refusal at
    submit; the pod waits with the scheduler's reason and the largest present node, and the
    environment fails at environmentStartTimeout, saying all of it in one line."""
    cfg = config(kube, base, pods_service(reuseMode=reuse, cpuNumber=64, memorySize="100gb",
                                          environmentStartTimeout="6s"))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "FailedScheduling" in d.message and "Insufficient cpu" in d.message, d.message
            assert "cpu 64" in d.message and "node-1" in d.message and "cpu 8" in d.message, d.message
            assert "environmentStartTimeout, 6 s" in d.message, d.message
            assert "\n" not in d.message
            assert not scheduled_pods(kube, ts.experiment_id)  # never placed

    run(main())


def test_nodes_forbidden_does_not_break_anything(kube_factory, base: Path) -> None:
    rules = "*/pods,*/pods/log,*/secrets,*/configmaps,*/events"
    kube = kube_factory(tokens=[f"podsonly=system:serviceaccount:default:nni:{rules}"])
    cfg = config(kube, base, pods_service(kubeConfig=str(kubeconfig_with_token(kube, base / "kc", "podsonly"))))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            with pytest.raises(Exception) as e:  # the token really may not list nodes
                kube.core("podsonly").list_node()
            assert getattr(e.value, "status", None) == 403
            t = await ts.submit_trial_job(form(0, steps=1))
            await wait_status(ts, t.id, "SUCCEEDED", timeout=T)

    run(main())


# ----------------------------------------------------------------------------- 4. an image without the agent's dependencies

def test_image_without_the_agents_dependencies_fails_clearly_without_endless_retry(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(dockerImage=SLIM_IMAGE))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "grpcio" in d.message and "psutil" in d.message, d.message
            assert "pip install" in d.message, d.message
            # the boot step's one line, from the pod's termination message
            assert "nni-agent: Python " in d.message and f"of the image {SLIM_IMAGE} cannot run the agent: " \
                   "grpcio is missing; protobuf is missing; psutil is missing; fix: " in d.message, d.message
            tried = scheduled_pods(kube, ts.experiment_id)
            assert len(tried) == 2, tried  # the core gives up after 2 environments fail to start
            for pod in tried:
                assert any("grpcio" in (x.get("message") or "") for x in terminated(kube, pod)), terminated(kube, pod)
            await asyncio.sleep(2.0)  # nothing waits: no further environment is tried
            assert scheduled_pods(kube, ts.experiment_id) == tried
            assert not ts.environments()

    run(main())


# ----------------------------------------------------------------------------- 5. a pod dies under its trial

def test_pod_killed_mid_trial_ends_it_with_the_reason_and_the_next_trial_gets_a_fresh_pod(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(reuseMode=True))

    async def running(ts: Any, seq: int, name: str) -> tuple[str, str, str]:
        t = await ts.submit_trial_job(sleeper(base, seq, name))
        d = await wait_status(ts, t.id, "RUNNING", timeout=T)
        assert d.environment_id is not None
        return t.id, d.agents[0], d.environment_id

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            envs = []
            trial, pod, env = await running(ts, 0, "oom")
            envs.append(env)
            await asyncio.to_thread(kube.oom_kill, namespace_of(kube), pod)  # off the loop: the manager keeps serving
            d = await wait_status(ts, trial, "FAILED", timeout=T)
            assert "OOMKilled" in d.message and pod in d.message, d.message

            trial, pod, env = await running(ts, 1, "evict")
            envs.append(env)
            await asyncio.to_thread(kube.evict, namespace_of(kube), pod, "The node was low on resource: memory.")
            await wait_status(ts, trial, "SYS_CANCELED", timeout=T)
            # the kubelet stops the containers before it records why: the agent's own report
            # (SIGTERM) may come first, the platform's words then join the message
            msg = await message_with(ts, trial, "Evicted", pod)
            assert "low on resource" in msg, msg
            assert (await ts.get_trial_job(trial)).status == TrialJobStatus.SYS_CANCELED

            # a pod deleted under its trial (`kubectl delete pod`): the job-platform contract suite's
            # (tests/platforms/test_job_contract.py, `-k kube-pods`)
            last = await ts.submit_trial_job(form(2, steps=1))
            d = await wait_status(ts, last.id, "SUCCEEDED", timeout=T)
            envs.append(d.environment_id)
            assert len(set(envs)) == 3, envs  # each trial after a dead pod got a fresh environment

    run(main())


# ----------------------------------------------------------------------------- 6. API errors at start

def _start_error(cfg: Any) -> str:
    async def main() -> str:
        ts = create_training_service(cfg)
        with pytest.raises(KubeError) as e:
            await ts.start()
        return str(e.value)

    return run(main())


def test_wrong_token_is_one_clear_line_with_401(kube, base: Path) -> None:
    kc = kubeconfig_with_token(kube, base / "kc", "not-a-token")
    msg = _start_error(config(kube, base, pods_service(kubeConfig=str(kc))))
    assert "401" in msg and "\n" not in msg, msg
    assert "not-a-token" not in msg
    assert not objects_of(kube, "")["configmaps"]


def test_rbac_forbidding_list_pods_names_verb_and_resource(kube_factory, base: Path) -> None:
    rules = "get/pods,create/pods,delete/pods,watch/pods,*/secrets,*/configmaps"
    kube = kube_factory(tokens=[f"nolist=system:serviceaccount:default:nni:{rules}"])
    kc = kubeconfig_with_token(kube, base / "kc", "nolist")
    msg = _start_error(config(kube, base, pods_service(kubeConfig=str(kc))))
    # checked before anything is created (SelfSubjectAccessReview): one line per denied verb
    denied = [line.strip() for line in msg.splitlines() if line.startswith("  ")]
    assert denied == ["cannot list pods in namespace default", "cannot deletecollection pods in namespace default",
                      "cannot list events in namespace default"], msg
    assert "docs/platforms/kubernetes.md" in msg
    assert not objects_of(kube, "")["configmaps"]


def test_missing_namespace_is_a_clear_error(kube, base: Path) -> None:
    msg = _start_error(config(kube, base, pods_service(namespace="no-such-ns")))
    assert "no-such-ns" in msg and "not found" in msg and "\n" not in msg, msg


# ----------------------------------------------------------------------------- 7. secrets

def test_agent_token_never_in_pod_spec_argv_or_logs(kube, base: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = config(kube, base, pods_service(), trialConcurrency=2)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(sleeper(base, i, f"s{i}")) for i in range(2)]
            details = [await wait_status(ts, t.id, "RUNNING", timeout=T) for t in trials]
            pods = [d.agents[0] for d in details]
            tokens = [ts.trials.store.agent_by_name(p)["token"] for p in pods]
            assert all(len(tok) >= 32 for tok in tokens)

            dumped = json.dumps(pod_json(kube))
            assert all(p in dumped for p in pods)
            argv = []
            for pod in pods:
                pids = kube.pod_processes(namespace_of(kube), pod)
                assert pids, pod
                for pid in pids:
                    try:
                        argv.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
                        argv.append(Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace"))
                    except OSError:
                        pass
            assert any("nni_agent" in a for a in argv), argv
            logs = "".join(kube.core().read_namespaced_pod_log(p, namespace_of(kube)) for p in pods)  # the agents' own logs
            assert "connected to" in logs, logs[-2000:]
            for tok in tokens:
                assert tok not in dumped
                assert not any(tok in a for a in argv)
                assert tok not in logs
            for i in range(2):
                release(base, f"s{i}")
            for t in trials:
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            return tokens

    tokens = run(main())
    assert caplog.records  # DEBUG of everything in the manager's process: the client's requests included
    for tok in tokens:
        assert tok not in caplog.text


# ----------------------------------------------------------------------------- 8. clean_up

def test_clean_up_leaves_no_object_and_no_process(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(reuseMode=False), trialConcurrency=2)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            running = [await ts.submit_trial_job(sleeper(base, i, f"c{i}")) for i in range(2)]
            queued = await ts.submit_trial_job(form(2))
            for t in running:
                await wait_status(ts, t.id, "RUNNING", timeout=T)
            left = objects_of(kube, ts.experiment_id)
            assert len(left["pods"]) == 2 and len(left["secrets"]) == 2 and left["configmaps"], left
            assert all(kube.pod_processes(namespace_of(kube), p) for p in left["pods"])
            exp = ts.experiment_id
        for t in [*running, queued]:
            assert (await ts.get_trial_job(t.id)).status.is_terminal
        return exp

    exp = run(main())
    assert objects_of(kube, exp) == {"pods": [], "secrets": [], "configmaps": []}
    assert kube.leftover_processes() == []


# ----------------------------------------------------------------------------- 9. dry run

def test_dry_run_objects_are_valid_for_the_api_server_and_hold_no_token(kube, base: Path) -> None:
    cfg = config(kube, base, pods_service(gpuNumber=0, podSpec={"nodeSelector": {"kubernetes.io/os": "linux"}}))
    dry = backend_class("kubernetes")(cfg).render()
    kinds = [o["kind"] for o in dry.requests]
    assert kinds == ["ConfigMap", "Secret", "Pod"], kinds  # the agent ConfigMap, once per experiment
    agent_map, secret, pod = dry.requests
    assert {"name": "nni-agent", "configMap": {"name": agent_map["metadata"]["name"]}} in pod["spec"]["volumes"]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "Secret" in dry.text and "Pod" in dry.text
    core = kube.core()
    core.create_namespaced_config_map(namespace_of(kube), agent_map, dry_run="All", field_validation="Strict")
    created_secret = core.create_namespaced_secret(namespace_of(kube), secret, dry_run="All", field_validation="Strict")
    created_pod = core.create_namespaced_pod(namespace_of(kube), pod, dry_run="All", field_validation="Strict")
    assert created_secret.metadata.name == secret["metadata"]["name"]
    assert created_pod.metadata.name == pod["metadata"]["name"]
    assert not core.list_namespaced_pod(namespace_of(kube)).items and not core.list_namespaced_secret(namespace_of(kube)).items  # dry: nothing stored
    # no real token: the Secret holds placeholders only, the pod reads its token from the mounted file
    values = {**secret.get("stringData", {}), **{k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}}
    assert pod["metadata"]["name"] in values and all(v.startswith("<") for v in values.values()), values
    leaves: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                leaves.append(str(k))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        else:
            leaves.append(str(x))

    walk(dry.requests)
    assert not [w for w in leaves if re.search(r"[A-Za-z0-9_-]{40,}", w)]  # nothing shaped like a token
    container = pod["spec"]["containers"][0]
    assert "--token-file" in container["command"]
    assert not [e for e in container.get("env", []) if "TOKEN" in e["name"].upper()]
    assert {"name": "nni-secret", "secret": {"secretName": secret["metadata"]["name"], "defaultMode": 0o444}} \
        in pod["spec"]["volumes"]


def test_node_lost_cancels_the_trial_and_a_new_node_runs_the_next(kube_factory, base: Path) -> None:
    kube = kube_factory()  # loses the node: a cluster of its own
    cfg = config(kube, base, pods_service(reuseMode=True))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(sleeper(base, 0, "lost"))
            d = await wait_status(ts, t.id, "RUNNING", timeout=T)
            pod = d.agents[0]
            await asyncio.to_thread(kube.node_lost, "node-1")
            d = await wait_status(ts, t.id, "SYS_CANCELED", timeout=T)
            await message_with(ts, t.id, pod, "node no longer exists")
            nxt = await ts.submit_trial_job(form(1, steps=1))
            await message_with(ts, nxt.id, "no nodes available")
            await asyncio.to_thread(kube.set_node, "node-2", 8, 16384, 0)
            d = await wait_status(ts, nxt.id, "SUCCEEDED", timeout=T)
            assert d.environment_id != (await ts.get_trial_job(t.id)).environment_id

    run(main())
