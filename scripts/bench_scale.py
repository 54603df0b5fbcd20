#!/usr/bin/env python3
"""Scale benchmark: N simulated agents against one real manager, side by side for each N.

The manager is the real one (`create_training_service`, Hub, Core, SQLite store) with a
backend (`simscale`, registered through the `nni_manager.backends` entry-point group like any
third-party platform) that only registers N agents. The agents are simulated in a few worker
processes, but each is a real gRPC client on its own TCP connection (TLS, trusting the
experiment's CA, as agents behind a tunnel do) speaking the real protocol: Hello with its token
(dialled again after a while when the hub admits no more unauthenticated streams from
127.0.0.1 just then, as a real agent redials), Welcome, sequenced RecordBatches and cumulative Acks, CommandAcks,
heartbeats at the Welcome's interval unless a RecordBatch went out meanwhile, GPU reports at
its GPU interval or --gpu-every, whichever is longer (two artificial GPUs whose utilisation
changes, the worst case for the manager) and resource reports. A StartTrial runs a fake trial that
reports RUNNING, emits PERIODICAL metrics at the rate its parameter asks for, then a FINAL
metric and SUCCEEDED. Tokens reach the workers on stdin, never in argv.

Reported per N (one row each, printed together at the end):
  * connect: manager start -> every agent connected; then the manager's CPU with N idle agents;
  * load phase: one trial per agent, all submitted at once (as the experiment loop does with
    trialConcurrency = N: how long that burst holds the event loop, and until every trial
    runs), then a fixed total metric rate split between the agents (so every N carries the same
    record load and the difference is per-agent cost). In the steady state (every trial
    running): manager CPU per 1,000 records and in % of a core (the manager process only: hub,
    core, store, listener; it also pays for N agents' heartbeats and GPU reports), manager RSS,
    status latency (record created on the agent -> metric listener called in the manager,
    time.time() on both sides of one machine) p50/p99 of the records made in the steady state,
    the worst latency of those made before it (during the burst and the trials' start, which
    they queue behind), the event loop's worst stall and the worst cyclic-GC pause, records
    lost or duplicated;
  * placement: submit_trial_job() duration (placement runs inside it) and submit -> RUNNING,
    median of sequential trials while the N agents idle;
  * list_trial_jobs() with --history terminal trials (default 100,000) already in the store,
    and how long the restarted manager took to load them.
Load-generator CPU is printed too: on a 2-core machine it competes with the manager.

    python scripts/bench_scale.py [--agents 10,100,1000] [--rate 1000] [--duration 15] [--history 100000]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil

from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb

CONNECT = "/nni_agent.v1.AgentHub/Connect"
PLATFORM = "simscale"


# ====================================================================== simulated agents (workers)


class SimAgent:
    """One agent: one channel (its own TCP connection), one stream, the real message flow."""

    def __init__(self, agent_id: str, token: str, target: str, gpu_every: float, ca: bytes) -> None:
        self.agent_id, self.token, self.target, self.gpu_every = agent_id, token, target, gpu_every
        self.credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        self.welcomed = False
        self.boot_id = uuid.uuid4().hex
        self.seq = 0
        self.unacked: list[pb.Record] = []
        self.unsent: list[pb.Record] = []
        self.out: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self.wake = asyncio.Event()
        self.trials: dict[str, asyncio.Task[None]] = {}
        self.done = asyncio.Event()
        self.errors: list[str] = []
        self.heartbeat_s = 5.0
        self.records_sent_at = 0.0
        self.cmd_acked = 0

    def record(self, **body: Any) -> None:
        self.seq += 1
        r = pb.Record(seq=self.seq, **body)
        self.unsent.append(r)
        self.unacked.append(r)
        self.wake.set()

    def gpu_report(self) -> pb.GpuReport:
        gpus = [pb.GpuSample(index=i, model="Sim GPU", uuid=f"GPU-{self.agent_id}-{i}",
                             utilization=float(random.randint(0, 100)), memory_used=random.randint(0, 8) << 30,
                             memory_total=16 << 30) for i in range(2)]
        return pb.GpuReport(time_ms=int(time.time() * 1000), gpus=gpus, provider="artificial")

    async def run(self) -> None:
        """Dial until welcomed (a fleet dialling at once is admitted some at a time), then serve."""
        for attempt in range(30):
            try:
                return await self._run()
            except grpc.aio.AioRpcError as e:
                if self.welcomed or e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
            await asyncio.sleep(random.uniform(0, min(5.0, 0.05 * 2 ** attempt)))  # the agent's backoff
        raise RuntimeError(f"{self.agent_id}: never admitted")

    async def _run(self) -> None:
        options = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.secure_channel(self.target, self.credentials, options=options) as channel:
            call = channel.stream_stream(CONNECT, request_serializer=pb.AgentMessage.SerializeToString,
                                         response_deserializer=pb.ManagerMessage.FromString)()
            host = pb.HostInfo(hostname=f"sim-{self.agent_id}", os="Linux sim", python=sys.version.split()[0],
                               cpu_count=8, memory_total=64 << 30, work_dir="/nonexistent", pid=os.getpid())
            await call.write(pb.AgentMessage(hello=pb.Hello(
                agent_id=self.agent_id, token=self.token, agent_version="sim", protocol_major=PROTOCOL_MAJOR,
                protocol_minor=PROTOCOL_MINOR, boot_id=self.boot_id, host=host, gpus=self.gpu_report())))
            first = await call.read()
            if first is grpc.aio.EOF or not first.HasField("welcome"):
                raise RuntimeError(f"{self.agent_id}: no Welcome: {first}")
            self.welcomed = True
            self.heartbeat_s = first.welcome.heartbeat_interval_ms / 1000 or 5.0
            if self.gpu_every:  # as a real agent: never more often than the manager asks
                self.gpu_every = max(self.gpu_every, first.welcome.gpu_sample_interval_ms / 1000)
            tasks = [asyncio.create_task(c) for c in (self._read(call), self._write(call), self._telemetry())]
            try:
                await self.done.wait()
                while self.unacked and not call.done():  # let the last records be stored
                    await asyncio.sleep(0.05)
            finally:
                for t in tasks:
                    t.cancel()
                try:
                    await call.done_writing()
                except (grpc.aio.AioRpcError, grpc.aio.UsageError, RuntimeError, Exception):
                    pass  # the manager ended the stream first

    async def _write(self, call: Any) -> None:
        while True:
            while not self.out.empty():
                await call.write(self.out.get_nowait())
            if self.unsent:
                batch, self.unsent = self.unsent, []
                await call.write(pb.AgentMessage(records=pb.RecordBatch(records=batch)))
                self.records_sent_at = time.monotonic()
                continue
            self.wake.clear()
            if self.out.empty() and not self.unsent:
                await self.wake.wait()

    def control(self, msg: pb.AgentMessage) -> None:
        self.out.put_nowait(msg)
        self.wake.set()

    async def _read(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                self.done.set()
                return
            kind = msg.WhichOneof("body")
            if kind == "ack":
                self.unacked = [r for r in self.unacked if r.seq > msg.ack.seq]
            elif kind == "command":
                cmd = msg.command
                which = cmd.WhichOneof("body")
                if which == "start_trial":
                    tid = cmd.start_trial.trial_id
                    if tid not in self.trials:
                        self.trials[tid] = asyncio.create_task(self._trial(tid, cmd.start_trial.parameter))
                elif which == "cancel_trial":
                    task = self.trials.get(cmd.cancel_trial.trial_id)
                    if task is not None and not task.done():
                        task.cancel()
                elif which == "shutdown":
                    for task in self.trials.values():
                        task.cancel()
                    self.done.set()
                if cmd.cmd_seq > self.cmd_acked:
                    self.cmd_acked = cmd.cmd_seq
                    self.control(pb.AgentMessage(command_ack=pb.CommandAck(cmd_seq=cmd.cmd_seq)))

    async def _telemetry(self) -> None:
        now = time.monotonic()  # phases spread as for agents started at different times
        next_hb, next_res = now + random.uniform(0, self.heartbeat_s), now + random.uniform(0, 2.0)
        next_gpu = now + random.uniform(0, self.gpu_every or 1.0)
        while True:
            now = time.monotonic()
            if now >= next_hb:  # as a real agent: a RecordBatch sent lately stands in for the heartbeat
                if now - self.records_sent_at >= self.heartbeat_s:
                    self.control(pb.AgentMessage(heartbeat=pb.Heartbeat(time_ms=int(time.time() * 1000))))
                    next_hb = now + self.heartbeat_s
                else:
                    next_hb = self.records_sent_at + self.heartbeat_s
            if self.gpu_every and now >= next_gpu:
                self.control(pb.AgentMessage(gpus=self.gpu_report()))
                next_gpu = now + self.gpu_every
            if now >= next_res:
                live = [t for t, task in self.trials.items() if not task.done()]
                if live:
                    self.control(pb.AgentMessage(resources=pb.ResourceReport(
                        time_ms=int(time.time() * 1000),
                        trials=[pb.TrialResources(trial_id=t, cpu_percent=50.0, rss_bytes=1 << 28, num_processes=1)
                                for t in live])))
                next_res = now + 2.0
            await asyncio.sleep(max(0.0, min(next_hb, next_gpu, next_res) - time.monotonic()))

    async def _trial(self, trial_id: str, parameter: str) -> None:
        p = json.loads(parameter)["parameters"]
        duration, rate = float(p.get("duration", 0)), float(p.get("rate", 0))
        start = int(time.time() * 1000)
        self.record(status=pb.TrialStatus(trial_id=trial_id, state=pb.TRIAL_STATE_RUNNING, pid=1,
                                          start_time_ms=start, working_directory="/nonexistent"))
        n = int(duration * rate)
        t0 = time.monotonic() + (random.uniform(0, 1 / rate) if rate else 0)  # trials are not in lockstep
        state = pb.TRIAL_STATE_SUCCEEDED
        try:
            for i in range(n):
                await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
                self._metric(trial_id, i + 1, "PERIODICAL", i)
            self._metric(trial_id, n + 1, "FINAL", 0)
        except asyncio.CancelledError:
            state = pb.TRIAL_STATE_USER_CANCELED
        self.record(status=pb.TrialStatus(trial_id=trial_id, state=state, has_exit_code=True, exit_code=0,
                                          start_time_ms=start, end_time_ms=int(time.time() * 1000)))

    def _metric(self, trial_id: str, trial_seq: int, kind: str, sequence: int) -> None:
        data = json.dumps({"parameter_id": 0, "trial_job_id": trial_id, "type": kind, "sequence": sequence,
                           "value": json.dumps(sequence * 0.5), "sent": time.time()})
        self.record(metric=pb.Metric(trial_id=trial_id, trial_seq=trial_seq, data=data,
                                     time_ms=int(time.time() * 1000)))


async def worker_main() -> None:
    """Run the agents named on stdin until the manager shuts each of them down."""
    spec = json.loads(sys.stdin.read())
    agents = [SimAgent(a, t, spec["target"], spec["gpu_every"], spec["ca"].encode()) for a, t in spec["agents"]]
    results = await asyncio.gather(*(a.run() for a in agents), return_exceptions=True)
    failed = [f"{a.agent_id}: {r!r}" for a, r in zip(agents, results) if isinstance(r, BaseException)]
    cpu = sum(psutil.Process().cpu_times()[:2])
    print(json.dumps({"failed": failed[:5], "n_failed": len(failed), "cpu": cpu}), flush=True)


# ====================================================================== the manager side


from nni_manager.backends.base import Backend, BackendContext  # noqa: E402
from nni_manager.config import ExperimentConfig, TrainingServiceConfig  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from nni_manager.store import Store  # noqa: E402
from nni_manager.types import (  # noqa: E402
    HyperParameters,
    TrialJobApplicationForm,
    TrialJobDetail,
    TrialJobMetric,
    TrialJobStatus,
)


class SimBackend(Backend):
    """Registers `SimBackend.count` agents; the bench starts their simulated processes."""

    platform = PLATFORM
    hub = "loopback"
    ships_code = False
    count = 0
    specs: list[tuple[str, str, str]] = []  # (agent id, token, hub address)
    ca = b""  # the experiment's CA certificate (public), which the simulated agents trust

    async def start(self, ctx: BackendContext) -> None:
        SimBackend.specs = []
        for i in range(SimBackend.count):
            spec = ctx.add_agent(f"sim{i:05d}")
            SimBackend.specs.append((spec.agent_id, spec.token, spec.hub_address))
            SimBackend.ca = spec.ca_certificate

    async def stop(self) -> None:
        pass


def register_backend(root: Path) -> None:
    """Make `simscale` a platform the way a third-party package would (an entry point)."""
    info = root / "simscale_bench-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: simscale-bench\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[nni_manager.backends]\n{PLATFORM} = bench_scale:SimBackend\n")
    sys.path.insert(0, str(root))
    sys.modules.setdefault("bench_scale", sys.modules[__name__])


def form(i: int, **params: Any) -> TrialJobApplicationForm:
    record = {"parameter_id": i, "parameter_source": "algorithm", "parameters": params, "parameter_index": 0}
    return TrialJobApplicationForm(sequence_id=i, hyper_parameters=HyperParameters(json.dumps(record), 0))


def prefill(exp_dir: Path, experiment_id: str, n: int) -> None:
    """`n` finished trials (with one metric each) in the store, as after a long experiment."""
    store = Store.open(exp_dir)
    now = int(time.time() * 1000)
    with store.transaction():
        store.init_experiment(experiment_id, {}, now)
        for i in range(n):
            tid = f"h{i:07d}"
            store.save_trial(TrialJobDetail(
                id=tid, status=TrialJobStatus.SUCCEEDED, submit_time=now - n + i, form=form(i),
                sequence_id=i, message="", start_time=now, end_time=now, working_directory="/nonexistent"))
            store.add_metric(tid, "old", "old", i + 1, 1, '{"type": "FINAL", "sequence": 0, "value": "1"}', now)
    store.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass
class Row:
    n: int
    connect_s: float = 0.0
    idle_pct: float = 0.0
    load_s: float = 0.0
    records: int = 0
    cpu_per_1k: float = 0.0
    rss_mb: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    backlog_ms: float = 0.0
    stall_ms: float = 0.0
    gc_ms: float = 0.0
    burst_s: float = 0.0
    all_running_s: float = 0.0
    steady_cpu_pct: float = 0.0
    lost: int = 0
    duplicated: int = 0
    submit_ms: float = 0.0
    running_ms: float = 0.0
    list_ms: float = 0.0
    load_store_s: float = 0.0
    gen_cpu_pct: float = 0.0
    errors: list[str] = field(default_factory=list)


class GcMeter:
    """The longest cyclic-GC pause (any generation): with 100k trials in memory a full
    collection walks them all, and the event loop waits meanwhile."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._t0 = 0.0
        import gc

        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.worst = max(self.worst, time.perf_counter() - self._t0)


