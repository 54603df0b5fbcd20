"""Benchmark the Kubernetes platform on the emulator against the local backend, in one run.

Needs root (the emulator runs each pod in its own mount namespace). Prints:
  * per-trial overhead in reuse mode (`platform: kubernetes`, 2 environments kept warm):
    submit -> SUCCEEDED of a trivial trial, sequential, vs the local backend (target <= 1.5x);
    the environments are started before timing (a pod start is paid once per environment);
  * non-reuse: submit -> RUNNING, split into the emulator's simulated pod start (pod created ->
    container process started, set by --pod-start-delay) and everything else: our Secret and
    Pod creation, the agent's boot from the wheel ConfigMap, its TLS dial, and the start of
    the trial. Real clusters add their own scheduling and image pull to the first part.

  * the hub tunnel through the API server (hubTunnel: the manager reached only through the relay
    pod and `pods/portforward`) vs direct (nniManagerIp: the user's host on the pod bridge, a NAT
    port-forward to the hub on loopback), both on the emulator's bridged pod network (each pod in
    its own network namespace), side by side: per-trial overhead in reuse mode (target <= 1.2x),
    metrics/s from one trial reporting as fast as it can, and the manager's CPU per 1,000
    metrics (the tunnel's own cost is the difference).

    python scripts/bench_kube.py [--trials 20] [--pod-start-delay 0.3] [--metrics 3000] [--only-tunnel]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nni_manager.loader import load_config  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from tests.support.kube.fixtures import start_emulator  # noqa: E402
from tests.support.kube.emulator.kubelet import STARTED_AT  # noqa: E402
from tests.support.manager.helpers import TRIAL, form, until, wait_status  # noqa: E402


def config(work: Path, code: Path, ts: dict[str, Any], concurrency: int, **top: Any) -> Any:
    return load_config({"trialCommand": "python trial.py", "trialCodeDirectory": str(code),
                        "trialConcurrency": concurrency, "trialGracePeriod": 2,
                        "experimentWorkingDirectory": str(work), "trainingService": ts, **top})


async def sequential(cfg: Any, n: int, warm: int = 0) -> list[float]:
    """submit -> SUCCEEDED per trial, after `warm` untimed trials (environments started)."""
    times = []
    async with create_training_service(cfg) as ts:
        for i in range(warm):
            await wait_status(ts, (await ts.submit_trial_job(form(i, steps=0))).id, "SUCCEEDED", timeout=120)
        for i in range(n):
            t0 = time.perf_counter()
            job = await ts.submit_trial_job(form(i, steps=0))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=60)
            times.append(time.perf_counter() - t0)
    return times


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def to_running(cfg: Any, kube: Any, n: int) -> list[tuple[float, float]]:
    """Non-reuse: (submit -> RUNNING, submit -> container started) per trial, sequential."""
    out = []
    core = kube.core()
    async with create_training_service(cfg) as ts:
        for i in range(n):
            t0 = time.time()
            job = await ts.submit_trial_job(form(i, steps=0))
            await wait_status(ts, job.id, "RUNNING", "SUCCEEDED", timeout=120)
            running = time.time()
            detail = await ts.get_trial_job(job.id)
            name = next(a["name"] for a in ts.agents() if a["environment"] == detail.environment_id)
            pod = core.read_namespaced_pod(name, "default")
            started = _ts(pod.metadata.annotations[STARTED_AT])  # the container process started
            out.append((running - t0, started - t0))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=60)
            await until(lambda jid=job.id: not core.list_namespaced_pod("default", label_selector=f"trialId={jid}").items,
                        60, "the trial's pod to be deleted")
    return out


async def metric_rate(cfg: Any, m: int) -> tuple[float, float]:
    """One trial reporting `m` intermediate metrics back to back, its environment started first:
    (metrics/s from the submission to the last metric heard, manager CPU seconds per 1,000 metrics)."""
    seen: list[float] = []
    async with create_training_service(cfg) as ts:
        await wait_status(ts, (await ts.submit_trial_job(form(0, steps=0))).id, "SUCCEEDED", timeout=120)
        ts.add_trial_job_metric_listener(lambda _m: seen.append(time.perf_counter()))
        cpu0, t0 = time.process_time(), time.perf_counter()
        job = await ts.submit_trial_job(form(1, steps=m))
        await wait_status(ts, job.id, "SUCCEEDED", timeout=300)
        await until(lambda: len(seen) >= m + 1, 60, "every metric")
        cpu = time.process_time() - cpu0
    return len(seen) / (seen[-1] - t0), cpu / len(seen) * 1000


async def tunnel_vs_direct(tmp: Path, code: Path, n: int, m: int, delay: float) -> None:
    kube = start_emulator(tmp / "net", pod_start_delay=delay, pod_network="bridged", host_netns=True)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        host_ip = kube.forward_from_host(port)  # netns only: the host's address on the pod bridge
        def pods(kube: Any, **extra: Any) -> dict[str, Any]:
            return {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "dockerImage": "nni-test/python:3.11",
                    "cpuNumber": 1, "memorySize": "256mb", "reuseMode": True, **extra}

        def cfg(name: str, direct: bool, concurrency: int) -> Any:
            if not direct:
                return config(tmp / name, code, pods(kube), concurrency)
            return config(tmp / name, code, pods(kube, hubPort=port, hubBindAddress="127.0.0.1", hubTunnel=False),
                          concurrency, nniManagerIp=host_ip)

        tunnelled = await sequential(cfg("t1", False, 2), n, warm=2)
        direct = await sequential(cfg("d1", True, 2), n, warm=2)
        ratio = statistics.median(tunnelled) / statistics.median(direct)
        print(f"hub tunnel vs direct, per-trial submit -> SUCCEEDED, reuse (2 envs), {n} trivial trials:")
        print(f"  direct (nniManagerIp)      {_ms(direct)}")
        print(f"  tunnel (API server)        {_ms(tunnelled)}   ratio {ratio:.2f}x  "
              f"[target <= 1.2x: {'OK' if ratio <= 1.2 else 'MISSED'}]")
        d_rate, d_cpu = await metric_rate(cfg("d2", True, 1), m)
        t_rate, t_cpu = await metric_rate(cfg("t2", False, 1), m)
        print(f"metrics from one trial, {m} back to back:")
        print(f"  direct  {d_rate:8.0f} metrics/s   manager CPU {d_cpu * 1000:6.1f} ms per 1,000 metrics")
        print(f"  tunnel  {t_rate:8.0f} metrics/s   manager CPU {t_cpu * 1000:6.1f} ms per 1,000 metrics   "
              f"(rate {t_rate / d_rate:.2f}x of direct; the tunnel's own CPU: {(t_cpu - d_cpu) * 1000:+.1f} ms "
              "per 1,000 metrics)")
    finally:
        kube.stop()


def _ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:.0f} ms, p90 {sorted(times)[max(0, int(len(times) * .9) - 1)] * 1000:.0f} ms"


async def main(n: int, delay: float, m: int, only_tunnel: bool) -> None:
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `python` = this one
    if os.geteuid() != 0:
        raise SystemExit("bench_kube: needs root (the emulator's pods use mount namespaces)")
    tmp = Path(tempfile.mkdtemp(prefix="nbk", dir="/tmp"))
    code = tmp / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    try:
        await tunnel_vs_direct(tmp, code, n, m, delay)
    finally:
        if only_tunnel:
            shutil.rmtree(tmp, ignore_errors=True)
    if only_tunnel:
        return
    kube = start_emulator(tmp, pod_start_delay=delay)
    try:
        local = await sequential(config(tmp / "e1", code, {"platform": "local"}, 2), n)
        pods = {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "dockerImage": "nni-test/python:3.11",
                "cpuNumber": 1, "memorySize": "256mb", "hubTunnel": False}
        # pods share the host network here: the hub is dialled directly at 127.0.0.1
        reuse_cfg = config(tmp / "e2", code, {**pods, "reuseMode": True}, 2)
        reuse_cfg.training_service.nni_manager_ip = "127.0.0.1"
        reuse = await sequential(reuse_cfg, n, warm=2)
        ratio = statistics.median(reuse) / statistics.median(local)
        print(f"per-trial submit -> SUCCEEDED, {n} trivial trials, sequential:")
        print(f"  local backend              {_ms(local)}")
        print(f"  kubernetes, reuse (2 envs) {_ms(reuse)}   ratio {ratio:.2f}x  "
              f"[target <= 1.5x: {'OK' if ratio <= 1.5 else 'MISSED'}]")
        once_cfg = config(tmp / "e3", code, {**pods, "reuseMode": False}, 1)
        once_cfg.training_service.nni_manager_ip = "127.0.0.1"
        pairs = await to_running(once_cfg, kube, max(3, n // 4))
        total = [p[0] for p in pairs]
        print(f"non-reuse submit -> RUNNING over {len(pairs)} trials: {_ms(total)}")
        print(f"  submit -> container started (our Secret + Pod, the emulator's simulated pod start of "
              f"{delay:g} s): {_ms([p[1] for p in pairs])}")
        print(f"  container started -> RUNNING (agent boot from the wheel, TLS dial, trial start): "
              f"{_ms([p[0] - p[1] for p in pairs])}")
        print(f"  excluding the simulated pod start: {_ms([p[0] - delay for p in pairs])}")
    finally:
        kube.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--pod-start-delay", type=float, default=0.3)
    parser.add_argument("--metrics", type=int, default=3000)
    parser.add_argument("--only-tunnel", action="store_true", help="only the tunnel-vs-direct part")
    a = parser.parse_args()
    asyncio.run(main(a.trials, a.pod_start_delay, a.metrics, a.only_tunnel))
