"""NNI experiment configs (v2 YAML, v1 field names accepted) -> typed, validated objects.

Every mistake raises `ConfigError` naming the field (as a dotted path, e.g.
`trainingService.machineList[1].host`) and the fix.
"""
from __future__ import annotations

import dataclasses
import difflib
import logging
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A wrong experiment config: names the field and says how to fix it."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"config field `{field}`: {problem}"
        super().__init__(f"{text}. Fix: {fix}" if fix else text)


@dataclass
class TrainingServiceConfig:
    """The `trainingService` section: the fields every platform shares. A platform's own
    fields are parsed by its backend (`Backend.parse_config`) into `options`."""

    platform: str
    use_active_gpu: bool | None = None
    max_trial_number_per_gpu: int = 1
    gpu_indices: list[int] | None = None
    options: Any = None  # the backend's own config object (e.g. the remote machine list)
    nni_manager_ip: str | None = None
    # The hub agents dial on network platforms (clusters): a fixed port for firewalls
    # (`hubPort`; default: any free one, kept across manager restarts), TLS on unless
    # `hubTls: false`, and optionally the user's own certificate.
    hub_port: int | None = None
    hub_tls: bool = True
    hub_cert_file: Path | None = None
    hub_key_file: Path | None = None
    hub_ca_file: Path | None = None
    # `hubBindAddress`: where the hub listens (default: every interface when agents come from the
    # network, the address itself when `nniManagerIp` is loopback); `nniManagerIp` is only what
    # agents are told to dial, so a public IP, a NAT port-forward or a DNS name can be advertised.
    hub_bind_address: str | None = None
    # `hubTunnel` (Kubernetes family): agents reach the hub through a relay pod and the API
    # server's port-forward; None: on when `nniManagerIp` is not given.
    hub_tunnel: bool | None = None
    # `hubTunnelImage`: the relay pod's image (any image with `python3`; a mirror in private clusters).
    hub_tunnel_image: str | None = None
    # Our extensions. `reconnectWindow`: how long a silent agent's trials are kept alive (and
    # how long an orphaned agent waits for its manager); None = the backend's default.
    reconnect_window: float | None = None
    # `agentEnv`: extra environment for every agent (and so its trials), e.g. CUDA paths.
    agent_env: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # by the secret rule: agentEnv's secret variables show as ***
        return redacted_repr(self)


@dataclass
class TunerConfig:
    """A tuner, assessor or advisor: NNI's built-in `name`, or a customised `className` found in
    `codeDirectory`; either with its `classArgs`."""

    name: str = ""  # built in: NNI's names (TPE, Medianstop, Hyperband, ...); Random, GridSearch without nni
    class_args: dict[str, Any] = field(default_factory=dict)
    class_name: str | None = None  # a customised algorithm: "module.Class" importable from code_directory
    code_directory: Path | None = None
    kind: str = "tuner"  # "tuner", "assessor" or "advisor" (an advisor is run as NNI runs it: as the tuner)
    include_intermediate_results: bool = False  # NNI_INCLUDE_INTERMEDIATE_RESULTS for the dispatcher

    def __repr__(self) -> str:  # by the secret rule: secret classArgs show as ***
        return redacted_repr(self)


AlgorithmConfig = TunerConfig
LOG_LEVELS = ("fatal", "error", "warning", "info", "debug", "trace")