class StallMeter:
    """The event loop's worst lateness for a 10 ms sleep: how long the manager's loop was blocked."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.worst = 0.0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.monotonic() - t - 0.01)

    def stop(self) -> float:
        if self._task:
            self._task.cancel()
        return self.worst


async def run_one(n: int, args: argparse.Namespace, root: Path) -> Row:
    row = Row(n)
    asyncio.get_running_loop().slow_callback_duration = 0.05
    work = root / f"n{n}"
    experiment_id = f"Scale{n}"
    exp_dir = work / experiment_id
    if args.history:
        prefill(exp_dir, experiment_id, args.history)
    config = ExperimentConfig(trial_command="simulated", trial_code_directory=root,
                              training_service=TrainingServiceConfig(platform=PLATFORM, reconnect_window=120.0),
                              trial_concurrency=n, experiment_working_directory=work)
    SimBackend.count = n
    me = psutil.Process()
    t_start = time.monotonic()
    workers: list[subprocess.Popen[str]] = []
    async with create_training_service(config, experiment_id=experiment_id) as ts:
        row.load_store_s = time.monotonic() - t_start  # mostly loading the trial table
        procs = max(1, min(args.procs, math.ceil(n / 100)))
        specs = SimBackend.specs
        for k in range(procs):
            mine = specs[k::procs]
            w = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            assert w.stdin is not None
            w.stdin.write(json.dumps({"target": mine[0][2], "agents": [(a, t) for a, t, _ in mine],
                                      "gpu_every": args.gpu_every, "ca": SimBackend.ca.decode()}))
            w.stdin.close()
            workers.append(w)
        deadline = time.monotonic() + 300
        while sum(a["connected"] for a in ts.agents()) < n:
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise RuntimeError(f"N={n}: only {sum(a['connected'] for a in ts.agents())} agents connected")
            await asyncio.sleep(0.05)
        row.connect_s = time.monotonic() - t_start
        await asyncio.sleep(2)  # the first heartbeats and GPU reports settle
        cpu0, t0 = sum(me.cpu_times()[:2]), time.monotonic()
        await asyncio.sleep(args.idle)  # N connected agents, no trial: heartbeats and GPU reports only
        row.idle_pct = (sum(me.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0) * 100

        # ---- load: one trial per agent, the same total metric rate for every N
        latencies: list[float] = []  # steady state only: records made once every trial runs
        backlog: list[float] = []  # records made before, during the burst and the trials' start
        steady_since = math.inf
        seen: dict[str, list[int]] = {}
        statuses = 0
        running_at: dict[str, float] = {}
        ended: set[str] = set()

        def on_metric(m: TrialJobMetric) -> None:
            d = json.loads(m.data)
            (latencies if d["sent"] >= steady_since else backlog).append(time.time() - d["sent"])
            seen.setdefault(m.id, []).append(d["sequence"] if d["type"] == "PERIODICAL" else -1)

        def on_status(d: TrialJobDetail) -> None:
            nonlocal statuses
            if d.status == TrialJobStatus.RUNNING and d.id not in running_at:
                statuses += 1
                running_at[d.id] = time.perf_counter()
            elif d.status.is_terminal and d.id not in ended:
                statuses += 1
                ended.add(d.id)

        ts.add_trial_job_metric_listener(on_metric)
        ts.add_trial_job_status_listener(on_status)
        per_trial_rate = args.rate / n
        stall = StallMeter()
        gc_meter = GC_METER
        gen0 = sum(sum(psutil.Process(w.pid).cpu_times()[:2]) for w in workers)
        t0 = time.monotonic()
        # as the experiment loop does with trialConcurrency = N: N submissions at once, no yield between
        ids = [(await ts.submit_trial_job(form(i, duration=args.duration, rate=per_trial_rate))).id for i in range(n)]
        row.burst_s = time.monotonic() - t0  # the event loop did nothing else meanwhile
        deadline = time.monotonic() + args.duration * 10 + 120
        while len(running_at) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        row.all_running_s = time.monotonic() - t0
        # the steady state: every trial streams; the burst's backlog is behind
        steady_since, records0 = time.time(), statuses
        cpu1, t1 = sum(me.cpu_times()[:2]), time.monotonic()
        stall.start()
        gc_meter.worst = 0.0
        while not all(t in ended for t in ids):
            if time.monotonic() > deadline:
                row.errors.append(f"load phase: {len(set(ids) - ended)} trials did not end")
                break
            await asyncio.sleep(0.05)
        row.load_s = time.monotonic() - t0
        cpu = sum(me.cpu_times()[:2]) - cpu1
        row.steady_cpu_pct = cpu / (time.monotonic() - t1) * 100
        gen = sum(sum(psutil.Process(w.pid).cpu_times()[:2]) for w in workers) - gen0
        row.stall_ms = stall.stop() * 1000
        row.gc_ms = gc_meter.worst * 1000
        row.rss_mb = me.memory_info().rss / 2**20
        expected = int(args.duration * per_trial_rate)
        for t in ids:
            got = seen.get(t, [])
            want = list(range(expected)) + [-1]
            row.lost += len(set(want) - set(got))
            row.duplicated += len(got) - len(set(got))
            if (await ts.get_trial_job(t)).status != TrialJobStatus.SUCCEEDED:
                row.errors.append(f"{t} ended {(await ts.get_trial_job(t)).status.value}")
        row.records = len(latencies) + statuses - records0
        row.cpu_per_1k = cpu / max(1, row.records) * 1000
        row.gen_cpu_pct = gen / row.load_s * 100
        row.p50_ms, row.p99_ms, row.max_ms = (percentile(latencies, q) * 1000 for q in (0.5, 0.99, 1.0))
        row.backlog_ms = max(backlog, default=0.0) * 1000

        # ---- placement: sequential short trials while the N agents idle
        submits, to_running = [], []
        for i in range(args.placements):
            t1 = time.perf_counter()
            job = await ts.submit_trial_job(form(n + i, duration=0, rate=0))
            submits.append(time.perf_counter() - t1)
            deadline = time.monotonic() + 30
            while job.id not in running_at:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"N={n}: trial {job.id} never ran: {(await ts.get_trial_job(job.id)).message}")
                await asyncio.sleep(0.0005)
            to_running.append(running_at[job.id] - t1)
        row.submit_ms = statistics.median(submits) * 1000
        row.running_ms = statistics.median(to_running) * 1000

        # ---- list_trial_jobs with the history
        times = []
        for _ in range(3):
            t1 = time.perf_counter()
            await ts.list_trial_jobs()
            times.append(time.perf_counter() - t1)
        row.list_ms = statistics.median(times) * 1000
    for w in workers:
        assert w.stdout is not None
        out = w.stdout.read()
        w.wait(timeout=60)
        try:
            report = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            row.errors.append(f"worker {w.pid} exited {w.returncode} without a report")
            continue
        if report["n_failed"]:
            row.errors.append(f"{report['n_failed']} simulated agents failed: {report['failed']}")
    shutil.rmtree(work, ignore_errors=True)
    return row


GC_METER: GcMeter


def main() -> int:
    global GC_METER
    if "--worker" in sys.argv:
        asyncio.run(worker_main())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="10,100,1000", help="comma-separated N values")
    parser.add_argument("--rate", type=float, default=1000.0, help="total metrics/s over all agents (load phase)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds each load-phase trial runs")
    parser.add_argument("--history", type=int, default=100_000, help="finished trials already in the store")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle agents measured before the load")
    parser.add_argument("--placements", type=int, default=20, help="sequential trials timed for placement")
    parser.add_argument("--gpu-every", type=float, default=5.0, help="seconds between GPU reports per agent (0: none)")
    parser.add_argument("--procs", type=int, default=2, help="most worker processes for the simulated agents")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the manager process into FILE (pstats)")
    args = parser.parse_args()
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
        os.environ.pop(var, None)
    GC_METER = GcMeter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bs", dir="/tmp") as tmp:
        root = Path(tmp)
        register_backend(root / "plugin")
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        for n in (int(x) for x in args.agents.split(",")):
            print(f"N={n} ...", file=sys.stderr, flush=True)
            rows.append(asyncio.run(run_one(n, args, root), debug=bool(os.environ.get("BENCH_DEBUG"))))
            gc.collect()  # the stopped service is garbage: the next N starts from a clean heap
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
    print(f"\n{args.rate:g} metrics/s in total for {args.duration:g} s (one trial per agent), GPU report every "
          f"{args.gpu_every:g} s per agent, {args.history:,} finished trials in the store; {os.cpu_count()} cores")
    head = ("agents", "connect s", "idle mgr CPU %", "records", "mgr CPU s/1k rec", "mgr RSS MB", "latency p50 ms", "p99 ms", "max ms",
            "burst backlog worst ms", "submit N at once s", "-> all RUNNING s", "steady mgr CPU %", "loop stall ms (steady)", "worst GC pause ms", "lost", "dup", "submit ms", "submit->RUNNING ms", "list_trial_jobs ms", "load table s",
            "generator CPU %")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(str(x) for x in (
            r.n, f"{r.connect_s:.2f}", f"{r.idle_pct:.1f}", r.records, f"{r.cpu_per_1k:.3f}", f"{r.rss_mb:.0f}", f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}", f"{r.max_ms:.0f}", f"{r.backlog_ms:.0f}", f"{r.burst_s:.2f}", f"{r.all_running_s:.2f}", f"{r.steady_cpu_pct:.0f}", f"{r.stall_ms:.0f}", f"{r.gc_ms:.0f}", r.lost, r.duplicated, f"{r.submit_ms:.2f}",
            f"{r.running_ms:.1f}", f"{r.list_ms:.0f}", f"{r.load_store_s:.2f}", f"{r.gen_cpu_pct:.0f}")))
    base = rows[0]
    for r in rows[1:]:
        print(f"N={r.n} vs N={base.n}: CPU/1k records {r.cpu_per_1k / base.cpu_per_1k:.2f}x, "
              f"p99 {r.p99_ms / max(base.p99_ms, 1e-9):.2f}x, submit {r.submit_ms / max(base.submit_ms, 1e-9):.2f}x")
    for r in rows:
        for e in r.errors:
            print(f"N={r.n} ERROR: {e}")
    return 1 if any(r.errors or r.lost or r.duplicated for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
