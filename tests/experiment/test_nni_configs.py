"""A sweep over NNI's own experiment configs (copies in nni_configs/, see its README): every config
whose platform and features exist here loads; every other one is refused naming the reason."""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.config import ConfigError, load_config

SOURCE = Path(__file__).parent / "nni_configs"
TEMPLATES = {"examples/trials/mnist-pytorch/fc_template.yml"}  # a config's FrameworkController template (configPath)
CONFIGS = sorted(str(p.relative_to(SOURCE)) for p in SOURCE.rglob("*.yml") if str(p.relative_to(SOURCE)) not in TEMPLATES)

# config -> the words its refusal must contain (features or platforms not here)
REFUSED = {
    "examples/trials/mnist-pytorch/config_dlc.yml": "'dlc' (Alibaba DLC) is not implemented",
    # NNI's own error: email/password/team come from DLTS's job variables when not in dltsConfig
    "examples/trials/mnist-tfv1/config_dlts.yml": "`email` field in `dltsConfig` is not configured.",
    "examples/trials/mnist-pytorch/config_adl.yml": "adl",
    "examples/trials/mnist-pytorch/config_hybrid.yml": "hybrid mode",
    "examples/trials/mnist-sharedstorage/config_nfs.yml": "sharedStorage",
    # `password: 12345` unquoted is a YAML integer; NNI's typeguard check refuses it too
    "examples/trials/mnist-pytorch/config_remote.yml": "machineList[1].password`: must be a non-empty string",
    "examples/trials/mnist-tfv2/config_remote.yml": "machineList[1].password`: must be a non-empty string",
    # NNI annotations rewrite the trial code with nni's annotation tool before a run
    "test/training_service/config/tuners/anneal.yml": "useAnnotation",
    "test/training_service/config/tuners/evolution.yml": "useAnnotation",
    "test/training_service/config/tuners/random.yml": "useAnnotation",
    "test/training_service/config/tuners/smac.yml": "useAnnotation",
    "test/training_service/config/tuners/tpe.yml": "useAnnotation",
}

_PLACEHOLDER = re.compile(r"\$?\{(your|replace)[a-z_]*\}")


def _prepare(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy as a user would have it: placeholders filled in, code folders and SSH key present."""
    shutil.copytree(SOURCE, tmp_path / "c")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("not a real key: the config is only loaded\n")
    monkeypatch.setenv("HOME", str(home))
    for var in ("DLWS_USER_EMAIL", "DLTS_JOB_TOKEN", "DLWS_VC_NAME"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "c" / name
    text = _PLACEHOLDER.sub("10.0.0.1", path.read_text())  # not dialed: data only
    path.write_text(text)

    def make_dirs(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("trialCodeDirectory", "codeDir", "codeDirectory") and isinstance(value, str):
                    (path.parent / value).expanduser().mkdir(parents=True, exist_ok=True)
                else:
                    make_dirs(value)
        elif isinstance(node, list):
            for item in node:
                make_dirs(item)

    make_dirs(yaml.safe_load(text))
    return path


def test_the_sample_is_representative() -> None:
    assert len(CONFIGS) >= 45
    text = "\n".join((SOURCE / c).read_text() for c in CONFIGS)
    for words in ("TPE", "Medianstop", "Curvefitting", "Hyperband", "BOHB", "className", "builtinTunerName",
                  "platform: remote", "kubeflow", "frameworkcontroller"):
        assert words in text, words


@pytest.mark.parametrize("name", CONFIGS)
def test_nni_config(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _prepare(tmp_path, name, monkeypatch)
    if name in REFUSED:
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert REFUSED[name] in str(info.value)
        return
    config = load_config(path)
    assert config.tuner is not None and (config.tuner.name or config.tuner.class_name)
    assert config.search_space
    assert config.trial_concurrency >= 1
