"""Benchmark the Slurm platform on a real 2-node Slurm cluster on loopback, side by side in one run.

Needs root and Slurm (apt-get install -y slurmctld slurmd slurm-client munge; the cluster is
started the way tests/support/slurm/fixtures.py does). Prints:
  * per-trial overhead in reuse mode (2 allocations kept): submit -> SUCCEEDED of a trivial
    trial, sequential, vs the local backend (target: within 1.5x);
  * non-reuse: submit -> trial RUNNING (one job per trial: sbatch, the scheduler's cycle, srun,
    the agent's start and TLS dial) vs a bare `sbatch --wait` of a job that runs the same trial
    command, on the same cluster;
  * with --bare WHEELHOUSE: `pythonPath` a bare venv of /usr/bin/python3 (none of the agent's
    dependencies): start + submit -> trial RUNNING with the dependencies shipped through the
    shared file system (first experiment), reused (second), next to a Python that has them;
    bytes shipped. `--bare` alone skips the other measurements.

    python scripts/bench_slurm.py [--trials 20] [--jobs 5] [--bare .venv/agent-wheelhouse [--only-bare]]
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nni_manager.loader import load_config  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from tests.support.manager.helpers import TRIAL, form, wait_status  # noqa: E402
from tests.support.slurm.fixtures import start_cluster  # noqa: E402
from bench_kube import _ms, sequential  # noqa: E402  (the same measurement as for Kubernetes)


def config(work: Path, code: Path, ts: dict[str, Any], wheelhouse: Path | None = None) -> Any:
    return load_config({"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                        "trialConcurrency": 2, "trialGracePeriod": 2, "experimentWorkingDirectory": str(work),
                        "trainingService": ts, **({"agentWheelhouse": str(wheelhouse)} if wheelhouse else {})})


async def to_running(cfg: Any, n: int) -> list[float]:
    times = []
    async with create_training_service(cfg) as ts:
        for i in range(n):
            t0 = time.perf_counter()
            job = await ts.submit_trial_job(form(i, steps=0))
            await wait_status(ts, job.id, "RUNNING", "SUCCEEDED", timeout=120)
            times.append(time.perf_counter() - t0)
            await wait_status(ts, job.id, "SUCCEEDED", timeout=120)
    return times


async def start_to_running(cfg: Any) -> float:
    """Start (the pythonPath check and any shipping happen there) + one trial's submit -> RUNNING."""
    t0 = time.perf_counter()
    async with create_training_service(cfg) as ts:
        job = await ts.submit_trial_job(form(0, steps=0))
        await wait_status(ts, job.id, "RUNNING", "SUCCEEDED", timeout=120)
        took = time.perf_counter() - t0
        await wait_status(ts, job.id, "SUCCEEDED", timeout=120)
    return took


class _Shipped(logging.Handler):
    """Counts what the manager shipped (backends/slurm/deps.py's "shipped N wheels (B bytes)" record)."""

    def __init__(self) -> None:
        super().__init__()
        self.wheels = self.bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("shipped "):
            self.wheels += int(record.args[0])  # type: ignore[index]
            self.bytes += int(record.args[1])  # type: ignore[index]