@dataclass
class ExperimentConfig:
    trial_command: str  # "" when the platform's roles carry their own commands (kubeflow, ...)
    trial_code_directory: Path
    training_service: TrainingServiceConfig
    trial_concurrency: int = 1
    trial_gpu_number: int | None = None
    max_trial_number: int | None = None
    max_experiment_duration: float | None = None  # seconds
    max_trial_duration: float | None = None  # seconds
    experiment_working_directory: Path = field(default_factory=lambda: Path("~/nni-experiments").expanduser())
    experiment_name: str | None = None
    search_space: dict[str, Any] | None = None
    tuner: TunerConfig | None = None  # the tuner, or the advisor (NNI's canonical form moves it here)
    assessor: TunerConfig | None = None
    tuner_gpu_indices: list[int] | None = None
    # How trials are stopped: NNI 3's trial keeper sends SIGINT (a Python trial sees
    # KeyboardInterrupt and can clean up and report) and SIGKILL 5 s later; ours are configurable.
    trial_kill_signal: str = "SIGINT"
    trial_grace_period: float = 5.0
    debug: bool = False
    log_level: str = "info"  # NNI's logLevel: the manager's log file and the dispatcher's
    config_file: Path | None = None  # the YAML it was loaded from: `nni-manager resume ID` loads it again
    # NNI annotations: the search space came from the trial code, and the run expands the code
    # into the experiment's directory first (then this is false, as NNI 2's nnictl left it)
    use_annotation: bool = False
    # wheels of the agent's dependencies for workers whose Python lacks them and has no index
    # (`agentWheelhouse`: fill it with `pip download`); the manager's cache and pip come first/last
    agent_wheelhouse: Path | None = None
    # NNI's `sharedStorage` (nni_manager.shared_storage.SharedStorageConfig): NFS or an Azure blob
    # container every worker mounts, where trials work and write their outputs
    shared_storage: Any = None

    def __repr__(self) -> str:  # by the secret rule (each section's repr hides its own)
        return redacted_repr(self)


# ---------------------------------------------------------------------------------------
# Loading

# Secrets: ONE rule, `is_secret(name)`, decides which config fields (and which keys of the
# user's mappings: agentEnv, classArgs, an OpenPAI job protocol, a pod spec's env) hold a secret.
# `redacted` applies it to the stored config (experiment.db), `redacted_repr` to the config
# dataclasses' repr(), and `SecretFormatter` masks the values it finds in the manager's log.
#
# A name is split into words (camelCase, snake_case, SCREAMING_CASE, kebab-case); it names a
# secret when its LAST word (or its last two joined: `passWord`, `connectionString`) is a secret
# word. The last word is what the field holds: `sshKeyFile`, `hubKeyFile`, `privateRegistryAuthPath`,
# `keyVaultName` and `tokenFile` hold a path or a name (stored, shown: they say where a secret is,
# and the user needs them to debug a config); `strictHostKeyChecking` holds a switch; `password`,
# `sshPassphrase`, `token`, `accountKey`, `keyVaultKey`, `AZURE_CLIENT_SECRET`, `WANDB_API_KEY`
# hold the secret itself. Whole words only: `monkey`, `max_tokens` or `keyboard` are no secret.
# Tools' own variables count too: `PGPASSWORD` and `DBPASSWORD` (a word ending in a long secret
# word), `MYSQL_PWD` (`pwd` after another word: `PWD` alone is the working directory), `SSHPASS`,
# `DB_PASS`, `GITHUB_PAT`, `AZURE_STORAGE_SAS`, `SENTRY_DSN`, and a URL of a data service
# (`DATABASE_URL`, `REDIS_URL`, `MONGODB_URI`, `CELERY_BROKER_URL`), which carries its password.
_SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "token", "secret", "secrets", "key", "credential", "credentials",
    "connectionstring", "apikey", "accesskey", "secretkey", "privatekey",
    "pass", "sshpass", "pat", "sas", "dsn",
})
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "token", "secret", "apikey", "credential", "credentials")
_DATA_SERVICES = frozenset({"database", "db", "redis", "mongo", "mongodb", "postgres", "postgresql", "pg", "mysql",
                            "amqp", "rabbitmq", "broker", "sqlalchemy", "kafka", "elasticsearch", "celery"})
