"""Local backend throughput and overhead per trial at several concurrencies, next to the floor
of a bare subprocess loop with as many slots.

Both sides run the same trivial trial (read its parameter, report 10 intermediate results
and a final one, exit) N times with C slots, under the same env contract and parameter.cfg:

* ours:  TrainingService (local backend: one agent running every trial it is sent, gRPC,
  SQLite), driven like the experiment loop with trialConcurrency C: a new trial is submitted
  as soon as one is done;
* floor: subprocess.Popen + os.wait, C at a time, each trial in a session of its own as the
  agent starts them (with the kernel's autogroup scheduling a session is a scheduling group:
  without it, under load, the floor's trials shared one group and lost to ours).

Slot time = submit/launch -> trial seen ended (ours: terminal status AND its final metric both
seen by the listeners; floor: process reaped). The trial's own run time is measured inside the
trial, from its first line to exit, and written to $NNI_SYS_DIR/own_time; overhead = slot time -
own time. Both overheads therefore include the interpreter's start-up and exit (the same for
both sides; `python -c pass`, run C at a time, is printed for scale). Throughput = N / (first
launch -> last trial done); ours excludes starting the hub and the agent (once per C).

For each C, one untimed warm-up run of each side (`--warmup`: byte-code caches, page cache, the
first SQLite file), then the two sides alternate `--rounds` times (floor first, then ours, then
ours, then floor, ...), so load from elsewhere on the machine hits both alike. Every round is
printed, and the table gives the ratio's min / median / max over the rounds, never one chosen
round. The load average (and the core count) is printed with every round: on a machine other
work loads, the throughput ratio swings either way (a loaded floor can look slower than ours);
the CPU ratio, (ours' trials + agent + manager) / floor's trials per trial, moves much less and
is what the throughput ratio tends to where both sides are CPU-bound on idle cores.

CPU per trial, same span: the floor's trials themselves (reaped children), the agent process
(all its threads, not its trials) and this process (manager, hub, store and this driver). Where
cores are plenty the agent's share is the limit: its Python work runs on one loop under one GIL.
On a machine with few cores both sides are CPU-bound, and the ratio is about
(trial + agent + manager + the trial's /bin/sh) / trial.

    python scripts/bench_local.py --trials 200 --concurrency 2,8,16,32,64 --rounds 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from nni_manager.loader import load_config
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
DEFAULT_CONCURRENCY = "2,8,16,32,64"


@dataclass
class Run:
    overheads: list[float]  # per trial: slot time - the trial's own time
    wall: float  # first launch -> last trial done
    agent_cpu: float = 0.0  # ours: CPU seconds of the agent process (all its threads), same span
    ours_trial_cpu: float = 0.0  # ours: CPU seconds of the trials the agent reaped (with their /bin/sh)
    manager_cpu: float = 0.0  # ours: CPU seconds of this process (manager, hub, store and this driver)
    trial_cpu: float = 0.0  # floor: CPU seconds of the trials themselves

    def per_trial_ms(self, seconds: float) -> float:
        return seconds / len(self.overheads) * 1000

    @property
    def throughput(self) -> float:
        return len(self.overheads) / self.wall

    @property
    def mean_overhead(self) -> float:
        return statistics.mean(self.overheads)

    @property
    def cpu(self) -> float:
        """CPU seconds of everything this side ran for its trials (the trials included)."""
        return self.trial_cpu + self.ours_trial_cpu + self.agent_cpu + self.manager_cpu


def record(i: int) -> str:
    return json.dumps({"parameter_id": i, "parameter_source": "algorithm", "parameters": {"x": i},
                       "parameter_index": 0})


async def ours(code: Path, work: Path, n: int, slots: int) -> Run:
    config = load_config({"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                          "trialConcurrency": slots, "trainingService": {"platform": "local"},
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
        deadline = time.monotonic() + 60
        while not any(a["connected"] for a in ts.agents()):  # agent start-up is not per-trial cost
            if time.monotonic() > deadline:
                raise SystemExit(f"the agent did not connect within 60 s: see {work}/*/agents/local/agent.log")
            await asyncio.sleep(0.01)
        agent = _agent_process()
        agent_cpu0, manager_cpu0, trials_cpu0 = _cpu(agent), time.process_time(), _reaped_cpu(agent)
        submitted = 0
        t0 = time.perf_counter()
        while len(slot) < n:
            while submitted < n and submitted - len(slot) < slots:
                t1 = time.perf_counter()
                job = await ts.submit_trial_job(TrialJobApplicationForm(submitted, HyperParameters(record(submitted))))
                started[job.id] = t1
                submitted += 1
            wake.clear()
            await asyncio.wait_for(wake.wait(), 120)
        wall = time.perf_counter() - t0
        agent_cpu, manager_cpu = _cpu(agent) - agent_cpu0, time.process_time() - manager_cpu0
        trials_cpu = _reaped_cpu(agent) - trials_cpu0
    return Run([slot[t] - float(Path(ended[t].working_directory, "own_time").read_text()) for t in slot], wall,
               agent_cpu, trials_cpu, manager_cpu)


def _agent_process() -> psutil.Process:
    """The local backend's agent: this process's child running nni_agent."""
    for child in psutil.Process().children():
        try:
            if "nni_agent" in child.cmdline():
                return child
        except psutil.Error:
            continue
    raise SystemExit("cannot find the agent process")


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()  # the process's own threads; its children (the trials) are not counted
    return times.user + times.system


def _reaped_cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()  # the children it reaped: ours' trials (and their /bin/sh)
    return times.children_user + times.children_system


def floor(code: Path, work: Path, n: int, slots: int) -> Run:
    overheads: list[float] = []
    running: dict[int, tuple[float, Path]] = {}
    launched = 0
    t_start = time.perf_counter()
    children0 = _children_cpu()
    while len(overheads) < n:
        while launched < n and len(running) < slots:
            sys_dir = work / f"t{launched}"
            (sys_dir / ".nni").mkdir(parents=True)
            t0 = time.perf_counter()
            (sys_dir / "parameter.cfg").write_text(record(launched))
            env = dict(os.environ, NNI_PLATFORM="local", NNI_EXP_ID="floor", NNI_TRIAL_JOB_ID=f"t{launched}",
                       NNI_SYS_DIR=str(sys_dir), NNI_OUTPUT_DIR=str(sys_dir), NNI_TRIAL_SEQ_ID=str(launched),
                       NNI_CODE_DIR=str(code))
            with open(sys_dir / "trial.stdout", "wb") as out, open(sys_dir / "trial.stderr", "wb") as err:
                # in a session of its own, as the agent starts every trial: with the kernel's autogroup
                # scheduling (the default), a session is a scheduling group, so trials left in this
                # process's session would share one group's CPU while ours' each get a group, and on a
                # machine other work loads the floor would lose (what the earlier "ours faster than a
                # bare loop" rounds were)
                proc = subprocess.Popen([sys.executable, "trial.py"], cwd=code, env=env, stdout=out, stderr=err,
                                        start_new_session=True)
            proc.returncode = 0  # reaped below with os.wait
            running[proc.pid] = (t0, sys_dir)
            launched += 1
        pid, _ = os.wait()
        if pid in running:
            t0, sys_dir = running.pop(pid)
            overheads.append(time.perf_counter() - t0 - float((sys_dir / "own_time").read_text()))
    return Run(overheads, time.perf_counter() - t_start, trial_cpu=_children_cpu() - children0)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped children: the floor's trials
    return usage.ru_utime + usage.ru_stime


def python_startup(slots: int, rounds: int = 5) -> float:
    """Median wall time of `python -c pass`, `slots` at a time like the trials."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(slots)]
        for proc in procs:
            proc.wait()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.throughput)[(len(runs) - 1) // 2]


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """min / median / max, or the one value."""
    if len(values) == 1:
        return fmt.format(values[0])
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min: {five:.1f}) on {os.cpu_count()} cores"


