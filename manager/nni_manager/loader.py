"""`load_config`: an NNI experiment config (v2 YAML, v1 field names accepted) -> a typed,
validated `ExperimentConfig`.

Every mistake raises `ConfigError` naming the field (as a dotted path, e.g.
`trainingService.machineList[1].host`) and the fix. The loader sits above what it calls: the
backends (each parses its platform's fields, found through `backends.registry`), the
search-space checks and annotations. They, hybrid mode (`config.hybrid`) and shared storage
(`config.shared_storage`) use only the `nni_manager.config` package below them, which never
imports the loader (tests/test_import_cycles.py).
"""
from __future__ import annotations

import ipaddress
import re
import signal
from pathlib import Path
from typing import Any, cast

from nni_manager.types import SearchSpace
from nni_manager.annotations import search_space as annotated_search_space
from nni_manager.backends import registry
from nni_manager.config import hybrid as config_hybrid
from nni_manager.config import shared_storage
from nni_manager.config.model import LOG_LEVELS, ExperimentConfig, TrainingServiceConfig, TunerConfig
from nni_manager.config.section import (
    _MISSING,
    MISSING,
    ConfigError,
    ConfigSection,
    _load_yaml,
    _type_name,
    canonical_key,
    check_per_gpu,
)
from nni_manager.search_space import validate

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# v1 platform sections -> renames of their keys (their fields join trainingService).
_V1_PLATFORM_SECTIONS: dict[str, dict[str, str]] = {
    "localConfig": {"maxTrialNumPerGpu": "maxTrialNumberPerGpu"},
    "remoteConfig": {"reuse": "reuseMode"},
    "paiConfig": {"userName": "username", "reuse": "reuseMode"},
    "kubeflowConfig": {},
    "frameworkcontrollerConfig": {},
    "dltsConfig": {},
    "amlConfig": {"maxTrialNumPerGpu": "maxTrialNumberPerGpu"},
}
_V1_PLATFORM_NAMES = {"pai": "openpai"}  # v1 `trainingServicePlatform` names that v2 renamed
_SHORTCUTS = ("trialCommand", "trialCodeDirectory", "trialGpuNumber", "nniManagerIp", "debug")
_TS_COMMON = ("platform", "useActiveGpu", "maxTrialNumberPerGpu", "gpuIndices", "machineList")


def load_config(source: Any, *, base_dir: Path | None = None) -> ExperimentConfig:
    """Parse an NNI experiment config: a YAML file path, an already-loaded mapping, or a config
    object built with NNI's Python API (`nni.experiment.ExperimentConfig`).

    Relative paths are relative to the YAML file's directory (NNI's rule), or to
    `base_dir` / the current directory for a mapping.
    """
    if _is_nni_config(source):
        try:  # NNI's own canonical form: validated, paths absolute, shortcuts copied into trainingService
            source = source.json()
        except Exception as exc:  # NNI raises AssertionError / ValueError / TypeError naming the field
            raise ConfigError("(nni.experiment.ExperimentConfig)", f"NNI's validation failed: {exc!r}",
                              "fix the config object as NNI's message says") from None
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError("(file)", f"cannot read {path}: {exc.strerror}", "pass the path of an existing YAML file") from None
        data = _load_yaml(text, str(path))
        base = (base_dir or path.parent).resolve()
    else:
        data = source
        base = (base_dir or Path.cwd()).resolve()
    if data is None:
        raise ConfigError("(root)", "the config is empty", "write at least trialCommand, trialConcurrency and trainingService")
    config = _parse(ConfigSection(data, "", base), base)
    if isinstance(source, (str, Path)):
        config.config_file = Path(source).expanduser().resolve()
    return config


def _is_nni_config(source: object) -> bool:
    """A config object of NNI's Python API (any `nni.experiment.config` ConfigBase)."""
    return any(cls.__module__.startswith("nni.experiment.config") and cls.__name__ == "ConfigBase"
               for cls in type(source).__mro__)


