"""How an experiment ended, told apart (issue 32, item 8): `list --all` shows NNI's DONE, STOPPED
or ERROR and the reason for a clean finish, Ctrl-C, a tuner crash and a worker that never started
(whose one line names the fix: is sshd running, the host and port); and in a terminal the summary
prints before the "WebUI stays until Ctrl-C" line. Real `nni-manager` processes; a pty for the
terminal."""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

from tests.support.experiment.fixtures import BUILTIN_TUNERS, processes_under

CLI = [sys.executable, "-m", "nni_manager"]

CRASHING_TUNER = """
    from nni.tuner import Tuner

    class Crash(Tuner):
        def generate_parameters(self, parameter_id, **kwargs):
            raise RuntimeError("the tuner exploded on purpose")

        def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
            pass

        def update_search_space(self, search_space):
            pass
"""


def _config(tmp_path: Path, home: Path, **overrides) -> Path:
    config = {
        "trialCommand": f"{sys.executable} quick.py", "trialCodeDirectory": str(tmp_path / "code"),
        "trialConcurrency": 1, "maxTrialNumber": 2, "trialGracePeriod": 1,
        "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}}, "tuner": {"name": "GridSearch"},
        "trainingService": {"platform": "local"},
        "experimentWorkingDirectory": str(home / "nni-experiments"),  # where `list --all` finds unregistered ones
        **overrides}
    path = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _cli(home: Path, *args: str, cwd: Path, timeout: float = 180, nni: bool = False) -> subprocess.CompletedProcess[str]:
    """nni-manager; with the built-in tuner unless `nni` (NNI's dispatcher: a className tuner)."""
    env = {**os.environ, "HOME": str(home), **({} if nni else BUILTIN_TUNERS)}
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _row(listing: str, exp_id: str) -> str:
    rows = [line for line in listing.splitlines() if line.strip().startswith(exp_id)]
    assert len(rows) == 1, listing
    return " ".join(rows[0].split())


def test_list_all_tells_done_stopped_and_failed_apart(code_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (code_dir / "crash_tuner.py").write_text(textwrap.dedent(CRASHING_TUNER))
    ids: dict[str, str] = {}

    done = _cli(home, "run", str(_config(tmp_path, home)), "--plain", "--no-webui", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ids["done"] = re.search(r"Experiment (\w+) stopped", done.stdout).group(1)

    crash = _cli(home, "run", str(_config(tmp_path, home, tuner={"className": "crash_tuner.Crash",
                                                                  "codeDirectory": str(code_dir)})),
                 "--plain", "--no-webui", cwd=tmp_path, nni=True)
    assert crash.returncode == 1, crash.stderr
    ids["crash"] = re.search(r"Experiment (\w+) stopped", crash.stdout).group(1)

    port = _free_loopback_port()  # nothing listens there: the machine's sshd "is not running"
    machine = {"host": "127.0.0.1", "port": port, "user": "nobody", "password": "x"}  # netns only (loopback)
    unreachable = _cli(home, "run", str(_config(tmp_path, home, trainingService={
        "platform": "remote", "machineList": [machine]})), "--plain", "--no-webui", cwd=tmp_path)
    assert unreachable.returncode == 3, unreachable.stderr
    lines = unreachable.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in unreachable.stderr, unreachable.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "is sshd running" in lines[0] and "host and port" in lines[0], lines[0]
    ids["no-worker"] = re.search(r"Experiment (\w+) stopped", unreachable.stdout).group(1)

    out_file = tmp_path / "interrupted.out"  # a file, not a pipe: no process can hold the test's read open
    with open(out_file, "w") as out_f:
        interrupted = subprocess.Popen([*CLI, "run", str(_config(tmp_path, home, trialCommand=f"{sys.executable} sleepy.py")),
                                        "--plain", "--no-webui"], cwd=tmp_path, stdout=out_f, stderr=subprocess.STDOUT,
                                       text=True, env={**os.environ, "HOME": str(home), **BUILTIN_TUNERS})
    try:
        deadline = time.monotonic() + 120
        while "RUNNING" not in out_file.read_text():  # Ctrl-C once a trial runs
            assert time.monotonic() < deadline and interrupted.poll() is None, out_file.read_text()
            time.sleep(0.2)
        interrupted.send_signal(signal.SIGINT)
        interrupted.wait(timeout=120)
    finally:
        if interrupted.poll() is None:
            interrupted.kill()
    out = out_file.read_text()
    assert interrupted.returncode == 130, out
    ids["ctrl-c"] = re.search(r"Experiment (\w+) stopped", out).group(1)

    listing = _cli(home, "list", "--all", cwd=tmp_path).stdout
    assert re.search(r"DONE .*maxTrialNumber \(2\) reached", _row(listing, ids["done"])), listing
    assert re.search(r"ERROR .*the tuner failed", _row(listing, ids["crash"])), listing
    assert re.search(r"ERROR .*no worker could start", _row(listing, ids["no-worker"])), listing
    assert re.search(r"STOPPED .*stopped by the user", _row(listing, ids["ctrl-c"])), listing
    assert processes_under(tmp_path) == []


def test_terminal_summary_comes_before_the_webui_stays_line(code_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = _config(tmp_path, home)
    master, slave = pty.openpty()
    proc = subprocess.Popen([*CLI, "run", str(config), "--port", "0"], cwd=tmp_path, stdin=slave, stdout=slave,
                            stderr=slave, env={**os.environ, "HOME": str(home), "COLUMNS": "200", **BUILTIN_TUNERS},
                            close_fds=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while b"WebUI stays" not in seen or not seen.rstrip().endswith(b")"):
            assert time.monotonic() < deadline and proc.poll() is None, seen.decode(errors="replace")
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 65536)
        text = seen.decode(errors="replace")
        stays = text.index("WebUI stays")
        assert "Best trial" in text[:stays] and "Results:" in text[:stays], text  # before Ctrl-C is needed
        proc.send_signal(signal.SIGINT)  # the WebUI ends; the summary is not repeated
        proc.wait(timeout=60)
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 0, seen.decode(errors="replace")
    assert seen.decode(errors="replace").count("Best trial") == 1
