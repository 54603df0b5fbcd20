"""`nni-manager logs ID TRIAL --follow` in a terminal (a real pty), on a live trial using NNI's
SDK, which sends the trial's print() to trial.log: the prints show up while the trial runs, the
follow ends with the trial, and control bytes reach the terminal escaped, never acted on."""
from __future__ import annotations

import importlib.util
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.experiment.fixtures import processes_under

NNI_MISSING = "" if importlib.util.find_spec("nni") else "the real nni package is not installed; pip install nni==3.0"
pytestmark = pytest.mark.skipif(bool(NNI_MISSING), reason=NNI_MISSING or "-")
CLI = [sys.executable, "-m", "nni_manager"]

TRIAL = r"""
import os, time
import nni
p = nni.get_next_parameter()
print("first print", p["x"])
print("evil \x1b]0;retitled\x07 \x1b[2J end")
release = os.path.join(os.environ["RELEASE_DIR"], "go")
while not os.path.exists(release):
    time.sleep(0.1)
print("after release")
nni.report_final_result(p["x"])
"""


def _cli(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(home)})


class Pty:
    """A command on a pseudo-terminal, its output read as it comes."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        self.seen = b""

    def read_until(self, needle: bytes, timeout: float = 60.0) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            assert time.monotonic() < deadline, f"{needle!r} never came; seen: {self.seen!r}"
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the other side closed
                    assert needle in self.seen, f"{needle!r} never came; seen: {self.seen!r}"
        return self.seen

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_follow_shows_a_live_nni_trials_prints_escaped(tmp_path: Path) -> None:
    home, code = tmp_path / "home", tmp_path / "code"
    home.mkdir()
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1, "maxTrialNumber": 1,
        "searchSpace": {"x": {"_type": "choice", "_value": [7]}}, "tuner": {"name": "GridSearch"},
        "trainingService": {"platform": "local"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 1}))
    env = {**os.environ, "HOME": str(home), "RELEASE_DIR": str(tmp_path), "TERM": "xterm"}
    started = subprocess.run([*CLI, "run", str(config), "--detach", "--port", "0", "--no-keep-serving"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    exp_id = re.search(r"experiment (\w+) runs in the background", started.stdout).group(1)
    follow = None
    try:
        deadline = time.monotonic() + 120
        while not (running := re.search(r"\b([A-Za-z]\w{4})\b.*RUNNING", _cli(home, "trials", exp_id, cwd=tmp_path).stdout)):
            assert time.monotonic() < deadline, "the trial never started"
            time.sleep(0.3)
        trial_id = running.group(1)
        follow = Pty([*CLI, "logs", exp_id, trial_id, "--follow"], tmp_path, env)
        seen = follow.read_until(b"end")  # printed while the trial waits for its release: live
        assert b"first print 7" in seen
        assert b"\\x1b]0;retitled\\x07" in seen and b"\\x1b[2J" in seen  # shown, escaped
        assert b"\x1b" not in seen and b"\x07" not in seen  # never sent to the terminal as such
        assert follow.proc.poll() is None  # the trial still runs: --follow keeps following
        (tmp_path / "go").touch()
        follow.read_until(b"after release")
        assert follow.proc.wait(timeout=60) == 0  # the trial ended: so does --follow
    finally:
        (tmp_path / "go").touch()
        if follow is not None:
            follow.close()
        _cli(home, "stop", exp_id, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while processes_under(tmp_path):
        assert time.monotonic() < deadline, processes_under(tmp_path)
        time.sleep(0.2)
    piped = _cli(home, "logs", exp_id, trial_id, cwd=tmp_path)  # not a terminal: the bytes as written
    assert "first print 7" in piped.stdout and "\x1b]0;retitled\x07" in piped.stdout
