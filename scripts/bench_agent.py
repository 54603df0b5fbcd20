#!/usr/bin/env python3
"""Agent benchmarks, each printed next to its floor measured in the same run.

1. Metric throughput, trial -> manager metric listener (trial writes .nni/metrics; agent
   tails, sequences and batches; gRPC; hub stores in SQLite and calls the listener)
   versus a bare gRPC stream of the same Metric records, batched the same way, from a
   child process to a server that parses them and calls a callback. Sustained rate =
   records / (last callback - first callback). Target: >= 20,000 records/s.
2. Start overhead: time from submit_trial_job() to the trial's first line of Python,
   versus subprocess.Popen of the same command (shell=True). Median over sequential runs.
   Target: at most 10 ms added.
3. Idle agent: RSS and CPU of a connected agent with no trials over a window.
   Targets: RSS <= 40 MB, CPU <= 0.5 % of one core.

    python scripts/bench_agent.py [--metrics 100000] [--starts 30] [--idle 10]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import grpc
import psutil

from nni_agent.v1 import agent_pb2 as pb
from nni_agent.v1 import agent_pb2_grpc as pb_grpc
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobMetric, TrialJobStatus

PY = sys.executable
BATCH = 2048


def _config(workdir: Path, command: str) -> ExperimentConfig:
    return ExperimentConfig(
        trial_command=command,
        trial_code_directory=workdir,
        training_service=TrainingServiceConfig(platform="local"),
        trial_concurrency=1,
        experiment_working_directory=workdir / "exp",
    )


def _form(i: int) -> TrialJobApplicationForm:
    record = {"parameter_id": i, "parameter_source": "algorithm", "parameters": {"i": i}, "parameter_index": 0}
    return TrialJobApplicationForm(sequence_id=i, hyper_parameters=HyperParameters(json.dumps(record), 0))


async def _wait_end(ts, trial_id: str, timeout: float = 600) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (await ts.get_trial_job(trial_id)).status.is_terminal:
        if time.monotonic() > deadline:
            raise TimeoutError(trial_id)
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------- 1. throughput


async def ours_throughput(workdir: Path, n: int) -> float:
    script = workdir / "burst.py"
    script.write_text(textwrap.dedent(f"""
        import nni_agent as nni
        nni.get_next_parameter()
        for i in range({n}):
            nni.report_intermediate_result(i)
    """))
    stamps: list[float] = []

    def listener(metric: TrialJobMetric) -> None:
        stamps.append(time.perf_counter())

    async with create_training_service(_config(workdir, f"{PY} {script}")) as ts:
        ts.add_trial_job_metric_listener(listener)
        job = await ts.submit_trial_job(_form(0))
        await _wait_end(ts, job.id)
        status = (await ts.get_trial_job(job.id)).status
    if status != TrialJobStatus.SUCCEEDED or len(stamps) != n:
        raise RuntimeError(f"throughput trial ended {status} with {len(stamps)}/{n} metrics")
    return (n - 1) / (stamps[-1] - stamps[0])


class _BareHub(pb_grpc.AgentHubServicer):
    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.done = asyncio.Event()

    async def Connect(self, request_iterator, context):  # noqa: N802
        async for msg in request_iterator:
            for rec in msg.records.records:
                self.stamps.append(time.perf_counter())
                _ = rec.metric.data
            yield pb.ManagerMessage(ack=pb.Ack(seq=msg.records.records[-1].seq))
        self.done.set()


BARE_CLIENT = """
import json, sys, grpc
from nni_agent.v1 import agent_pb2 as pb
n, port, batch = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def messages():
    for start in range(0, n, batch):
        recs = []
        for i in range(start, min(n, start + batch)):
            data = json.dumps({"parameter_id": 0, "trial_job_id": "bare0", "type": "PERIODICAL",
                               "sequence": i, "value": json.dumps(i)})
            recs.append(pb.Record(seq=i + 1, metric=pb.Metric(trial_id="bare0", trial_seq=i + 1, data=data)))
        yield pb.AgentMessage(records=pb.RecordBatch(records=recs))
with grpc.insecure_channel("127.0.0.1:" + port, options=[("grpc.enable_http_proxy", 0)]) as ch:
    call = ch.stream_stream("/nni_agent.v1.AgentHub/Connect", request_serializer=pb.AgentMessage.SerializeToString,
                            response_deserializer=pb.ManagerMessage.FromString)
    for _ in call(messages()):
        pass