def _parse(root: ConfigSection, base: Path) -> ExperimentConfig:

    trial = root.section("trial")  # v1: trial.command / codeDir / gpuNum (+ k8s roles)
    found = _training_service_section(root)
    hybrid = found if isinstance(found, list) else config_hybrid.v1_sections(root, _V1_PLATFORM_SECTIONS, _V1_PLATFORM_NAMES)
    ts = None if isinstance(found, list) or hybrid is not None else found
    if hybrid is not None:  # hybrid mode: the shared fields move to the top, each service is parsed alone
        config_hybrid.hoist_shortcuts(root, hybrid, _SHORTCUTS)

    def shortcut(name: str, *aliases: str, v1: str = "") -> tuple[ConfigSection, str] | None:
        """A field allowed at the root, inside trainingService, or (v1) inside `trial`."""
        places = [(root, (name, *aliases))]
        if ts is not None:
            places.append((ts, (name,)))
        if trial is not None and v1:
            places.append((trial, (v1,)))
        given = [(s, s.take(*names)) for s, names in places]
        given = [(s, v) for s, v in given if v[0] is not _MISSING]
        # NNI's canonical dict (`ExperimentConfig.json()`) repeats root fields inside trainingService
        given = given[:1] + [g for g in given[1:] if g[1][0] != given[0][1][0]]
        if len(given) > 1:
            raise ConfigError(given[1][1][1], f"also given as `{given[0][1][1]}`", "set it in one place only")
        if not given:
            return None
        section, (value, path) = given[0]
        section.data[path.rsplit(".", 1)[-1]] = value  # let the section's typed reader check it
        return section, path.rsplit(".", 1)[-1]

    def read(kind: str, name: str, *aliases: str, v1: str = "", **kw: Any) -> Any:
        found = shortcut(name, *aliases, v1=v1)
        if found is None:
            return getattr(root, kind)(name, *aliases, **kw) if kw.get("required") else None
        section, key = found
        return getattr(section, kind)(key, **kw)

    trial_command = read("str_", "trialCommand", v1="command")
    if _code_in_image(root, ts):  # a folder inside the image (adl): kept as written, never looked at here
        code_dir = Path(read("str_", "trialCodeDirectory", v1="codeDir") or ".")
    else:
        code_dir = read("path_", "trialCodeDirectory", v1="codeDir", base=base) or base
    if not code_dir.is_dir() and not _code_in_image(root, ts):
        raise ConfigError("trialCodeDirectory", f"{code_dir} is not an existing directory",
                          "point it at the folder holding your trial code (relative paths start at the config file's folder)")
    gpu_number = read("int_", "trialGpuNumber", v1="gpuNum", minimum=0)
    nni_manager_ip = read("str_", "nniManagerIp")
    debug = read("bool_", "debug") or False

    concurrency = root.int_("trialConcurrency", minimum=1, required=True)
    assert concurrency is not None  # required: int_ raised a ConfigError otherwise

    config = ExperimentConfig(
        trial_command=trial_command or "",
        trial_code_directory=code_dir,
        training_service=TrainingServiceConfig(platform="local"),
        trial_concurrency=concurrency,
        trial_gpu_number=gpu_number,
        max_trial_number=root.int_("maxTrialNumber", "maxTrialNum", minimum=1),
        max_experiment_duration=root.duration("maxExperimentDuration", "maxExecDuration"),
        max_trial_duration=root.duration("maxTrialDuration"),
        experiment_name=root.str_("experimentName"),
        debug=debug,
    )
    working_dir = root.path_("experimentWorkingDirectory", "logDir", base=base)
    if working_dir is not None:
        config.experiment_working_directory = working_dir
    config.tuner, config.assessor = _algorithms(root, base)
    config.search_space = _search_space(root, base, custom=bool(config.tuner and config.tuner.class_name))
    use_annotation = root.bool_("useAnnotation")
    wheelhouse = root.path_("agentWheelhouse", base=base)
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ConfigError("agentWheelhouse", f"{wheelhouse} is not an existing directory",
                          "point it at a folder of wheels made with `pip download --only-binary=:all: ...` "
                          "(docs/platforms/remote.md), or remove it")
    config.agent_wheelhouse = wheelhouse
    config.tuner_gpu_indices = root.gpu_indices("tunerGpuIndices")
    level = root.choice("logLevel", options=LOG_LEVELS)
    config.log_level = level or ("debug" if debug else "info")
    signal_name = root.str_("trialKillSignal")
    if signal_name is not None:
        config.trial_kill_signal = _signal(signal_name, root.at("trialKillSignal"))
    grace = root.duration("trialGracePeriod", allow_zero=True)
    if grace is not None:
        config.trial_grace_period = grace
    experiment_type = root.str_("experimentType")  # NNI 3's `ExperimentConfig.json()` writes "hpo"
    if experiment_type not in (None, "hpo"):
        fix = ("NAS experiments (experimentType: nas) are run by NNI's own NasExperiment; "
               if experiment_type == "nas" else "")
        raise ConfigError("experimentType", f"must be hpo (NNI's only other type, nas, is not supported here), "
                          f"got {experiment_type!r}", fix + "use `experimentType: hpo` (hyperparameter tuning) or remove it")
    for ignored in ("authorName", "multiPhase", "multiThread", "logCollection", "versionCheck"):
        root.take(ignored)  # accepted for compatibility; they change nothing here

    if hybrid is not None:
        leftover = trial.rest() if trial is not None else {}
        if leftover:
            raise ConfigError(trial.at(next(iter(leftover))) if trial else "trial", "is not used in hybrid mode",
                              "remove it (in hybrid mode a cluster platform's roles go in its own trainingService entry)")
        config.training_service = config_hybrid.parse(
            hybrid, lambda s: _training_service(s, ConfigSection({}, "", base), None, base, config, nni_manager_ip),
            nni_manager_ip)
    else:
        config.training_service = _training_service(ts, root, trial, base, config, nni_manager_ip)

    config.shared_storage = shared_storage.parse(root)
    if use_annotation:  # after the platform: Kubeflow's roles name the code directory
        _annotated_search_space(config)
    root.finish(extra_known=_SHORTCUTS + _TS_COMMON)
    return config


