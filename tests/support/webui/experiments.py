"""Run a real small experiment (local platform) with `nni-manager run`, as a user does."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.webui.fixtures import CLI, get_json

TRIALS = {
    "curve.py": """
        import nni_agent as nni
        p = nni.get_next_parameter()
        for i in range(5):
            nni.report_intermediate_result({"default": p["x"] * (i + 1) / 5, "loss": 1.0 / (i + 1)})
        nni.report_final_result({"default": p["x"] * 1.0, "loss": 0.1})
        print("trial log line for x =", p["x"])
        if p["x"] == 0:
            raise SystemExit("x must not be 0")
    """,
    "sleepy.py": """
        import time
        import nni_agent as nni
        p = nni.get_next_parameter()
        nni.report_intermediate_result(0)
        print("sleeping", flush=True)
        time.sleep(120)
    """,
}


class RunningExperiment:
    """`nni-manager run --plain --keep-serving --port 0 config.yml` in a subprocess whose HOME
    is private; `url` is the WebUI URL it printed."""

    def __init__(self, tmp: Path, home: Path, script: str, **overrides: Any) -> None:
        code = tmp / "code"
        code.mkdir(exist_ok=True)
        for name, body in TRIALS.items():
            (code / name).write_text(textwrap.dedent(body))
        config = {"trialCommand": f"python {script}", "trialCodeDirectory": "code", "trialConcurrency": 2,
                  "maxTrialNumber": 4, "experimentName": "webui-test",
                  "searchSpace": {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}},
                  "tuner": {"name": "GridSearch"}, "trainingService": {"platform": "local"},
                  "experimentWorkingDirectory": "exps", "trialGracePeriod": 1, **overrides}
        (tmp / "config.yml").write_text(yaml.safe_dump(config))
        self.env = {**os.environ, "HOME": str(home)}
        self.proc = subprocess.Popen([*CLI, "run", "--plain", "--keep-serving", "--port", "0", "config.yml"],
                                     cwd=tmp, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 60
        self.url = ""
        while not self.url:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"nni-manager exited: {self.proc.stderr.read()}"  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "no WebUI URL printed"
                continue
            match = re.match(r"WebUI: (http://127\.0\.0\.1:(\d+)/)$", line.strip())
            if match:
                self.url, self.port = match.group(1), int(match.group(2))
        self.api = self.url + "api/v1/nni"
        self.id = get_json(self.api + "/experiment")["id"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line)
            self.lines.put(line)

    def wait_status(self, *wanted: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while True:
            status = get_json(self.api + "/check-status")["status"]
            if status in wanted:
                return status
            assert time.monotonic() < deadline, f"status stayed {status}, wanted {wanted}"
            time.sleep(0.2)

    def wait_trials(self, predicate: Any, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            jobs = get_json(self.api + "/trial-jobs")
            if predicate(jobs):
                return jobs
            assert time.monotonic() < deadline, f"trials never got there: {jobs}"
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def nnictl(home: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "nnictl"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from nni.tools.nnictl.nnictl import parse_args; parse_args()"]
    return subprocess.run([*cmd, *args], env={**os.environ, "HOME": str(home)}, capture_output=True, text=True,
                          timeout=timeout)
