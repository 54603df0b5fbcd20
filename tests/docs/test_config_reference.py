"""docs/reference/config.md must be what scripts/gen_config_reference.py makes from the parser."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "config.md"


def test_config_reference_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_config_reference.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is current" in result.stdout


def test_config_reference_lists_every_platforms_fields():
    """Spot checks from each backend's parser: a field, its v1 name and its default."""
    page = PAGE.read_text()
    for row in ("| `trialConcurrency` |  | integer >= 1 | **required** | all |",
                "| `host` | `ip` | string | **required** | remote |",
                "| `nodes` | `nodeCount` | integer >= 1 | `1` | slurm |",
                "| `operator` |  | one of `tf-operator`, `pytorch-operator`, `trainer` | **required** | kubeflow |",
                "| `trainingRuntime` |  | string | `torch-distributed` | kubeflow |",
                "| `subscriptionId` |  | string | **required** | aml |",
                "| `dashboard` |  | string | **required** | dlts |",
                "| `username` | `userName` | string | **required** | openpai |"):
        assert row in page
    assert "local: `30` s" in page and "remote: `600` s" in page  # reconnectWindow: each backend's own default
