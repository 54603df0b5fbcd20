"""The summary's `nni-manager ...` hint works as printed in a new shell, where the quickstart's
.venv is neither activated nor on PATH."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_summary_hint_runs_in_a_fresh_shell(make_config, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}  # as scripts/quickstart.sh runs it
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    done = subprocess.run([sys.executable, "-m", "nni_manager", "run", str(make_config(maxTrialNumber=1)), "--plain",
                           "--no-webui"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    hint = re.search(r"^Results: \S+\s+\((.+) trials (\S+); ", done.stdout, re.M)
    assert hint is not None, done.stdout
    command = f"{hint.group(1)} trials {hint.group(2)}"
    fresh = subprocess.run(["env", "-i", f"HOME={home}", "PATH=/usr/local/bin:/usr/bin:/bin", "bash", "-c", command],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0 and "SUCCEEDED" in fresh.stdout, (command, fresh.stdout, fresh.stderr)
