"""A pod without the experiment's secret floods the hub relay's Service (400 idle connections and
raw gRPC clients that send HTTP/2 without the relay token) while a new agent, in a pod of its own,
dials the same Service for a trial. The relay drops everything that does not prove the experiment's
relay token, so the flood never takes one of the manager's port-forward streams and never reaches the
hub: the new agent's trial starts and succeeds, and the hub refuses nothing. Counted, not timed
(the times are in scripts/bench_preauth_flood.py).

On the Kubernetes emulator with `pod_network="bridged"`: every pod in a network namespace of its
own, the flood's as another tenant's pod would be; the manager's loopback out of their reach.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from nni_manager.backends.kubernetes import tunnel
from nni_manager.service import create_training_service
from tests.support.kube.fixtures import kube_factory  # noqa: F401 - the Kubernetes emulator fixture
from tests.support.kube.harness import config, pods_service
from tests.support.kube.pods import pod_body
from tests.support.manager.helpers import form, until, wait_status
from tests.support.bounded import run_bounded

REPO = Path(__file__).resolve().parents[2]
NS = "default"


def _flood_counts(kube: Any) -> Counter[str] | None:
    """How the flood pod's streams ended so far (its last JSON line); None before it floods."""
    try:
        log = kube.core().read_namespaced_pod_log("flood", NS)
    except ApiException as e:  # 400 while its container is being created
        if e.status != 400:
            raise
        return None
    lines = log.splitlines()
    if "flooding" not in lines:
        return None
    last = [line for line in lines if line.startswith("{")]
    return Counter(json.loads(last[-1])) if last else Counter()


def _flood_state(kube: Any) -> str:
    """The flood pod's phase, container state and last lines, for a failure's message."""
    pod = kube.core().read_namespaced_pod("flood", NS)
    try:
        tail = kube.core().read_namespaced_pod_log("flood", NS, tail_lines=5)
    except ApiException as e:
        tail = f"(no log: {e.status})"
    return f"phase {pod.status.phase}, containers {pod.status.container_statuses}, log tail {tail!r}"


def test_a_flood_from_another_pod_does_not_stop_a_new_agent_s_trial(kube_factory: Any,  # noqa: F811
                                                                  short_dir: Path) -> None:
    kube = kube_factory(pod_network="bridged")
    cfg = config(kube, short_dir, pods_service(reuseMode=False), trialConcurrency=1, nniManagerIp=None)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            first = await ts.submit_trial_job(form(0, x=1, steps=1))
            done = await wait_status(ts, first.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)
            assert done.status.value == "SUCCEEDED", done.message
            # the relay's program: immutable, named for its content (the pod checks its sha256 besides)
            program = tunnel.program_config_map_name(ts.experiment_id)
            assert kube.core().read_namespaced_config_map(program, NS).immutable is True
            with pytest.raises(ApiException) as refused:
                kube.core().patch_namespaced_config_map(program, NS, {"data": {tunnel.RELAY_FILE: "print('planted')"}})
            assert refused.value.status == 422, refused.value
            service = kube.core().read_namespaced_service(tunnel.relay_name(ts.experiment_id), NS)
            target = tunnel.advertise(service.spec.cluster_ip)
            flood = f"cd {REPO} && exec {sys.executable} -m tests.support.security.flood {target} - 400 25 16"
            kube.core().create_namespaced_pod(NS, pod_body("flood", flood))
            try:
                await until(lambda: (_flood_counts(kube) or Counter()).total() > 0, 120,
                            "the flood pod's streams dropped by the relay")
            except AssertionError:
                raise AssertionError(f"no stream of the flood pod was dropped in 120 s: {_flood_state(kube)}") from None
            paired = ts._backend._tunnel.paired
            job = await ts.submit_trial_job(form(1, x=2, steps=1))  # a new agent pod dials in under the flood
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)
            assert done.status.value == "SUCCEEDED", done.message
            counts = _flood_counts(kube)
            assert counts is not None and counts.total() > 0, counts  # it flooded all along
            assert counts["RESOURCE_EXHAUSTED"] == 0 and counts["UNAUTHENTICATED"] == 0, counts  # never met the hub
            # the manager's streams carried the new agent's connections only: a few, not the flood's hundreds
            assert ts._backend._tunnel.paired - paired <= 4, (ts._backend._tunnel.paired - paired, counts)

    run_bounded(main(), 400)