def side(name: str, code: Path, work: Path, n: int, slots: int) -> Run:
    """One run of one side, its files removed after."""
    try:
        return floor(code, work, n, slots) if name == "floor" else asyncio.run(ours(code, work, n, slots))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200, help="trials per side and round (at least 4x C is used)")
    parser.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help="comma list of slot counts C")
    parser.add_argument("--rounds", type=int, default=3, help="measured floor/ours pairs per C")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each side per C, first")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    rows = []
    loads = [os.getloadavg()[0]]
    print(f"start: {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp, "code")
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        for c in levels:
            n = max(args.trials, 4 * c)
            floors: list[Run] = []
            ourss: list[Run] = []

            for w in range(args.warmup):
                for name in ("floor", "ours"):
                    side(name, code, Path(tmp, f"{name}-{c}-warmup{w}"), 4 * c, c)
            for r in range(args.rounds):
                order = ("floor", "ours") if r % 2 == 0 else ("ours", "floor")
                got = {name: side(name, code, Path(tmp, f"{name}-{c}-{r}"), n, c) for name in order}
                floors.append(got["floor"])
                ourss.append(got["ours"])
                loads.append(os.getloadavg()[0])
                f, o = got["floor"], got["ours"]
                print(f"C={c} round {r + 1}/{args.rounds} ({order[0]} first): floor {f.throughput:.1f} trials/s, "
                      f"ours {o.throughput:.1f} trials/s, ratio {f.throughput / o.throughput:.2f}x, CPU ratio "
                      f"{o.cpu / f.cpu:.2f}x; {load()}", flush=True)
            ratios = [f.throughput / o.throughput for f, o in zip(floors, ourss)]
            rows.append((c, n, python_startup(c), median_run(floors), median_run(ourss), ratios,
                         [o.cpu / f.cpu for f, o in zip(floors, ourss)], floors, ourss))
            print_row(*rows[-1][:6], flush=True)
    print()
    print(f"end: {load()}; the load average over the rounds: {spread(loads, '{:.1f}')} (min / median / max)")
    if max(loads) > (os.cpu_count() or 1) / 2:
        print("  the machine was loaded by other work: the throughput ratios below are load-dominated; "
              "the CPU ratio is the steadier figure")
    print(f"\nmin / median / max over {args.rounds} round(s) of each side:")
    print(f"{'C':>3} | {'N':>4} | {'floor trials/s':>20} | {'ours trials/s':>20} | {'ratio floor/ours':>20} "
          f"| {'CPU ratio ours/floor':>20} | {'CPU ms/trial: floor trial / ours trial / agent / manager':>55} "
          f"| python -c pass x C")
    for c, n, startup, f, o, ratios, cpu_ratios, floors, ourss in rows:
        cpu = (f"{f.per_trial_ms(f.trial_cpu):.1f} / {o.per_trial_ms(o.ours_trial_cpu):.1f} / "
               f"{o.per_trial_ms(o.agent_cpu):.2f} / {o.per_trial_ms(o.manager_cpu):.2f}")
        print(f"{c:>3} | {n:>4} | {spread([r.throughput for r in floors], '{:.1f}'):>20} "
              f"| {spread([r.throughput for r in ourss], '{:.1f}'):>20} | {spread(ratios):>20} "
              f"| {spread(cpu_ratios):>20} | {cpu:>55} | {startup:.3f} s")
    print("(CPU ms/trial: the median round of each side)")
    agent_ms = max(row[4].per_trial_ms(row[4].agent_cpu) for row in rows)
    print(f"(estimate: the agent's Python work runs on one loop under one GIL, so at {agent_ms:.2f} ms of its CPU "
          f"per trial, the most above, it alone would cap ours near {1000 / agent_ms:.0f} trials/s however many "
          f"cores there are; the manager column includes this driver)")
    two = next((row for row in rows if row[0] == 2), None)
    if two is not None:  # the original 2-slot report
        f, o = two[3], two[4]
        ratio = o.mean_overhead / f.mean_overhead
        extra = o.mean_overhead - f.mean_overhead
        print(f"\n2 slots: ours {o.mean_overhead:.3f} s per trial, floor {f.mean_overhead:.3f} s; ratio ours/floor "
              f"{ratio:.2f}x (target: <= 1.5x) {'OK' if ratio <= 1.5 else 'MISSED'}; {extra:+.3f} s above the "
              f"floor (target: < 0.1 s per trial) {'OK' if o.mean_overhead < 0.1 else 'MISSED'}")
    worst = max(max(row[5]) for row in rows)
    print(f"worst throughput ratio floor/ours over every C and round: {worst:.2f}x (target: <= 1.2x) "
          f"{'OK' if worst <= 1.2 else 'MISSED'}; median rounds: "
          + ", ".join(f"C={row[0]} {statistics.median(row[5]):.2f}x" for row in rows))


def print_row(c: int, n: int, startup: float, f: Run, o: Run, ratios: list[float], flush: bool = False) -> None:
    print(f"C={c}: floor {f.throughput:.1f} trials/s, ours {o.throughput:.1f} trials/s, "
          f"ratios {', '.join(f'{r:.2f}' for r in ratios)} (median rounds shown); mean overhead floor "
          f"{f.mean_overhead:.3f} s, ours {o.mean_overhead:.3f} s; agent {o.per_trial_ms(o.agent_cpu):.2f} ms "
          f"CPU per trial", flush=flush)


if __name__ == "__main__":
    main()
