"""A hub handler that records hellos and revocations, and a real agent process dialling a TLS hub."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from nni_agent.v1 import agent_pb2 as pb


TOKEN = "tls-token-0123456789"


class Recorder:
    def __init__(self, exp_dir: Path) -> None:
        self.exp_dir = exp_dir
        self.hellos: list[str] = []
        self.revoked: list[tuple[str, str]] = []
        self.job_runs: bool | None = None  # what the platform says of the agent's job (enrolment_open)

    def agent_hello(self, agent_id: str, hello: pb.Hello, restarted: bool) -> None:
        self.hellos.append(agent_id)

    def apply_records(self, agent_id: str, boot_id: str, last_seq: int, records: list[pb.Record]) -> None:
        pass

    def telemetry(self, agent_id: str, report: Any) -> None:
        pass

    def agent_lost(self, agent_id: str, since: float) -> None:
        pass

    def agent_back(self, agent_id: str) -> None:
        pass

    def agent_expired(self, agent_id: str) -> None:
        pass

    def enrolment_open(self, agent_id: str) -> bool | None:
        return self.job_runs

    def agent_revoked(self, agent_id: str, reason: str) -> None:
        self.revoked.append((agent_id, reason))

    def log_file(self, agent_id: str, trial_id: str, stream: int) -> Path:
        return self.exp_dir / "trials" / trial_id / "trial.stdout"


def agent(work: Path, address: str, *args: str, token: str = TOKEN) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "nni_agent", "--manager", address, "--agent-id", "a1", "--work-dir", str(work),
         "--log-file", str(work / "agent.log"), *args],
        env=dict(os.environ, NNI_AGENT_TOKEN=token), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
