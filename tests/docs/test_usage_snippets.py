"""The Python snippets of docs/usage.md run as pasted (extracted from the page, not copied)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TRIAL = """
import nni_agent
p = nni_agent.get_next_parameter()
print("trial got", p["x"], flush=True)
nni_agent.report_final_result(p["x"] * 10)
"""


def _block(page: Path, marker: str) -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S) if marker in b]
    assert len(blocks) == 1, f"{page} has {len(blocks)} python blocks with {marker!r}"
    return blocks[0]


def test_create_training_service_snippet_runs_as_pasted(tmp_path: Path) -> None:
    (tmp_path / "snippet.py").write_text(_block(ROOT / "docs" / "usage.md", "create_training_service("))
    (tmp_path / "trial.py").write_text(TRIAL)
    (tmp_path / "config.yml").write_text(yaml.safe_dump({
        "trialCommand": "python trial.py", "trialCodeDirectory": ".", "trialConcurrency": 1,
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "tuner": {"name": "Random"},
        "experimentWorkingDirectory": str(tmp_path / "exps"), "trainingService": {"platform": "local"}}))
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Task was destroyed" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("metric ") and "10" in line for line in lines), proc.stdout
    assert any("SUCCEEDED" in line for line in lines), proc.stdout
    assert "trial got 1" in proc.stdout  # the trial's stdout, fetched from its agent
