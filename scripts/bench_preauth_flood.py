#!/usr/bin/env python3
"""A new agent's trial start time under a pre-authentication flood vs without (issue 31).

A real nni-agent process behind a relay on 127.0.0.1 (the shape of the Kubernetes tunnel: every
agent arrives from loopback), the production hub with the experiment's TLS. `--relay login` (the
default) puts the production login-node relay program (nni_slurm_relay.py: the same relay-token
check as the Kubernetes hub relay) in front, as agents meet it: the agent proves the experiment's
relay token, the flood cannot; `--relay pipe` dials a plain pipe to the hub (what every relay was
before it checked the token: the flood then reaches the hub). Each round kills the
agent, starts a fresh process and submits a trial at once; the time is from the new process's
start to the trial RUNNING. Rounds without and with the flood alternate (blocks of `--rounds`),
the flood being its own process (tests/support/security/flood.py: IDLE silent TCP connections and
CONNECTIONS x STREAMS HTTP/2 streams that never say Hello, re-opened as soon as the hub ends them),
as another pod would be. Target: the flood's median within 2x the quiet one.

    python scripts/bench_preauth_flood.py [--relay login|pipe] [--rounds 3] [--blocks 2] [--idle 400]
                                          [--connections 25] [--streams 16]
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nni_manager.backends.slurm import login as slurm_login  # noqa: E402
from nni_manager.config import ExperimentConfig, TrainingServiceConfig  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from nni_manager.hub.relay_token import relay_digest, relay_token  # noqa: E402
from nni_manager.types import TrialJobStatus  # noqa: E402
from tests.support.chaos.backend import RelayedBackend  # noqa: E402
from tests.support.chaos.relay import ChaosRelay  # noqa: E402
from tests.support.manager.helpers import form, register_backend, until  # noqa: E402

TRIAL = "from nni_agent import get_next_parameter, report_final_result\nget_next_parameter()\nreport_final_result(1)\n"


async def _round(ts, agent_id: str, seq: int) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    RelayedBackend.restart_agent(agent_id)
    job = await ts.submit_trial_job(form(seq))
    await until(lambda: ts.trials.get(job.id).status != TrialJobStatus.WAITING, 300, "the trial to start")
    took = time.monotonic() - start
    await until(lambda: ts.trials.get(job.id).status.is_terminal, 300, "the trial to end")
    status = ts.trials.get(job.id).status
    if status != TrialJobStatus.SUCCEEDED:
        raise RuntimeError(f"trial {job.id} ended {status.value}: {ts.trials.get(job.id).message}")
    return took


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="nbf"))
    sys.path.insert(0, str(register_backend(root / "plugin", "bench-relayed", "relayed",
                                            "tests.support.chaos.backend:RelayedBackend")))
    importlib.invalidate_caches()
    code = root / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    relay = ChaosRelay(0)
    RelayedBackend.relay, RelayedBackend.agents, RelayedBackend.work_root = relay, 1, root / "workers"
    front: subprocess.Popen[bytes] | None = None
    if args.relay == "login":  # the login-node relay in front of the pipe, checking the relay token
        await relay.start()
        target, port_file = root / "relay.target", root / "relay.port"
        target.write_text(f"127.0.0.1:{relay.port}\n")
        script = Path(slurm_login.__file__).with_name(slurm_login.RELAY)
        front = subprocess.Popen([sys.executable, str(script), "127.0.0.1", "0", str(target), str(port_file), "600",
                                  "256", str(root / "relay.limit"), relay_digest(relay_token(root))],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        await until(lambda: port_file.exists() and port_file.read_text().strip(), 30, "the login-node relay")
        RelayedBackend.front = f"127.0.0.1:{int(port_file.read_text())}"
        RelayedBackend.relay_token_file = root / "relay.token"
    cfg = ExperimentConfig(trial_code_directory=code, trial_command=f"{sys.executable} trial.py",
                           trial_grace_period=2.0, experiment_working_directory=root / "exps",
                           training_service=TrainingServiceConfig(platform="relayed", reconnect_window=120.0))
    quiet: list[float] = []
    flooded: list[float] = []
    ended: dict[str, int] = {}
    async with create_training_service(cfg) as ts:
        await until(lambda: ts.agents() and ts.agents()[0]["connected"], 60, "the agent")
        agent_id = ts.agents()[0]["agent_id"]
        ca = root / "hub-ca.crt"
        ca.write_bytes(RelayedBackend.ca_certificate)
        seq = 0
        for _block in range(args.blocks):
            for _ in range(args.rounds):
                quiet.append(await _round(ts, agent_id, seq))
                seq += 1
            flood = subprocess.Popen([sys.executable, "-m", "tests.support.security.flood",
                                      RelayedBackend.front or f"127.0.0.1:{relay.port}",
                                      str(ca), str(args.idle), str(args.connections), str(args.streams)],
                                     cwd=REPO, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            try:
                assert flood.stdout is not None
                line = await asyncio.to_thread(flood.stdout.readline)
                if line.strip() != "flooding":
                    raise RuntimeError("the flood did not start")
                await asyncio.sleep(2.0)  # the flood at full churn
                for _ in range(args.rounds):
                    flooded.append(await _round(ts, agent_id, seq))
                    seq += 1
            finally:
                flood.kill()
                out = flood.communicate(timeout=10)[0]
                for last in reversed(out.splitlines()):
                    if last.startswith("{"):
                        for k, v in json.loads(last).items():
                            ended[k] = ended.get(k, 0) + v
                        break
    await relay.stop()
    if front is not None:
        front.terminate()
        front.wait(10)
    q, f = statistics.median(quiet), statistics.median(flooded)
    print(f"new agent's trial start (agent process start -> trial RUNNING), {len(quiet)} rounds each, "
          f"alternating blocks of {args.rounds}:")
    print(f"  quiet    median {q:6.2f} s   [{', '.join(f'{x:.2f}' for x in quiet)}]")
    print(f"  flooded  median {f:6.2f} s   [{', '.join(f'{x:.2f}' for x in flooded)}]")
    print(f"  ratio flooded/quiet: {f / q:.2f}x (target <= 2x)   relay: {args.relay}; flood: {args.idle} idle "
          f"connections, {args.connections}x{args.streams} silent streams; how they ended: {ended}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--relay", choices=("login", "pipe"), default="login")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--idle", type=int, default=400)
    parser.add_argument("--connections", type=int, default=25)
    parser.add_argument("--streams", type=int, default=16)
    asyncio.run(main(parser.parse_args()))