def _code_in_image(root: ConfigSection, ts: ConfigSection | None) -> bool:
    """Whether the platform named (v2 or v1) takes trialCodeDirectory as a folder of its image."""

    platform = None
    for section, names in ((ts, ("platform",)), (root, ("platform", "trainingServicePlatform"))):
        if isinstance(section, ConfigSection):
            wanted = [canonical_key(n) for n in names]
            platform = next((v for k, v in section.data.items() if canonical_key(k) in wanted), None) or platform
    if not isinstance(platform, str):
        return False
    try:
        return registry.backend_class(_V1_PLATFORM_NAMES.get(platform, platform)).code_in_image
    except ValueError:
        return False


def _training_service_section(root: ConfigSection) -> ConfigSection | list[ConfigSection] | None:
    value, path = root.take("trainingService")
    if value is _MISSING:
        return None
    if isinstance(value, list):  # hybrid mode
        return config_hybrid.sections(value, path, root.base)
    return ConfigSection(value, path, root.base)


def _training_service(ts: ConfigSection | None, root: ConfigSection, trial: ConfigSection | None, base: Path,
                      config: ExperimentConfig, nni_manager_ip: str | None) -> TrainingServiceConfig:

    # Fields may sit at the root (NNI shortcuts / v1 names) or in v1 platform sections.
    ts = ts or ConfigSection({}, "trainingService", base)
    for name, alias in (("platform", "trainingServicePlatform"), ("useActiveGpu", ""),
                        ("maxTrialNumberPerGpu", "maxTrialNumPerGpu"), ("gpuIndices", ""), ("machineList", "")):
        value, path = root.take(name, *([alias] if alias else []))
        if value is not _MISSING:
            if name in ts.data:
                raise ConfigError(path, f"also given as `{ts.at(name)}`", "set it in one place only")
            ts.data[name] = value
    for section_name, renames in _V1_PLATFORM_SECTIONS.items():
        v1 = root.section(section_name)
        if v1 is not None:
            for key, value in v1.rest().items():
                ts.put(renames.get(key, key), value)
    if trial is not None:  # v1 role sections (worker, ps, master, taskRoles) belong to the platform
        for key, value in trial.rest().items():
            ts.put(key, value)

    platform = ts.str_("platform", required=True)
    assert platform is not None
    platform = _V1_PLATFORM_NAMES.get(platform, platform)
    try:
        backend = registry.backend_class(platform)
    except ValueError as e:
        raise ConfigError(ts.at("platform"), str(e), f"use one of: {', '.join(registry.platforms())}") from None
    gpu_number = config.trial_gpu_number
    ts_config = TrainingServiceConfig(platform=platform, nni_manager_ip=nni_manager_ip)
    ts_config.use_active_gpu = ts.bool_("useActiveGpu")
    per_gpu = ts.int_("maxTrialNumberPerGpu", "maxTrialNumPerGpu", minimum=1)
    ts_config.gpu_indices = ts.gpu_indices()
    if platform == "local" and gpu_number and ts_config.use_active_gpu is None:
        raise ConfigError(ts.at("useActiveGpu"), "must be set when trialGpuNumber > 0 on the local platform",
                          "add `useActiveGpu: false` (or true to also use GPUs other processes are using)")
    if per_gpu is not None:
        check_per_gpu(per_gpu, gpu_number, ts.at("maxTrialNumberPerGpu"))
        ts_config.max_trial_number_per_gpu = per_gpu
    ts_config.reconnect_window = ts.duration("reconnectWindow")
    env, env_path = ts.take("agentEnv")
    if env is not _MISSING:
        if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
            raise ConfigError(env_path, "must map variable names to values", "e.g. `agentEnv: {CUDA_HOME: /usr/local/cuda}`")
        for k in env:  # a name goes into `export NAME=...` lines and env lists: only a real variable name
            if not _ENV_NAME.fullmatch(k):
                raise ConfigError(f"{env_path}.{k}", "is not an environment variable name",
                                  "use letters, digits and _ (not starting with a digit), e.g. CUDA_HOME")
        ts_config.agent_env = {k: str(v) for k, v in env.items()}
    port = ts.int_("hubPort", minimum=1)
    if port is not None and port > 65535:
        raise ConfigError(ts.at("hubPort"), f"must be a TCP port (1-65535), got {port}",
                          "pick a port your firewall lets agents reach, e.g. 8081")
    ts_config.hub_port = port
    tls = ts.bool_("hubTls")
    ts_config.hub_tls = True if tls is None else tls
    ts_config.hub_cert_file = ts.path_("hubCertFile", base=base)
    ts_config.hub_key_file = ts.path_("hubKeyFile", base=base)
    ts_config.hub_ca_file = ts.path_("hubCaFile", base=base)
    ts_config.hub_bind_address = _bind_address(ts)
    ts_config.hub_tunnel = ts.bool_("hubTunnel")
    ts_config.hub_tunnel_image = ts.str_("hubTunnelImage")
    for name, value in (("hubTunnel", ts_config.hub_tunnel), ("hubTunnelImage", ts_config.hub_tunnel_image)):
        if value and platform not in ("kubernetes", "kubeflow", "frameworkcontroller"):
            raise ConfigError(ts.at(name), f"is not supported on platform {platform}",
                              "remove it (only the Kubernetes platforms tunnel through their API server)")
    if (ts_config.hub_cert_file is None) != (ts_config.hub_key_file is None):
        missing = "hubKeyFile" if ts_config.hub_key_file is None else "hubCertFile"
        raise ConfigError(ts.at(missing), "is required with " + ("hubCertFile" if missing == "hubKeyFile" else "hubKeyFile"),
                          "give both the hub's certificate (PEM) and its private key, or neither")
    for name in ("hubCertFile", "hubKeyFile", "hubCaFile"):
        value = getattr(ts_config, {"hubCertFile": "hub_cert_file", "hubKeyFile": "hub_key_file",
                                    "hubCaFile": "hub_ca_file"}[name])
        if value is not None and not value.is_file():
            raise ConfigError(ts.at(name), f"{value} does not exist", "point it at a PEM file")
    config.training_service = ts_config
    if platform == "local":
        ts.bool_("reuseMode")  # NNI's canonical form carries it; local trials run the same either way
    ts_config.options = backend.parse_options(ts, config)
    if backend.trial_command_required and not config.trial_command:
        raise ConfigError("trialCommand", "is required", "add `trialCommand: python3 trial.py` (the command each trial runs)")
    ts.finish(where=f"for platform {platform}")
    return ts_config


