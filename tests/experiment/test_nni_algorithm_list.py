"""NNI's algorithm names are checked from NNI's own lists read as files, without importing `nni`
(2.7 s of CPU for scipy and pandas on every start and dry run): the lists must be exactly what NNI's
config_manager returns, registered algorithms included, and a check that needs no classArgs
validator must not import nni."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nni_manager.config import ConfigError, TunerConfig
from nni_manager.dispatcher.algorithms import algo_metas, check_nni_algorithm
from nni_manager.loader import load_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nni") is None, reason="needs the real `nni` package")

REGISTERED = {"tuners": [{"builtinName": "MyTuner", "className": "my_tuners.MyTuner", "classArgsValidator":
                          "my_tuners.MyValidator", "alias": "Mine"}],
              "assessors": [{"builtinName": "MyAssessor", "className": "my_tuners.MyAssessor"}],
              "advisors": [{"builtinName": "TPE", "className": "old.TPE", "source": "nni"}]}  # NNI <= 2.5's copy


def _tuner(tmp_path: Path, tuner: dict[str, object]) -> TunerConfig:
    config = load_config({"trialCommand": "python t.py", "trialCodeDirectory": str(tmp_path), "searchSpace": {},
                        "trialConcurrency": 1, "tuner": tuner, "trainingService": {"platform": "local"}}, base_dir=tmp_path)
    assert config.tuner is not None
    return config.tuner


@pytest.mark.system
def test_the_lists_are_nnis_own_with_registered_algorithms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nni's config_manager (in a child: importing nni here would hide the next test's point)."""
    (tmp_path / "registered_algorithms.yml").write_text(yaml.safe_dump(REGISTERED))
    env = {**os.environ, "NNI_CONFIG_DIR": str(tmp_path)}
    code = ("import json; from nni.tools.package_utils import config_manager as c; print(json.dumps("
            "[[m.name, m.alias, m.class_name, m.validator_class_name, m.algo_type] for m in c.get_all_algo_meta()]))")
    nnis = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True, timeout=120).stdout)
    monkeypatch.setenv("NNI_CONFIG_DIR", str(tmp_path))
    ours = [[m.name, m.alias, m.class_name, m.validator_class_name, m.algo_type] for m in algo_metas()]
    assert ours == nnis
    assert ["MyTuner", "Mine", "my_tuners.MyTuner", "my_tuners.MyValidator", "tuner"] in ours
    assert sum(m[0] == "TPE" for m in ours) == 1  # the NNI <= 2.5 copy of a built-in is not listed twice


def test_a_registered_name_or_alias_passes_and_a_misspelling_names_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNI_CONFIG_DIR", str(tmp_path))
    (tmp_path / "registered_algorithms.yml").write_text(yaml.safe_dump(REGISTERED))
    for name in ("MyTuner", "mine"):
        check_nni_algorithm(_tuner(tmp_path, {"name": name}), "tuner")
    with pytest.raises(ConfigError, match="did you mean `MyTuner`"):
        check_nni_algorithm(_tuner(tmp_path, {"name": "MyTunr"}), "tuner")
    with pytest.raises(ConfigError, match="'MyAssessor' is an assessor, not a tuner"):
        check_nni_algorithm(_tuner(tmp_path, {"name": "MyAssessor"}), "tuner")


@pytest.mark.system
def test_checking_a_name_without_class_args_does_not_import_nni(tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; from nni_manager.loader import load_config; "
            "from nni_manager.dispatcher import check_algorithms; "
            f"p = Path({str(tmp_path)!r}); "
            "c = load_config({'trialCommand': 'python t.py', 'trialCodeDirectory': str(p), 'searchSpace': {}, "
            "'trialConcurrency': 1, "
            "'tuner': {'name': 'GridSearch'}, 'assessor': {'name': 'Medianstop'}, "
            "'trainingService': {'platform': 'local'}}, base_dir=p); "
            "check_algorithms(c); print('nni' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "NNI_MANAGER_BUILTIN_TUNERS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
