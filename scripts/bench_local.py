"""Local backend overhead per trial, next to the floor of a bare subprocess loop.

Both sides run the same trivial trial (read its parameter, report 10 intermediate results
and a final one, exit) N times with 2 slots, under the same env contract and parameter.cfg:

* ours:  TrainingService (local backend: agent, gRPC, SQLite), driven like the experiment loop;
* floor: subprocess.Popen + wait, two at a time.

Slot time = submit/launch -> trial seen ended (ours: terminal status after its final metric;
floor: process reaped). The trial's own run time is measured inside the trial, from its first
line to exit, and written to $NNI_SYS_DIR/own_time; overhead = slot time - own time. Both
overheads therefore include the interpreter's start-up and exit (the same for both sides;
`python -c pass`, run two at a time like the trials, is printed for scale): subtracting an
estimate of it is too noisy at this scale and can make the floor negative.

    python scripts/bench_local.py --trials 40
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nni_manager.config import load_config
from nni_manager.service import create_training_service
from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail, TrialJobMetric

TRIAL = """\
import time
_t0 = time.perf_counter()
import atexit, os
atexit.register(lambda: open(os.path.join(os.environ["NNI_SYS_DIR"], "own_time"), "w").write(
    str(time.perf_counter() - _t0)))
import nni_agent as nni
p = nni.get_next_parameter()
for i in range(10):
    nni.report_intermediate_result(p["x"] * i)
nni.report_final_result(p["x"])
"""
SLOTS = 2


def record(i: int) -> str:
    return json.dumps({"parameter_id": i, "parameter_source": "algorithm", "parameters": {"x": i},
                       "parameter_index": 0})


async def ours(code: Path, work: Path, n: int) -> list[float]:
    config = load_config({"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                          "trialConcurrency": SLOTS, "trainingService": {"platform": "local"},
                          "experimentWorkingDirectory": str(work)})
    started: dict[str, float] = {}
    finals: set[str] = set()
    ended: dict[str, TrialJobDetail] = {}
    slot: dict[str, float] = {}
    wake = asyncio.Event()

    def done(trial_id: str) -> None:
        if trial_id in finals and trial_id in ended and trial_id not in slot:
            slot[trial_id] = time.perf_counter() - started[trial_id]
            wake.set()

    def on_metric(m: TrialJobMetric) -> None:
        if json.loads(m.data).get("type") == "FINAL":
            finals.add(m.id)
            done(m.id)

    def on_status(d: TrialJobDetail) -> None:
        if d.status.is_terminal:
            ended[d.id] = d
            done(d.id)

    async with create_training_service(config) as ts:
        ts.add_trial_job_metric_listener(on_metric)
        ts.add_trial_job_status_listener(on_status)
        while not any(a["connected"] for a in ts.agents()):  # agent start-up is not per-trial cost
            await asyncio.sleep(0.01)
        submitted = 0
        while len(slot) < n:
            while submitted < n and submitted - len(slot) < SLOTS:
                t0 = time.perf_counter()
                job = await ts.submit_trial_job(TrialJobApplicationForm(submitted, HyperParameters(record(submitted))))
                started[job.id] = t0
                submitted += 1
            wake.clear()
            await asyncio.wait_for(wake.wait(), 60)
    return [slot[t] - float(Path(ended[t].working_directory, "own_time").read_text()) for t in slot]


def floor(code: Path, work: Path, n: int) -> list[float]:
    overheads: list[float] = []
    running: list[tuple[subprocess.Popen[bytes], float, Path]] = []
    launched = 0
    while len(overheads) < n:
        while launched < n and len(running) < SLOTS:
            sys_dir = work / f"t{launched}"
            (sys_dir / ".nni").mkdir(parents=True)
            t0 = time.perf_counter()
            (sys_dir / "parameter.cfg").write_text(record(launched))
            env = dict(os.environ, NNI_PLATFORM="local", NNI_EXP_ID="floor", NNI_TRIAL_JOB_ID=f"t{launched}",
                       NNI_SYS_DIR=str(sys_dir), NNI_OUTPUT_DIR=str(sys_dir), NNI_TRIAL_SEQ_ID=str(launched),
                       NNI_CODE_DIR=str(code))
            with open(sys_dir / "trial.stdout", "wb") as out, open(sys_dir / "trial.stderr", "wb") as err:
                proc = subprocess.Popen([sys.executable, "trial.py"], cwd=code, env=env, stdout=out, stderr=err)
            running.append((proc, t0, sys_dir))
            launched += 1
        pid, _ = os.wait()
        for item in running:
            proc, t0, sys_dir = item
            if proc.pid == pid:
                proc.returncode = 0
                overheads.append(time.perf_counter() - t0 - float((sys_dir / "own_time").read_text()))
                running.remove(item)
                break
    return overheads


def python_startup(rounds: int = 10) -> float:
    """Median wall time of `python -c pass`, SLOTS at a time like the trials, so the start-up
    subtracted from both sides is paid under the same CPU contention as theirs."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(SLOTS)]
        for proc in procs:
            proc.wait()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def describe(name: str, overheads: list[float], wall: float) -> str:
    return (f"{name:<6} mean {statistics.mean(overheads):.3f} s  median {statistics.median(overheads):.3f} s  "
            f"max {max(overheads):.3f} s  per trial; {len(overheads)} trials in {wall:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40)
    n = parser.parse_args().trials
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp, "code")
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        startup = python_startup()
        t0 = time.perf_counter()
        floor_overheads = floor(code, Path(tmp, "floor"), n)
        floor_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        our_overheads = asyncio.run(ours(code, Path(tmp, "ours"), n))
        our_wall = time.perf_counter() - t0  # includes starting the hub and the agent once
    print(f"python -c pass, two at a time: {startup:.3f} s (part of both overheads below)")
    ratio = statistics.mean(our_overheads) / statistics.mean(floor_overheads)
    extra = statistics.mean(our_overheads) - statistics.mean(floor_overheads)
    print(describe("floor", floor_overheads, floor_wall))
    print(describe("ours", our_overheads, our_wall))
    print(f"ratio ours/floor {ratio:.2f}x   (target: <= 1.5x)   "
          f"{'OK' if ratio <= 1.5 else 'MISSED'}")
    print(f"ours  {statistics.mean(our_overheads):.3f} s per trial, {extra:+.3f} s above the floor "
          f"(target: < 0.1 s per trial)   {'OK' if statistics.mean(our_overheads) < 0.1 else 'MISSED'}")


if __name__ == "__main__":
    main()