async def bare_python(tmp: Path, code: Path, slurm: dict[str, Any], wheelhouse: Path, rounds: int) -> None:
    """pythonPath a bare venv: dependencies shipped, then reused, next to a Python that has them."""
    stock = Path("/usr/bin/python3")
    venv = tmp / "bare"
    subprocess.run([str(stock), "-m", "venv", "--without-pip", str(venv)], check=True)
    os.environ["NNI_AGENT_WHEEL_CACHE"] = str(tmp / "wheel-cache")  # the manager's cache starts empty
    os.environ["NNI_AGENT_WHEEL_DOWNLOAD"] = "0"  # the wheels come from the wheelhouse
    shipped = _Shipped()
    logger = logging.getLogger("nni_manager.backends.slurm.deps")
    logger.addHandler(shipped)
    logger.setLevel(logging.INFO)
    ts = {**slurm, "reuseMode": False}
    firsts, seconds, haves, sizes = [], [], [], []
    for r in range(rounds):  # each round: a fresh experiments directory, so the first one ships
        work = tmp / f"bare-{r}"
        haves.append(await start_to_running(config(work, code, {**ts, "pythonPath": sys.executable})))
        before = shipped.bytes
        bare_cfg = {**ts, "pythonPath": str(venv / "bin" / "python3")}
        firsts.append(await start_to_running(config(work, code, bare_cfg, wheelhouse)))
        sizes.append(shipped.bytes - before)
        before = shipped.bytes
        seconds.append(await start_to_running(config(work, code, bare_cfg, wheelhouse)))
        if shipped.bytes != before:
            raise SystemExit("bench_slurm: the second experiment shipped the dependencies again")
    have, first, second = (statistics.median(x) for x in (haves, firsts, seconds))
    print(f"bare pythonPath (/usr/bin/python3 venv, no dependencies), start + submit -> trial RUNNING, one job per "
          f"trial, median of {rounds}: dependencies shipped {first:.2f} s ({shipped.wheels // rounds} wheels, "
          f"{statistics.median(sizes) / 1e6:.1f} MB through the shared file system), reused {second:.2f} s "
          f"(0 bytes), a Python that has them {have:.2f} s; ratios {first / have:.2f}x / {second / have:.2f}x")


def bare_sbatch(env: dict[str, str], code: Path, n: int) -> list[float]:
    """`sbatch --wait` of a job whose first step is the trial's interpreter start (to its first line)."""
    times = []
    for i in range(n):
        marker = code / f"started-{i}"
        script = f"#!/bin/sh\n#SBATCH --job-name=bench_bare_{i}\n{sys.executable} -c \"open('{marker}', 'w')\"\n"
        t0 = time.perf_counter()
        proc = subprocess.Popen(["sbatch", "--wait", "--parsable", f"--chdir={code}", "--output=/dev/null"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
        proc.communicate(script)
        while not marker.exists():  # --wait returns at the job's end; RUNNING is the first line
            time.sleep(0.005)
        times.append(time.perf_counter() - t0)
    return times


async def main(n: int, jobs: int, wheelhouse: Path | None, only_bare: bool) -> None:
    if os.geteuid() != 0 or not shutil.which("sbatch"):
        raise SystemExit("bench_slurm: needs root and Slurm (apt-get install -y slurmctld slurmd slurm-client munge)")
    tmp = Path(tempfile.mkdtemp(prefix="nbs", dir="/tmp"))
    (tmp / "cluster").mkdir()
    cluster = start_cluster(tmp / "cluster")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        code = tmp / "code"
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        slurm = {"platform": "slurm", "nniManagerIp": "127.0.0.1", "pollInterval": "0.2s",
                 "trialCpuNumber": 1, "trialMemorySize": "200mb"}
        if wheelhouse is not None:
            await bare_python(tmp, code, slurm, wheelhouse.resolve(), rounds=3)
            if only_bare:
                return
        local = await sequential(config(tmp / "e1", code, {"platform": "local"}), n)
        reuse = await sequential(config(tmp / "e2", code, {**slurm, "reuseMode": True}), n, warm=2)
        ratio = statistics.median(reuse) / statistics.median(local)
        print(f"per-trial submit -> SUCCEEDED, {n} trivial trials, sequential:")
        print(f"  local backend           {_ms(local)}")
        print(f"  slurm, reuse (2 allocs) {_ms(reuse)}   ratio {ratio:.2f}x  "
              f"[target <= 1.5x: {'OK' if ratio <= 1.5 else 'MISSED'}]")
        ours = await to_running(config(tmp / "e3", code, {**slurm, "reuseMode": False}), jobs)
        bare = bare_sbatch(cluster.env, code, jobs)
        print(f"non-reuse submit -> trial RUNNING over {jobs} jobs: ours {_ms(ours)}; bare `sbatch` -> the job's "
              f"first Python line {_ms(bare)}; ratio {statistics.median(ours) / statistics.median(bare):.2f}x")
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--bare", type=Path, metavar="WHEELHOUSE",
                        help="also time a bare pythonPath with the dependencies from this wheelhouse")
    parser.add_argument("--only-bare", action="store_true", help="with --bare: only that measurement")
    a = parser.parse_args()
    asyncio.run(main(a.trials, a.jobs, a.bare, a.only_bare))
