"""Every experiment config shown on a platform page is one the parser accepts."""
import re
from pathlib import Path

import pytest
import yaml

from nni_manager.loader import load_config

ROOT = Path(__file__).resolve().parents[2]
NNI_FC_TEMPLATE = ROOT / "tests" / "experiment" / "nni_configs" / "examples" / "trials" / "mnist-pytorch" / "fc_template.yml"
PLACEHOLDERS = {"<application token>": "t0ken", "<job token>": "t0ken", "<subscription>": "sub"}


def _examples():
    for page in sorted((ROOT / "docs" / "platforms").glob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)):
            for placeholder, value in PLACEHOLDERS.items():
                block = block.replace(placeholder, value)
            data = yaml.safe_load(block)
            if "trainingService" in data or "trainingServicePlatform" in data:
                yield pytest.param(data, id=f"{page.stem}-{i}")


@pytest.mark.parametrize("data", list(_examples()))
def test_platform_page_config_parses(data, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the examples' ~/.ssh/id_ed25519 must exist
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("key\n")
    (tmp_path / "search_space.json").write_text('{"x": {"_type": "choice", "_value": [1, 2]}}')
    # files the examples name beside their config: NNI's own Framework template (configPath)
    (tmp_path / "fc_template.yml").write_bytes(NNI_FC_TEMPLATE.read_bytes())
    data.setdefault("trialConcurrency", 1)
    if "trial" in data:  # NNI v1 form (DLTS)
        data["trial"]["codeDir"] = str(tmp_path)
    else:
        data.setdefault("trialCommand", "python3 train.py")  # pages that show only trainingService
    config = load_config(data, base_dir=tmp_path)
    ts = config.training_service
    platforms = {s.platform for s in ts.options.services} if ts.platform == "hybrid" else {ts.platform}
    shown = data.get("trainingServicePlatform") or data["trainingService"]
    expected = {shown} if isinstance(shown, str) else {s["platform"] for s in shown} if isinstance(shown, list) \
        else {shown["platform"]}
    assert platforms == expected
