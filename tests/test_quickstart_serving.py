"""What scripts/quickstart.sh runs: in a terminal the WebUI stays up after the summary until Ctrl-C;
without one (CI) the run ends by itself. The example itself, cut to 2 trials, in a private HOME."""
from __future__ import annotations

import importlib.util
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# Looked up, not imported: importing scikit-learn costs seconds at every collection, and the trials import it themselves.
if importlib.util.find_spec("sklearn") is None:
    pytest.skip("the quickstart's trials need scikit-learn (pip install '.[test]')", allow_module_level=True)


def _run_line() -> list[str]:
    """The arguments quickstart.sh gives `nni-manager run`, before the user's own ("$@")."""
    line = next(ln for ln in (ROOT / "scripts" / "quickstart.sh").read_text().splitlines() if ln.startswith("exec "))
    words = line.split()
    assert words[1:3] == ["nni-manager", "run"] and words[-1] == '"$@"', line
    return words[3:-1]


@pytest.fixture
def example() -> Iterator[tuple[Path, dict[str, str]]]:
    with tempfile.TemporaryDirectory(prefix="qs-", dir="/tmp") as tmp:  # short: the hub's socket path is bounded
        yield _copy(Path(tmp))


def _copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    code = tmp_path / "examples" / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", code, ignore=shutil.ignore_patterns("nni-experiments"))
    config = yaml.safe_load((code / "config.yml").read_text())
    config["maxTrialNumber"] = 2
    (code / "config.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "home").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # trials' `python`
    return tmp_path, env


def _command() -> list[str]:
    args = _run_line()
    assert not any(a.startswith(("--keep-serving", "--no-keep-serving")) for a in args), \
        "quickstart.sh must leave --keep-serving to the terminal check"
    return [sys.executable, "-m", "nni_manager", "run", *args, "--port", "0"]


def test_in_a_terminal_the_webui_stays_until_ctrl_c(example):
    cwd, env = example
    pid, fd = pty.fork()
    if pid == 0:  # the child: nni-manager on the terminal
        os.chdir(cwd)
        os.execve(sys.executable, _command(), env)
    out = b""
    try:
        deadline = time.monotonic() + 120
        while b"WebUI stays at" not in out:
            assert time.monotonic() < deadline, out[-3000:].decode(errors="replace")
            if select.select([fd], [], [], 1)[0]:
                out += os.read(fd, 65536)
        text = out.decode(errors="replace")
        url = re.search(r"WebUI stays at (http://127\.0\.0\.1:\d+/)", text).group(1)
        assert "WebUI: " + url in text  # printed at the start, too
        time.sleep(1)
        with urllib.request.urlopen(url, timeout=10) as page:  # still served after the summary
            assert page.status == 200 and b"<html" in page.read().lower()
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "it ended without Ctrl-C"
        os.write(fd, b"\x03")  # Ctrl-C, through the terminal
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "Ctrl-C did not end it"
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    pass
        assert os.waitstatus_to_exitcode(status) == 0
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def test_without_a_terminal_the_run_ends_by_itself(example):
    cwd, env = example
    done = subprocess.run(_command(), cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^WebUI: http://127\.0\.0\.1:\d+/", done.stdout, re.M)
    assert "WebUI stays at" not in done.stdout
    assert "Trials: 2 (2 succeeded)" in done.stdout
