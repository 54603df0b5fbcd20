"""What the REST and Kubernetes emulators' fixtures share: starting one in its own process and
waiting for the port file it writes (atomically) once it listens."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_emulator_process(module: str, state: Path, args: list[str], *, what: str,
                           drop_env: tuple[str, ...] = (), state_flag: str = "--state",
                           timeout: float = 20.0) -> subprocess.Popen[bytes]:
    """`python -m module --state STATE *args`, its output in STATE/emulator.log, without the
    environment variables whose names start with one of `drop_env`; returns once STATE/port exists."""
    env = {k: v for k, v in os.environ.items() if not any(k.startswith(p) for p in drop_env)}
    with open(state / "emulator.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, state_flag, str(state), *args], cwd=str(ROOT),
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while not (state / "port").exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: " + (state / "emulator.log").read_text()[-3000:])
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start: " + (state / "emulator.log").read_text()[-3000:])
        time.sleep(0.01)
    return proc