def test_the_relay_pod_runs_only_the_program_its_command_names(tmp_path: Path) -> None:
    """The relay pod's command as the manager writes it, run as a real process: a program someone put
    in the ConfigMap's place (deleted and made again under the name) is refused in one line and never
    runs; the shipped one runs."""
    pod = tunnel.relay_objects("ExpRelay", NS, "python:3.11-slim", "0" * 64)[1]
    command = pod["spec"]["containers"][0]["command"]
    path = command.index(f"/nni-relay/{tunnel.RELAY_FILE}")
    marker = tmp_path / "ran"
    planted = tmp_path / tunnel.RELAY_FILE
    planted.write_text(f"open({str(marker)!r}, 'w').write('planted code ran')\n")
    out = subprocess.run([sys.executable, *command[1:path], str(planted), *command[path + 1:]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and not marker.exists(), out
    assert out.stderr.strip().count("\n") == 0 and "not the program the manager shipped" in out.stderr, out.stderr
    shipped = tmp_path / "shipped.py"
    shipped.write_text(tunnel.relay_program().replace("\nif __name__ == \"__main__\":",
                                                      f"\nopen({str(marker)!r}, 'w').write('ran')\nif False:"))
    out = subprocess.run([sys.executable, *command[1:path], str(shipped), *command[path + 1:]],
                         capture_output=True, text=True, timeout=60)
    assert not marker.exists() and "not the program the manager shipped" in out.stderr  # edited: refused too
    real = subprocess.Popen([sys.executable, *command[1:path], str(Path(tunnel.__file__).with_name(tunnel.RELAY_FILE)),
                             "0", "0", "0" * 64, "127.0.0.1"], stderr=subprocess.PIPE, text=True)
    try:
        assert real.stderr is not None
        assert real.stderr.readline().startswith("relay: agents on port"), "the shipped program did not run"
    finally:
        real.kill()
        real.wait(10)


def test_a_relay_program_planted_under_its_configmap_s_name_never_runs(kube_factory: Any,  # noqa: F811
                                                                       short_dir: Path) -> None:
    """Someone who may edit ConfigMaps deletes the relay's program and makes a ConfigMap of their own
    under its name; the relay pod goes (evicted, its node drained). The manager makes the pod again,
    and first the program: the planted one is replaced, never run, and trials go on through the relay."""
    kube = kube_factory(pod_network="bridged")
    cfg = config(kube, short_dir, pods_service(reuseMode=False), trialConcurrency=1, nniManagerIp=None)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            first = await ts.submit_trial_job(form(0, x=1, steps=1))
            done = await wait_status(ts, first.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)
            assert done.status.value == "SUCCEEDED", done.message
            core, name = kube.core(), tunnel.program_config_map_name(ts.experiment_id)
            core.delete_namespaced_config_map(name, NS)
            core.create_namespaced_config_map(NS, {"metadata": {"name": name}, "data": {
                tunnel.RELAY_FILE: "import sys, time\nsys.stderr.write('planted code ran\\n')\ntime.sleep(3600)\n"}})
            relay = tunnel.relay_name(ts.experiment_id)
            uid = core.read_namespaced_pod(relay, NS).metadata.uid
            core.delete_namespaced_pod(relay, NS, grace_period_seconds=0)

            def remade() -> bool:
                try:
                    pod = core.read_namespaced_pod(relay, NS)
                except ApiException:
                    return False
                return pod.metadata.uid != uid and pod.status.phase == "Running"

            await until(remade, 120, "the relay pod made again")
            job = await ts.submit_trial_job(form(1, x=2, steps=1))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)
            assert done.status.value == "SUCCEEDED", done.message
            assert "planted code ran" not in core.read_namespaced_pod_log(relay, NS)
            program = core.read_namespaced_config_map(name, NS)
            assert program.immutable is True and program.data == {tunnel.RELAY_FILE: tunnel.relay_program()}

    run_bounded(main(), 400)
