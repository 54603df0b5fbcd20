"""The config's primitives: `ConfigError`, `ConfigSection` (typed reads of one mapping, with v1
aliases and a did-you-mean check for unknown keys) and the value parsers every backend uses.

Nothing here knows a platform, so backends, hybrid mode and shared storage build on it while
the loader (`nni_manager.loader`) builds on them.
"""
from __future__ import annotations

import difflib
import re
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


_MISSING: object = object()
MISSING = _MISSING  # what ConfigSection.take returns for an absent (or null) field
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def canonical_key(key: object) -> str:
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

    def __init__(self, data: object, path: str, base: Path | None = None) -> None:
        self.base = base or Path.cwd()  # relative paths start here (the config file's folder)
        if not isinstance(data, dict):
            raise ConfigError(path or "(root)", f"must be a mapping, got {_type_name(data)}",
                              "write it as `key: value` lines")
        self.data: dict[str, object] = _Fields(data)
        self.path = path
        self.known: list[str] = []

    def at(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def take(self, name: str, *aliases: str) -> tuple[object, str]:
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

    def missing(self, path: str, name: str, fix: str) -> ConfigError:
        """The error for a required field that is absent: a misspelling of it left in the mapping
        (`trialConcurency`) is named first, as the unknown field it is, with the right name."""
        for key in self.data:
            if difflib.get_close_matches(canonical_key(key), [canonical_key(name)], n=1, cutoff=0.8):
                return ConfigError(self.at(str(key)), "unknown field", f"did you mean `{name}`?")
        return ConfigError(path, "is required", fix)

    def str_(self, name: str, *aliases: str, required: bool = False) -> str | None:
        value, path = self.take(name, *aliases)
        if value is _MISSING:
            if required:
                raise self.missing(path, name, f"add `{name}: ...`")
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
                raise self.missing(path, name, f"add `{name}: <integer >= {minimum}>`")
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
                raise self.missing(path, name, fix or f"add `{name}: [...]`")
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
                raise self.missing(path, name, f"add `{name}: <number >= {minimum:g}>`")
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

    def rest(self) -> dict[str, object]:
        """Everything not read yet (removing it from the unknown-field check)."""
        rest, self.data = dict(self.data), _Fields()
        return rest

    def put(self, name: str, value: object) -> None:
        """Set a field unless the mapping has it under any spelling NNI treats as the same."""
        if name not in self.data:
            self.data[name] = value

    def finish(self, extra_known: tuple[str, ...] = (), where: str = "") -> None:
        for key in self.data:
            candidates = difflib.get_close_matches(str(key), [*self.known, *extra_known], n=1, cutoff=0.7)
            hint = f"did you mean `{candidates[0]}`?" if candidates else "remove it"
            raise ConfigError(self.at(str(key)), "unknown field" + (f" {where}" if where else ""), hint)


def _type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def parse_duration(value: object, field: str, *, allow_zero: bool = False) -> float:
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


def parse_size_mb(value: object, field_path: str) -> int:
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


def yaml_file(path: Path, field: str, fix_missing: str, fix_syntax: str = "fix the file's YAML syntax") -> object:
    """The content of a YAML file a config field names (a job protocol, a Framework template),
    or a ConfigError naming that field: the file is missing, or it is not YAML."""
    import yaml

    if not path.is_file():
        raise ConfigError(field, f"{path} does not exist", fix_missing)
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(field, f"{path} is not valid YAML: {e}", fix_syntax) from None


def _load_yaml(text: str, where: str) -> object:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError("(file)", f"{where} is not valid YAML{at}", "fix the YAML syntax there") from None


def check_per_gpu(per_gpu: int, gpu_number: int | None, field: str) -> None:
    if per_gpu != 1 and not gpu_number:
        raise ConfigError(field, "is only meaningful when trials use GPUs",
                          "set trialGpuNumber >= 1, or remove maxTrialNumberPerGpu")
