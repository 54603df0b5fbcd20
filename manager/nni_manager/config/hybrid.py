"""NNI's hybrid mode in the config: `trainingService` as a list of training services.

    trainingService:
      - platform: local
      - platform: remote
        machineList: [{host: gpu-box, user: alice, sshKeyFile: ~/.ssh/id_ed25519}]

NNI v1's spelling (`trainingServicePlatform: hybrid` with `hybridConfig.trainingServicePlatforms`
and the platforms' v1 sections) is accepted too. Each entry is parsed exactly as a
single `trainingService` would be; the result is one TrainingServiceConfig with platform
"hybrid" whose `options` lists them (service/hybrid.py runs one backend per entry).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nni_manager.config.model import TrainingServiceConfig
from nni_manager.config.section import MISSING, ConfigError, ConfigSection, canonical_key

HYBRID = "hybrid"
# v1 platform sections and which platform each configures (their key renames are the loader's, nni_manager.loader).
_V1_SECTION_PLATFORM = {
    "localConfig": "local", "remoteConfig": "remote", "paiConfig": "openpai", "kubeflowConfig": "kubeflow",
    "frameworkcontrollerConfig": "frameworkcontroller", "dltsConfig": "dlts", "amlConfig": "aml",
}


@dataclass
class HybridOptions:
    """`options` of the hybrid TrainingServiceConfig: one parsed config per listed service."""

    services: list[TrainingServiceConfig] = field(default_factory=list)


def sections(value: list[object], path: str, base: Path) -> list[ConfigSection]:
    if not value:
        raise ConfigError(path, "is an empty list", "list at least one training service, e.g. `- platform: local`")
    return [ConfigSection(v, f"{path}[{i}]", base) for i, v in enumerate(value)]


def _peek(section: ConfigSection, name: str) -> object:
    wanted = canonical_key(name)
    return next((v for k, v in section.data.items() if canonical_key(k) == wanted), None)


def v1_sections(root: ConfigSection, v1_renames: dict[str, dict[str, str]],
                v1_names: dict[str, str]) -> list[ConfigSection] | None:
    """NNI v1 hybrid (`trainingServicePlatform: hybrid`) as the v2 list; None for other configs."""
    if _peek(root, "trainingServicePlatform") != HYBRID:
        return None
    root.take("trainingServicePlatform")
    hybrid = root.section("hybridConfig")
    if hybrid is None:
        raise ConfigError("hybridConfig", "is required with trainingServicePlatform: hybrid",
                          "add `hybridConfig: {trainingServicePlatforms: [local, remote]}`")
    names, names_path = hybrid.take("trainingServicePlatforms")
    hybrid.finish()
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(names_path, "must list the platforms to combine", "write e.g. `trainingServicePlatforms: [local, remote]`")
    elements: list[dict[str, object]] = [{"platform": v1_names.get(n, n)} for n in names]
    by_platform = {e["platform"]: e for e in elements}
    for section_name, platform in _V1_SECTION_PLATFORM.items():
        v1 = root.section(section_name)
        if v1 is None:
            continue
        target = by_platform.get(platform)
        if target is None:
            raise ConfigError(section_name, f"configures {platform}, which hybridConfig.trainingServicePlatforms "
                              "does not list", f"add {platform} there, or remove {section_name}")
        renames = v1_renames.get(section_name, {})
        for key, value in v1.rest().items():
            target.setdefault(renames.get(key, key), value)
    machines, machines_path = root.take("machineList")
    if machines is not MISSING:
        if "remote" not in by_platform:
            raise ConfigError(machines_path, "is for the remote platform, which hybridConfig.trainingServicePlatforms "
                              "does not list", "add remote there, or remove machineList")
        by_platform["remote"].setdefault("machineList", machines)
    return [ConfigSection(e, f"hybridConfig.trainingServicePlatforms[{i}]", root.base) for i, e in enumerate(elements)]


def hoist_shortcuts(root: ConfigSection, elements: list[ConfigSection], names: tuple[str, ...]) -> None:
    """NNI's canonical form (`ExperimentConfig.json()`) repeats trialCommand, trialCodeDirectory,
    trialGpuNumber and nniManagerIp inside every training service. One trial command runs on
    every machine here, so the copies must agree; they move to the top level."""
    for name in names:
        key = canonical_key(name)
        at_root = [k for k in root.data if canonical_key(k) == key]
        seen: tuple[object, str] | None = (root.data[at_root[0]], root.at(at_root[0])) if at_root else None
        for element in elements:
            for k in [k for k in element.data if canonical_key(k) == key]:
                value = element.data.pop(k)
                if value is None:
                    continue
                if seen is None:
                    root.data[name] = value
                    seen = (value, element.at(k))
                elif value != seen[0]:
                    raise ConfigError(element.at(k), f"differs from `{seen[1]}` ({seen[0]!r})",
                                      f"set {name} once at the top level: every training service of a hybrid "
                                      "experiment runs the same trials")


def parse(elements: list[ConfigSection], parse_one: Callable[[ConfigSection], TrainingServiceConfig],
          nni_manager_ip: str | None) -> TrainingServiceConfig:
    """Each entry parsed as a single trainingService; one entry is just that service."""

    services: list[TrainingServiceConfig] = []
    for element in elements:
        ts = parse_one(element)
        if any(s.platform == ts.platform for s in services):
            raise ConfigError(element.at("platform"), f"{ts.platform} is listed twice",
                              "list each platform once (several SSH machines go in one remote machineList)")
        services.append(ts)
    if len(services) == 1:
        return services[0]
    return TrainingServiceConfig(platform=HYBRID, nni_manager_ip=nni_manager_ip, options=HybridOptions(services))
