"""Backends register through the `nni_manager.backends` entry-point group: a third-party
platform is a package of its own, found without any edit to nni-manager."""
from __future__ import annotations

from pathlib import Path

import pytest

from nni_manager.backends import registry
from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from tests.support.manager.helpers import register_backend

PLUGIN = '''
from nni_manager.backends.base import Backend
from nni_manager.config import ConfigError


class ToyBackend(Backend):
    platform = "toy"
    options_type = dict

    @classmethod
    def parse_options(cls, section, config):
        nodes = section.int_("nodes", minimum=1, required=True)
        return {"nodes": nodes}

    async def start(self, ctx):
        for i in range(self.opts["nodes"]):
            ctx.add_agent(f"toy-{i}")

    async def stop(self):
        pass
'''


@pytest.fixture
def toy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(register_backend(tmp_path, "toy-platform", "toy", "toy_platform:ToyBackend",
                                                     PLUGIN)))


def test_builtin_platforms_come_from_entry_points() -> None:
    assert {"local", "remote", "kubernetes", "kubeflow", "frameworkcontroller"} <= set(registry.platforms())


def test_third_party_platform_found_and_its_schema_used(toy_plugin: None, tmp_path: Path) -> None:
    assert "toy" in registry.platforms()
    config = load_config({"trialCommand": "echo", "trialConcurrency": 1,
                          "trainingService": {"platform": "toy", "nodes": 3}}, base_dir=tmp_path)
    assert config.training_service.options == {"nodes": 3}
    with pytest.raises(ConfigError) as info:  # the plugin's own schema: its field, its fix
        load_config({"trialCommand": "echo", "trialConcurrency": 1,
                      "trainingService": {"platform": "toy", "nodes": 0}}, base_dir=tmp_path)
    assert info.value.field == "trainingService.nodes"
    with pytest.raises(ConfigError) as info:
        load_config({"trialCommand": "echo", "trialConcurrency": 1,
                     "trainingService": {"platform": "toy", "nodes": 1, "gpus": 2}}, base_dir=tmp_path)
    assert info.value.field == "trainingService.gpus" and "platform toy" in str(info.value)
