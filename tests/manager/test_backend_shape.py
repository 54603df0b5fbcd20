"""The backend class shape (issue 21): fixed and elastic backends are different classes, so an
elastic-only knob cannot be set on a fixed one; each platform declares its options parser once."""
from __future__ import annotations

import pytest

from nni_manager.backends.base import Backend, ElasticBackend, FixedBackend
from nni_manager.backends.registry import backend_class

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
def test_elastic_backends_declare_their_options_parser(platform: str) -> None:
    cls = backend_class(platform)
    assert issubclass(cls, ElasticBackend) and cls.elastic
    assert cls.options_parser is not None  # its own fields, parsed by the one base parse_config
    assert "parse_config" not in vars(cls)


def test_elastic_flag_on_a_plain_backend_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match="derive it from nni_manager.backends.base.ElasticBackend"):
        class Mine(Backend[None]):  # noqa: F841
            platform = "mine"
            elastic = True

            async def start(self, ctx) -> None: ...  # type: ignore[no-untyped-def]

            async def stop(self) -> None: ...
