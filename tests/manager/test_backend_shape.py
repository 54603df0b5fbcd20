"""The backend class shape (issue 21): fixed and elastic backends are different classes, so an
elastic-only knob cannot be set on a fixed one; each platform reads its own options once, with a
checked `parse_options` whose result is its `options_type`."""
from __future__ import annotations

from pathlib import Path
import pytest

from nni_manager.backends.base import Backend, ElasticBackend, FixedBackend
from nni_manager.backends.registry import backend_class
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.config.hybrid import HybridOptions
from nni_manager.loader import load_config
from tests.support.experiment.configs import v2

FIXED = ("local", "remote")
ELASTIC = ("slurm", "kubernetes", "kubeflow", "frameworkcontroller", "adl", "openpai", "dlts", "aml", "dlc")
ELASTIC_ONLY = ("provision", "release", "shape", "member_names", "reuse", "build_request", "dry_run_env",
                "single_use_credentials", "stop_job_on_cancel")


@pytest.mark.parametrize("platform", FIXED)
def test_fixed_backends_have_no_elastic_knobs(platform: str) -> None:
    cls = backend_class(platform)
    assert issubclass(cls, FixedBackend) and not issubclass(cls, ElasticBackend) and not cls.elastic
    assert [name for name in ELASTIC_ONLY if hasattr(cls, name)] == []


@pytest.mark.parametrize("platform", ELASTIC)
def test_elastic_backends_are_elastic(platform: str) -> None:
    cls = backend_class(platform)
    assert issubclass(cls, ElasticBackend) and cls.elastic


@pytest.mark.parametrize("platform", FIXED + ELASTIC)
def test_every_platform_reads_its_own_options_type(platform: str) -> None:
    """`parse_options` is the platform's own, and `opts` checks the config holds its
    `options_type`: another platform's options are refused, never read as if they were its own."""
    cls = backend_class(platform)
    assert "parse_options" in vars(cls) and isinstance(cls.options_type, type)
    config = ExperimentConfig(trial_command="true", trial_code_directory=Path("."),
                              training_service=TrainingServiceConfig(platform=platform, options=HybridOptions()))
    with pytest.raises(TypeError, match=f"the {platform} options are a HybridOptions, not a {cls.options_type.__name__}"):
        _ = cls(config).opts


def test_the_loader_keeps_what_parse_options_returns(tmp_path: Path) -> None:
    config = load_config(v2(trainingService={"platform": "local"}), base_dir=tmp_path)
    assert config.training_service.options is None and backend_class("local")(config).opts is None


def test_a_backend_with_parse_options_must_say_its_options_type() -> None:
    with pytest.raises(TypeError, match="has parse_options but no options_type"):
        class Mine(Backend[int]):  # noqa: F841
            platform = "mine"

            @classmethod
            def parse_options(cls, section, config) -> int:  # type: ignore[no-untyped-def]
                return 1

            async def start(self, ctx) -> None: ...  # type: ignore[no-untyped-def]

            async def stop(self) -> None: ...


def test_elastic_flag_on_a_plain_backend_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match="derive it from nni_manager.backends.base.ElasticBackend"):
        class Mine(Backend[None]):  # noqa: F841
            platform = "mine"
            elastic = True

            async def start(self, ctx) -> None: ...  # type: ignore[no-untyped-def]

            async def stop(self) -> None: ...
