"""Hybrid mode's bookkeeping with several cluster platforms (no cluster needed): which platform
makes an environment (the one a trial's placementConstraint names, else round robin), which
environments a pinned trial may use, whose agents they are, and the hub every part can reach."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nni_manager.loader import load_config
from nni_manager.service.hybrid import HybridBackend, make_backend
from nni_manager.types import TrialJobDetail, TrialJobStatus
from tests.support.manager.helpers import form

AML = {"platform": "aml", "subscriptionId": "s", "resourceGroup": "r", "workspaceName": "w", "computeTarget": "c"}
PAI = {"platform": "openpai", "host": "http://127.0.0.1:1", "username": "u", "token": "t", "trialCpuNumber": 1,
       "trialMemorySize": "1gb", "dockerImage": "python:3.11", "storageConfigName": "s"}


def trial(trial_id: str, host: str | None = None) -> TrialJobDetail:
    f = form(0)
    if host is not None:
        f.placement_constraint = {"type": "Device", "gpus": [[host, 0]]}
    return TrialJobDetail(id=trial_id, status=TrialJobStatus.WAITING, submit_time=0, form=f, sequence_id=0)


def backend(tmp_path: Path) -> HybridBackend:
    cfg = load_config({"trialCommand": "python3 t.py", "trialCodeDirectory": str(tmp_path), "trialConcurrency": 4,
                       "nniManagerIp": "127.0.0.1", "trainingService": [{"platform": "local"}, AML, PAI]})
    b = make_backend(cfg)
    assert isinstance(b, HybridBackend)
    return b


def test_a_pinned_trial_gets_its_platform_and_only_its_environments(tmp_path: Path) -> None:
    b = backend(tmp_path)
    assert b.mixed and b.elastic and [p.platform for p in b.elastic_parts] == ["aml", "openpai"]
    assert b.hub == "network" and "127.0.0.1" not in b.hub_names()  # local is on the Unix socket: no tunnel
    on_pai, on_aml, anywhere = trial("a", "openpai"), trial("b", "aml"), trial("c")
    assert b.pinned_part(on_pai).platform == "openpai" and b.pinned_part(anywhere) is None
    assert b.pinned_part(trial("d", "local")) is None  # a machine: placement on machines decides
    assert b.environment_backend("env1", on_pai).platform == "openpai"
    assert b.environment_backend("env2", on_aml).platform == "aml"
    assert b.environment_backend("env1").platform == "openpai"  # remembered
    assert b.environment_fits("env1", on_pai) and not b.environment_fits("env2", on_pai)
    assert b.environment_fits("env1", anywhere) and b.environment_fits("env2", anywhere)
    made = {b.environment_backend(f"env{i}", anywhere).platform for i in range(3, 7)}
    assert made == {"aml", "openpai"}  # unpinned: round robin


def test_environment_members_belong_to_their_platform(tmp_path: Path) -> None:
    b = backend(tmp_path)
    b.environment_backend("env1", trial("a", "aml"))
    names = b.member_names("env1")
    assert names and all(b.agent_platform(n) == "aml" for n, _, _ in names)
    assert b.part_of(names[0][0]).platform == "aml"
    assert b.agent_platform("unknown") == "hybrid"


def test_trial_concurrency_raised_reaches_every_parts_config(tmp_path: Path) -> None:
    """Each part holds its own copy of the config: a trialConcurrency raised from the WebUI
    (TrainingService.set_trial_concurrency) reaches every copy, and each started part is told."""
    b = backend(tmp_path)
    told: list[str] = []

    async def heard(part: Any) -> None:
        told.append(part.platform)

    for part in b.parts:
        part.trial_concurrency_changed = lambda part=part: heard(part)  # type: ignore[method-assign]
    b._started = list(b.parts)  # as start() leaves it
    b.config.trial_concurrency = 9
    asyncio.run(b.trial_concurrency_changed())
    assert [p.config.trial_concurrency for p in b.parts] == [9, 9, 9] and b.config.trial_concurrency == 9
    assert told == ["local", "aml", "openpai"]


def test_what_the_list_implies_is_its_class_not_instance_overrides(tmp_path: Path) -> None:
    """The hybrid backend's ClassVars (hub, ships_code, elastic, single_use_credentials) are set
    on a class made for its list of services, never overwritten on the instance."""
    b = backend(tmp_path)
    assert not {"hub", "ships_code", "elastic", "single_use_credentials"} & set(vars(b))
    assert (type(b).hub, type(b).elastic, type(b).single_use_credentials) == ("network", True, True)
    assert type(b) is not HybridBackend and issubclass(type(b), HybridBackend)
    with pytest.raises(TypeError, match="composed"):
        HybridBackend(b.config, [type(p) for p in b.parts])
