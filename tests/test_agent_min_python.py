"""The agent runs on Python 3.8 (workers keep old interpreters: Ubuntu 20.04, `msranni/nni:latest`).

Statically: vermin finds no construct newer than the agent's minimum in `agent/` or in the
stdlib-only script the remote backend runs on workers. At run time, tests/test_dependency_range.py
runs the agent and a trial under the oldest Python this machine has."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nni_agent.compat import MIN_PYTHON, MIN_PYTHON_TEXT

ROOT = Path(__file__).resolve().parent.parent
CHECKED = [ROOT / "agent" / "nni_agent", ROOT / "manager" / "nni_manager" / "backends" / "remote" / "worker_install.py"]


def test_no_construct_newer_than_the_minimum() -> None:
    vermin = str(Path(sys.executable).with_name("vermin"))
    out = subprocess.run([vermin, f"--target={MIN_PYTHON_TEXT}-", "--no-tips", "--violations",
                          "--no-parse-comments", *map(str, CHECKED)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Minimum required versions" in out.stdout  # it did analyse the files


def test_the_minimum_is_one_place() -> None:
    """The boot step (nni_agent/boot.py) holds the agent's minimum; compat re-exports it, every
    backend's command line runs that boot step, and the wheel says it too."""
    import tempfile
    import zipfile

    import nni_agent.boot
    from nni_manager.backends.agent_command import AgentCommand
    from nni_manager.backends.agent_wheel import build_agent_wheel

    assert MIN_PYTHON is nni_agent.boot.MIN_PYTHON
    assert f">= {MIN_PYTHON_TEXT}" in AgentCommand(agent_id="a").find_python()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_agent_wheel(Path(tmp))
        with zipfile.ZipFile(wheel.path) as zf:
            meta = next(zf.read(n).decode() for n in zf.namelist() if n.endswith("METADATA"))
    assert f"Requires-Python: >={MIN_PYTHON_TEXT}" in meta