# Fields kept as given: a search space maps the user's parameter names (never credentials) to
# distributions, and view mode shows it from the store.
_NEVER_SECRET = frozenset({"search_space"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REDACTED = "***"


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [w.rstrip("0123456789") for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w.rstrip("0123456789")]


def is_secret(name: str) -> bool:
    """Whether a config field (or a key of a user's mapping) holds a secret, kept out of reprs,
    logs and the store. See the rule above."""
    words = _words(str(name))
    if not words:
        return False
    last = words[-1]
    if last in _SECRET_WORDS or "".join(words[-2:]) in _SECRET_WORDS or last.endswith(_SECRET_SUFFIXES):
        return True
    if last == "pwd":
        return len(words) > 1
    return last in ("url", "uri") and any(w in _DATA_SERVICES for w in words[:-1])


def redacted(value: Any, name: str = "") -> Any:
    """`value` (of a field called `name`) with every secret replaced by "***": what is stored in
    experiment.db and shown by reprs. Mappings are walked by key; a `{name: X, value: V}` entry
    (Kubernetes env lists) hides V when X names a secret. Empty secrets stay empty."""
    if name in _NEVER_SECRET:
        return value
    if is_secret(name) and value not in (None, "", [], {}):
        return REDACTED
    if isinstance(value, dict):
        pair_secret = isinstance(value.get("name"), str) and is_secret(value["name"])
        return {k: REDACTED if pair_secret and k == "value" and v else redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v) for v in value]
    return value


def redacted_repr(obj: Any) -> str:
    """repr() of a config dataclass by the secret rule: secret fields are left out, secrets inside
    its mappings shown as "***"; a nested dataclass uses its own repr."""
    shown = (f"{f.name}={redacted(getattr(obj, f.name), f.name)!r}" for f in dataclasses.fields(obj)
             if f.repr and not is_secret(f.name))
    return f"{type(obj).__name__}({', '.join(shown)})"


def secret_values(value: Any, name: str = "") -> set[str]:
    """Every secret string in a config (an ExperimentConfig, a backend's options, a dict), found
    by the same rule: what `SecretFormatter` masks."""
    found: set[str] = set()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            found |= secret_values(getattr(value, f.name), f.name)
        return found
    if name in _NEVER_SECRET:
        return found
    if is_secret(name):
        return {v for v in _strings(value) if len(v) >= 4}  # shorter: masking would mangle the log
    if isinstance(value, dict):
        if isinstance(value.get("name"), str) and is_secret(value["name"]):
            found |= secret_values(value.get("value"), "secret")
        for k, v in value.items():
            found |= secret_values(v, str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= secret_values(v)
    return found


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return [] if value is None or isinstance(value, bool) else [str(value)]


class SecretFormatter(logging.Formatter):
    """A log formatter that masks the config's secret values (`secret_values`) wherever a
    message, an argument or a traceback carries one: the last guard for the manager's log."""

    def __init__(self, fmt: str | None = None, secrets: set[str] | frozenset[str] = frozenset()) -> None:
        super().__init__(fmt)
        self.secrets = sorted(secrets, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text


_MISSING: Any = object()
MISSING = _MISSING  # what ConfigSection.take returns for an absent (or null) field

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
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def supported_platforms() -> list[str]:
    """Platforms that have a backend in this installation."""
    from nni_manager.backends import registry

    return registry.platforms()


def canonical_key(key: Any) -> str:
    """NNI's rule for config keys (nni/experiment/config/utils/internal.py `case_insensitive`):
    case and underscores do not matter, so `trial_command`, `TrialCommand` and `trialCommand`
    name one field. Values (search spaces, classArgs, env) keep their keys as written."""
    return str(key).lower().replace("_", "")


class _Fields(dict):
    """A config mapping whose `in` follows NNI's key rule (`"preCommand" in section.data`)."""

    def __contains__(self, key: object) -> bool:
        wanted = canonical_key(key)
        return any(canonical_key(k) == wanted for k in self.keys())


class ConfigSection:
    """One mapping of the config: typed reads by name (with v1 aliases), and a final
    check that flags every key nobody read, suggesting the closest known name."""

    def __init__(self, data: Any, path: str, base: Path | None = None) -> None:
        self.base = base or Path.cwd()  # relative paths start here (the config file's folder)
        if not isinstance(data, dict):
            raise ConfigError(path or "(root)", f"must be a mapping, got {_type_name(data)}",
                              "write it as `key: value` lines")
        self.data: dict[str, Any] = _Fields(data)
        self.path = path
        self.known: list[str] = []

    def at(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def take(self, name: str, *aliases: str) -> tuple[Any, str]:
        """(value, dotted path of the key used); value is _MISSING when absent or null."""
        self.known.append(name)
        wanted = [canonical_key(k) for k in (name, *aliases)]
        found = sorted((k for k in self.data if canonical_key(k) in wanted), key=lambda k: wanted.index(canonical_key(k)))
        if len(found) > 1:
            raise ConfigError(self.at(found[1]), f"given together with `{found[0]}` (the same field)",
                              f"keep only `{name}`")
        if not found:
            return _MISSING, self.at(name)
        value = self.data.pop(found[0])
        return (_MISSING if value is None else value), self.at(found[0])

    def str_(self, name: str, *aliases: str, required: bool = False) -> str | None:
        value, path = self.take(name, *aliases)
        if value is _MISSING:
            if required:
                raise ConfigError(path, "is required", f"add `{name}: ...`")
            return None
        if isinstance(value, dict) and len(value) == 1 and next(iter(value.values())) is None:
            raise ConfigError(path, f"is `{{{next(iter(value))}}}`, a placeholder (YAML reads braces as a mapping)",
                              f"replace it with your value: `{name}: \"...\"`")
        if not isinstance(value, str) or (required and not value.strip()):
            raise ConfigError(path, f"must be a non-empty string, got {_type_name(value)}",
                              f"write `{name}: \"...\"`")
        return value

    def int_(self, name: str, *aliases: str, minimum: int = 0, required: bool = False) -> int | None:
        value, path = self.take(name, *aliases)
        if value is _MISSING:
            if required:
                raise ConfigError(path, "is required", f"add `{name}: <integer >= {minimum}>`")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"must be an integer, got {_type_name(value)}",
                              f"write a whole number >= {minimum}")
        if value < minimum:
            raise ConfigError(path, f"must be >= {minimum}, got {value}", f"use a number >= {minimum}")
        return value

    def bool_(self, name: str, *aliases: str) -> bool | None:
        value, path = self.take(name, *aliases)
        if value is _MISSING:
            return None
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {_type_name(value)}", "write true or false")
        return value

    def duration(self, name: str, *aliases: str, allow_zero: bool = False) -> float | None:
        value, path = self.take(name, *aliases)
        return None if value is _MISSING else parse_duration(value, path, allow_zero=allow_zero)

    def path_(self, name: str, *aliases: str, base: Path | None = None) -> Path | None:
        value = self.str_(name, *aliases)
        return None if value is None else _resolve(value, base or self.base)

    def gpu_indices(self, name: str = "gpuIndices") -> list[int] | None:
        value, path = self.take(name)
        if value is _MISSING:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        elif isinstance(value, str):
            try:
                value = [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                raise ConfigError(path, "must list GPU indices", 'write e.g. `gpuIndices: [0, 1]` or "0,1"') from None
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                  for i in value):
            raise ConfigError(path, "must be a list of GPU indices (integers >= 0)",
                              "write e.g. `gpuIndices: [0, 1]`")
        return value

    def section(self, name: str, *aliases: str) -> ConfigSection | None:
        value, path = self.take(name, *aliases)
        return None if value is _MISSING else ConfigSection(value, path, self.base)

    def items(self, name: str, *aliases: str, required: bool = False, fix: str = "") -> list[ConfigSection] | None:
        """A list of mappings, each as a section (`machineList`, `taskRoles`)."""
        value, path = self.take(name, *aliases)
        if value is _MISSING:
            if required:
                raise ConfigError(path, "is required", fix or f"add `{name}: [...]`")
            return None
        if not isinstance(value, list) or (required and not value):
            raise ConfigError(path, f"must be a non-empty list, got {_type_name(value)}", fix or f"write `{name}: [...]`")
        return [ConfigSection(v, f"{path}[{i}]", self.base) for i, v in enumerate(value)]

    def choice(self, name: str, *aliases: str, options: tuple[str, ...], required: bool = False,
               default: str | None = None) -> str | None:
        value = self.str_(name, *aliases, required=required)
        if value is None:
            return default
        if value not in options:
            close = difflib.get_close_matches(value, options, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            raise ConfigError(self.at(name), f"must be one of {', '.join(options)}, got {value!r}",
                              f"{hint}use one of: {', '.join(options)}")
        return value

    def number(self, name: str, *aliases: str, minimum: float = 0, required: bool = False) -> float | None:
        value, path = self.take(name, *aliases)
        if value is _MISSING:
            if required:
                raise ConfigError(path, "is required", f"add `{name}: <number >= {minimum:g}>`")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
            raise ConfigError(path, f"must be a number >= {minimum:g}, got {value!r}", f"write a number >= {minimum:g}")
        return float(value)

    def mapping(self, name: str, *aliases: str) -> dict[str, Any] | None:
        value, path = self.take(name, *aliases)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            raise ConfigError(path, f"must be a mapping, got {_type_name(value)}", "write it as `key: value` lines")
        return value

    def rest(self) -> dict[str, Any]:
        """Everything not read yet (removing it from the unknown-field check)."""
        rest, self.data = dict(self.data), _Fields()
        return rest

    def put(self, name: str, value: Any) -> None:
        """Set a field unless the mapping has it under any spelling NNI treats as the same."""
        if name not in self.data:
            self.data[name] = value

    def finish(self, extra_known: tuple[str, ...] = (), where: str = "") -> None:
        for key in self.data:
            candidates = difflib.get_close_matches(str(key), [*self.known, *extra_known], n=1, cutoff=0.7)
            hint = f"did you mean `{candidates[0]}`?" if candidates else "remove it"
            raise ConfigError(self.at(str(key)), "unknown field" + (f" {where}" if where else ""), hint)


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def parse_duration(value: Any, field: str, *, allow_zero: bool = False) -> float:
    """NNI durations: seconds as a number, or "45s", "30m", "1.5h", "1d"."""
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(-?\d+(?:\.\d*)?)\s*([smhd]?)\s*", value.lower())
        if match:
            seconds = float(match.group(1)) * _DURATION_UNITS.get(match.group(2) or "s", 1)
    if seconds is None:
        raise ConfigError(field, f"is not a duration: {value!r}",
                          'write seconds or a number with a unit s, m, h or d, e.g. "30m" or "1h"')
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(field, f"must be {'>= 0' if allow_zero else 'positive'}, got {value!r}",
                          'use a positive duration such as "30m"')
    return seconds


_SIZE_UNITS = {"": 1 / (1 << 20), "b": 1 / (1 << 20), "k": 1 / 1024, "kb": 1 / 1024, "m": 1, "mb": 1,
               "g": 1024, "gb": 1024, "t": 1 << 20, "tb": 1 << 20, "ki": 1 / 1024, "mi": 1, "gi": 1024, "ti": 1 << 20}


def parse_size_mb(value: Any, field_path: str) -> int:
    """NNI memory sizes: an integer of MB, or "8gb", "8192mb", "8Gi" ..."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        mb = float(value)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise ConfigError(field_path, f"is not a memory size: {value!r}",
                              'write MB as a number, or a size such as "8gb" or "8192mb"')
        mb = float(match.group(1)) * _SIZE_UNITS[unit]
    if mb <= 0:
        raise ConfigError(field_path, f"must be positive, got {value!r}", 'e.g. "2gb"')
    return max(1, int(mb))


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


def _is_nni_config(source: Any) -> bool:
    """A config object of NNI's Python API (any `nni.experiment.config` ConfigBase)."""
    return any(cls.__module__.startswith("nni.experiment.config") and cls.__name__ == "ConfigBase"
               for cls in type(source).__mro__)


def yaml_file(path: Path, field: str, fix_missing: str, fix_syntax: str = "fix the file's YAML syntax") -> Any:
    """The content of a YAML file a config field names (a job protocol, a Framework template),
    or a ConfigError naming that field: the file is missing, or it is not YAML."""
    import yaml

    if not path.is_file():
        raise ConfigError(field, f"{path} does not exist", fix_missing)
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(field, f"{path} is not valid YAML: {e}", fix_syntax) from None


def _load_yaml(text: str, where: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError("(file)", f"{where} is not valid YAML{at}", "fix the YAML syntax there") from None


def _parse(root: ConfigSection, base: Path) -> ExperimentConfig:
    from nni_manager import config_hybrid

    trial = root.section("trial")  # v1: trial.command / codeDir / gpuNum (+ k8s roles)
    ts: Any = _training_service_section(root)
    hybrid = ts if isinstance(ts, list) else config_hybrid.v1_sections(root, _V1_PLATFORM_SECTIONS, _V1_PLATFORM_NAMES)
    if hybrid is not None:  # hybrid mode: the shared fields move to the top, each service is parsed alone
        config_hybrid.hoist_shortcuts(root, hybrid, _SHORTCUTS)
        ts = None

    def shortcut(name: str, *aliases: str, v1: str = "") -> tuple[Any, str] | None:
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
    from nni_manager import shared_storage

    config.shared_storage = shared_storage.parse(root)
    if use_annotation:  # after the platform: Kubeflow's roles name the code directory
        _annotated_search_space(config)
    root.finish(extra_known=_SHORTCUTS + _TS_COMMON)
    return config


def _code_in_image(root: ConfigSection, ts: Any) -> bool:
    """Whether the platform named (v2 or v1) takes trialCodeDirectory as a folder of its image."""
    from nni_manager.backends import registry

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


def _training_service_section(root: ConfigSection) -> ConfigSection | None:
    value, path = root.take("trainingService")
    if value is _MISSING:
        return None
    if isinstance(value, list):  # hybrid mode
        from nni_manager import config_hybrid

        return config_hybrid.sections(value, path, root.base)  # type: ignore[return-value]
    return ConfigSection(value, path, root.base)


def _training_service(ts: ConfigSection | None, root: ConfigSection, trial: ConfigSection | None, base: Path,
                      config: ExperimentConfig, nni_manager_ip: str | None) -> TrainingServiceConfig:
    from nni_manager.backends import registry

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
    ts_config.options = backend.parse_config(ts, config)
    if backend.trial_command_required and not config.trial_command:
        raise ConfigError("trialCommand", "is required", "add `trialCommand: python3 trial.py` (the command each trial runs)")
    ts.finish(where=f"for platform {platform}")
    return ts_config


def _bind_address(ts: ConfigSection) -> str | None:
    """`hubBindAddress`: an IP literal of this machine (or 0.0.0.0 / ::), never a name."""
    import ipaddress

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


def check_per_gpu(per_gpu: int, gpu_number: int | None, field: str) -> None:
    if per_gpu != 1 and not gpu_number:
        raise ConfigError(field, "is only meaningful when trials use GPUs",
                          "set trialGpuNumber >= 1, or remove maxTrialNumberPerGpu")


def _search_space(root: ConfigSection, base: Path, custom: bool = False) -> dict[str, Any] | None:
    """The search space, checked against NNI's format, except for a customised tuner: it may
    define its own (NNI leaves validation to each tuner)."""
    from nni_manager.search_space import validate

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
    return inline


def _annotated_search_space(config: ExperimentConfig) -> None:
    """`useAnnotation: true`: the search space is the trial code's annotations (read, not written:
    the run expands a copy). NNI refuses a search space given as well."""
    from nni_manager import annotations
    from nni_manager.search_space import validate

    if config.search_space is not None:
        raise ConfigError("searchSpace", "given together with useAnnotation: true",
                          "remove searchSpace/searchSpaceFile: the annotations in the trial code define the "
                          "search space (NNI refuses both as well)")
    config.search_space = annotations.search_space(config.trial_code_directory, config.experiment_working_directory)
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