"""


async def bare_throughput(n: int) -> float:
    hub = _BareHub()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_AgentHubServicer_to_server(hub, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        proc = await asyncio.to_thread(subprocess.run, [PY, "-c", BARE_CLIENT, str(n), str(port), str(BATCH)], check=True)
        del proc
    finally:
        await server.stop(grace=1)
    if len(hub.stamps) != n:
        raise RuntimeError(f"bare stream delivered {len(hub.stamps)}/{n}")
    return (n - 1) / (hub.stamps[-1] - hub.stamps[0])


# ---------------------------------------------------------------- 2. start overhead

FIRST_LINE = "import time, os; open(os.environ.get('STAMP_FILE') or os.path.join(os.environ['NNI_SYS_DIR'], 'stamp'), 'w').write(repr(time.time()))"


async def ours_start(workdir: Path, runs: int) -> list[float]:
    command = f"{PY} -c \"{FIRST_LINE}\""
    delays = []
    async with create_training_service(_config(workdir, command)) as ts:
        for i in range(runs + 2):  # two warm-up runs
            t0 = time.time()
            job = await ts.submit_trial_job(_form(i))
            await _wait_end(ts, job.id)
            detail = await ts.get_trial_job(job.id)
            stamp = float((Path(detail.working_directory) / "stamp").read_text())
            if i >= 2:
                delays.append(stamp - t0)
    return delays


LAUNCHER = """
import os, subprocess, sys, time
command, stamp, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = dict(os.environ, STAMP_FILE=stamp)
for _ in range(runs):
    t0 = time.time()
    subprocess.Popen(command, shell=True, env=env).wait()
    print(float(open(stamp).read()) - t0, flush=True)
"""


def popen_start(workdir: Path, runs: int) -> list[float]:
    """The floor: a lean launcher process (not this big one) doing Popen + wait."""
    command = f"{PY} -c \"{FIRST_LINE}\""
    out = subprocess.run([PY, "-c", LAUNCHER, command, str(workdir / "popen-stamp"), str(runs + 2)],
                         check=True, capture_output=True, text=True).stdout
    return [float(x) for x in out.split()][2:]


# ---------------------------------------------------------------- 3. idle agent


FLOOR_PROCESS = "import grpc, time; from nni_agent.v1 import agent_pb2; time.sleep(60)"


def idle_floor() -> float:
    """RSS (MB) of a bare Python that has only imported grpcio and the wire contract."""
    proc = subprocess.Popen([PY, "-c", FLOOR_PROCESS])
    try:
        time.sleep(3)
        return psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        proc.kill()
        proc.wait()


async def idle_agent(workdir: Path, seconds: float) -> tuple[float, float]:
    async with create_training_service(_config(workdir, "true")) as ts:
        deadline = time.monotonic() + 30
        while not any(a.get("connected") for a in ts.agents()):
            if time.monotonic() > deadline:
                raise RuntimeError("agent never connected")
            await asyncio.sleep(0.05)
        agents = [p for p in psutil.Process().children(recursive=True) if "nni_agent" in " ".join(p.cmdline())]
        agent = agents[0]
        await asyncio.sleep(2)  # settle after start-up
        cpu0 = sum(agent.cpu_times()[:2])
        await asyncio.sleep(seconds)
        cpu = (sum(agent.cpu_times()[:2]) - cpu0) / seconds * 100
        rss = agent.memory_info().rss / 2**20
    return rss, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=int, default=100_000)  # a trial's burst (metric_check)
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--idle", type=float, default=10.0, help="idle window in seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        root = Path(tmp)
        for name in ("tp", "start", "idle"):
            (root / name).mkdir()
        bare = asyncio.run(bare_throughput(args.metrics))
        ours = asyncio.run(ours_throughput(root / "tp", args.metrics))
        print(f"metric throughput ({args.metrics} records, batches of {BATCH}):")
        print(f"  bare gRPC stream     {bare:10,.0f} records/s")
        print(f"  trial -> listener    {ours:10,.0f} records/s   ratio ours/bare {ours / bare:.2f}"
              f"   target >= 20,000/s: {'met' if ours >= 20_000 else 'MISSED'}")
        floor = popen_start(root / "start", args.starts)
        mine = asyncio.run(ours_start(root / "start", args.starts))
        added = statistics.median(mine) - statistics.median(floor)
        print(f"start to first line of Python (median of {args.starts}):")
        print(f"  subprocess.Popen     {statistics.median(floor) * 1000:8.1f} ms")
        print(f"  submit_trial_job     {statistics.median(mine) * 1000:8.1f} ms   added {added * 1000:.1f} ms"
              f"   target <= 10 ms: {'met' if added <= 0.010 else 'MISSED'}")
        rss, cpu = asyncio.run(idle_agent(root / "idle", args.idle))
        floor_rss = idle_floor()
        print(f"idle agent over {args.idle:.0f} s:")
        print(f"  RSS {rss:6.1f} MB   floor (python + grpcio + protobuf imported) {floor_rss:.1f} MB, "
              f"ratio {rss / floor_rss:.2f}   target <= 40 MB: {'met' if rss <= 40 else 'MISSED'}")
        print(f"  CPU {cpu:6.2f} %    target <= 0.5 %: {'met' if cpu <= 0.5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
