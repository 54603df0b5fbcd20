"""Benchmark the Kubernetes platform on the emulator against the local backend, in one run.

Needs root (the emulator runs each pod in its own mount namespace). Prints:
  * per-trial overhead in reuse mode (`platform: kubernetes`, 2 environments kept warm):
    submit -> SUCCEEDED of a trivial trial, sequential, vs the local backend (target <= 1.5x);
    the environments are started before timing (a pod start is paid once per environment);
  * non-reuse: submit -> RUNNING, split into the emulator's simulated pod start (pod created ->
    container process started, set by --pod-start-delay) and everything else: our Secret and
    Pod creation, the agent's boot from the wheel ConfigMap, its TLS dial, and the start of
    the trial. Real clusters add their own scheduling and image pull to the first part.

    python scripts/bench_kube.py [--trials 20] [--pod-start-delay 0.3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nni_manager.config import load_config  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from tests.kube.conftest import start_emulator  # noqa: E402
from tests.kube.emulator.kubelet import STARTED_AT  # noqa: E402
from tests.manager.helpers import TRIAL, form, until, wait_status  # noqa: E402


def config(work: Path, code: Path, ts: dict[str, Any], concurrency: int) -> Any:
    return load_config({"trialCommand": "python trial.py", "trialCodeDirectory": str(code),
                        "trialConcurrency": concurrency, "trialGracePeriod": 2,
                        "experimentWorkingDirectory": str(work), "trainingService": ts})


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
            await until(lambda: not core.list_namespaced_pod("default", label_selector=f"trialId={job.id}").items,
                        60, "the trial's pod to be deleted")
    return out


def _ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:.0f} ms, p90 {sorted(times)[max(0, int(len(times) * .9) - 1)] * 1000:.0f} ms"


async def main(n: int, delay: float) -> None:
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `python` = this one
    if os.geteuid() != 0:
        raise SystemExit("bench_kube: needs root (the emulator's pods use mount namespaces)")
    tmp = Path(tempfile.mkdtemp(prefix="nbk", dir="/tmp"))
    kube = start_emulator(tmp, pod_start_delay=delay)
    try:
        code = tmp / "code"
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        local = await sequential(config(tmp / "e1", code, {"platform": "local"}, 2), n)
        pods = {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "dockerImage": "nni-test/python:3.11",
                "cpuNumber": 1, "memorySize": "256mb"}
        reuse = await sequential(config(tmp / "e2", code, {**pods, "reuseMode": True}, 2), n, warm=2)
        ratio = statistics.median(reuse) / statistics.median(local)
        print(f"per-trial submit -> SUCCEEDED, {n} trivial trials, sequential:")
        print(f"  local backend              {_ms(local)}")
        print(f"  kubernetes, reuse (2 envs) {_ms(reuse)}   ratio {ratio:.2f}x  "
              f"[target <= 1.5x: {'OK' if ratio <= 1.5 else 'MISSED'}]")
        pairs = await to_running(config(tmp / "e3", code, {**pods, "reuseMode": False}, 1), kube, max(3, n // 4))
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
    a = parser.parse_args()
    asyncio.run(main(a.trials, a.pod_start_delay))
