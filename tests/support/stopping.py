"""Ending a helper process a test started: SIGTERM, a grace, then SIGKILL, and always reaped."""
from __future__ import annotations

import subprocess
from typing import Any


def terminate(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM `proc` if it still runs, wait `grace` seconds, then SIGKILL; never leaves a zombie."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