def _bind_address(ts: ConfigSection) -> str | None:
    """`hubBindAddress`: an IP literal of this machine (or 0.0.0.0 / ::), never a name."""

    value = ts.str_("hubBindAddress")
    if value is None:
        return None
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        raise ConfigError(ts.at("hubBindAddress"), f"must be an IP address of this machine, got {value!r}",
                          "use 0.0.0.0 (every interface), :: or one of this machine's addresses; "
                          "put a DNS name or public address in nniManagerIp instead") from None
    return bare


def _search_space(root: ConfigSection, base: Path, custom: bool = False) -> SearchSpace | None:
    """The search space, checked against NNI's format, except for a customised tuner: it may
    define its own (NNI leaves validation to each tuner)."""

    inline, inline_path = root.take("searchSpace")
    file = root.path_("searchSpaceFile", "searchSpacePath", base=base)
    if inline is not _MISSING and file is not None:
        raise ConfigError(inline_path, "given together with searchSpaceFile", "keep only one of them")
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            raise ConfigError("searchSpaceFile", f"cannot read {file}: {exc.strerror}",
                              "point it at a JSON or YAML file (relative to the config file's folder)") from None
        inline, inline_path = _load_yaml(text, str(file)), "searchSpaceFile"  # YAML is a superset of JSON
    if inline is _MISSING:
        return None
    if custom:
        if not isinstance(inline, dict):
            raise ConfigError(inline_path, "must be a mapping of parameter names to their specs",
                              "write e.g. `lr: {_type: loguniform, _value: [0.0001, 0.1]}`")
        return inline
    validate(inline, inline_path)
    return cast(SearchSpace, inline)  # validate() checked the shape, or raised


