"""The Slurm fixture's teardown ends what a failed test left running on the test cluster (job steps
and the jobs' processes, found by the cluster's SLURM_CONF in their environment), and nothing else."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil

from tests.support.slurm.fixtures import Slurm


def _orphan(env: dict[str, str]) -> psutil.Process:
    """A `sleep` whose parent has exited (as a job's process is slurmstepd's, not ours)."""
    out = subprocess.run(["/bin/sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], env=env, capture_output=True,
                         text=True, check=True, timeout=30)
    return psutil.Process(int(out.stdout))


def _gone(proc: psutil.Process, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:  # this worker may be a subreaper: reap it
                os.waitpid(proc.pid, os.WNOHANG)
                return True
        except (psutil.NoSuchProcess, ChildProcessError):
            return True
        time.sleep(0.05)
    return False


def test_teardown_kills_the_cluster_s_job_processes_and_spares_the_rest(tmp_path: Path) -> None:
    cluster = Slurm(tmp_path)
    other = Slurm(tmp_path / "other")
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    job = _orphan({**base, "SLURM_CONF": str(cluster.conf), "SLURM_JOB_ID": "7"})
    not_a_job = _orphan({**base, "SLURM_CONF": str(cluster.conf)})  # e.g. a manager the test started
    other_clusters = _orphan({**base, "SLURM_CONF": str(other.conf), "SLURM_JOB_ID": "7"})
    try:
        assert cluster.job_processes() == [job.pid]
        assert cluster.kill_leftovers() == [job.pid]
        assert _gone(job)
        assert not_a_job.is_running() and other_clusters.is_running()
        assert cluster.kill_leftovers() == []
    finally:
        for proc in (job, not_a_job, other_clusters):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