def _annotated_search_space(config: ExperimentConfig) -> None:
    """`useAnnotation: true`: the search space is the trial code's annotations (read, not written:
    the run expands a copy). NNI refuses a search space given as well."""

    if config.search_space is not None:
        raise ConfigError("searchSpace", "given together with useAnnotation: true",
                          "remove searchSpace/searchSpaceFile: the annotations in the trial code define the "
                          "search space (NNI refuses both as well)")
    config.search_space = annotated_search_space(config.trial_code_directory, config.experiment_working_directory)
    validate(config.search_space, "useAnnotation")
    config.use_annotation = True


def _algorithms(root: ConfigSection, base: Path) -> tuple[TunerConfig | None, TunerConfig | None]:
    """(tuner or advisor, assessor), as NNI canonicalises them: an advisor takes the tuner's place."""
    tuner = _algorithm(root, "tuner", base)
    advisor = _algorithm(root, "advisor", base)
    assessor = _algorithm(root, "assessor", base)
    if advisor is not None:
        if tuner is not None:
            raise ConfigError("advisor", "given together with `tuner`",
                              "keep one: an advisor (Hyperband, BOHB) is a tuner with its own early stopping")
        if assessor is not None:
            raise ConfigError("assessor", "given together with an advisor, which stops trials itself",
                              "remove the assessor (NNI ignores it with an advisor)")
        tuner = advisor
    if tuner is None and assessor is not None:  # NNI 3.0: "ExperimentConfig: tuner must be set"
        raise ConfigError("tuner", "must be set: an assessor only judges the trials a tuner proposes",
                          "add `tuner: {name: TPE}` (or an advisor such as Hyperband)")
    return tuner, assessor


def _algorithm(root: ConfigSection, kind: str, base: Path) -> TunerConfig | None:
    """One algorithm section: `name` (v1: builtinTunerName / builtinAssessorName /
    builtinAdvisorName) or `className` + `codeDirectory` (v1: classFileName + codeDir)."""
    section = root.section(kind)
    if section is None:
        return None
    v1_name = {"tuner": "builtinTunerName", "assessor": "builtinAssessorName", "advisor": "builtinAdvisorName"}[kind]
    name = section.str_("name", v1_name)
    class_name = section.str_("className")
    class_file = section.str_("classFileName")  # v1: file + class -> module.Class
    if class_file is not None and class_name is not None and "." not in class_name:
        class_name = f"{Path(class_file).stem}.{class_name}"
    code_dir = section.path_("codeDirectory", "codeDir", base=base)
    args, args_path = section.take("classArgs")
    if args is MISSING:
        args = {}
    elif not isinstance(args, dict):
        raise ConfigError(args_path, f"must be a mapping, got {_type_name(args)}", "write e.g. `classArgs: {seed: 1}`")
    include = section.bool_("includeIntermediateResults") or False
    section.take("gpuIndices")  # v1 per-algorithm GPUs: tunerGpuIndices is the v2 field
    section.finish()
    if name is not None and class_name is not None:
        raise ConfigError(section.at("className"), "given together with `name`",
                          "use `name` for one of NNI's built-in algorithms, or `className` + `codeDirectory` "
                          "for your own")
    if name is None and class_name is None:
        raise ConfigError(section.at("name"), "is required",
                          f"add `name: {'TPE' if kind == 'tuner' else 'Medianstop' if kind == 'assessor' else 'Hyperband'}`"
                          " (a built-in algorithm) or `className` + `codeDirectory` (your own)")
    if class_name is not None:
        if "." not in class_name:
            raise ConfigError(section.at("className"), f"must be `module.Class`, got {class_name!r}",
                              "write e.g. `className: my_tuner.MyTuner` (my_tuner.py in codeDirectory)")
        if code_dir is None:
            raise ConfigError(section.at("codeDirectory"), "is required with className",
                              "point it at the folder holding your algorithm's module")
        if not code_dir.is_dir():
            raise ConfigError(section.at("codeDirectory"), f"{code_dir} is not an existing directory",
                              "point it at the folder holding your algorithm's module "
                              "(relative paths start at the config file's folder)")
    elif code_dir is not None:
        raise ConfigError(section.at("codeDirectory"), "is only for customised algorithms (className)",
                          "remove it, or give `className` instead of `name`")
    return TunerConfig(name=name or "", class_args=args, class_name=class_name, code_directory=code_dir,
                       kind=kind, include_intermediate_results=include)


def _signal(name: str, field: str) -> str:
    canonical = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
    if not hasattr(signal, canonical) or not isinstance(getattr(signal, canonical), signal.Signals):
        raise ConfigError(field, f"unknown signal {name!r}", "use a signal name such as SIGTERM or SIGINT")
    return canonical
