"""NNI's built-in algorithms checked before start, as NNI 2.x's nnictl did: the name (with a
did-you-mean), the kind (an assessor named as the tuner), and the classArgs, by NNI's own
ClassArgsValidator where the algorithm has one, else by its constructor's parameters. Without
this, a misspelled tuner failed in NNI's dispatcher process after the experiment had started.

The names come from NNI's own algorithm lists (its package's builtin_algorithms.yml and the
user's registered_algorithms.yml from `nnictl algo register`), read as files: importing `nni`
costs about 2.7 s of CPU (scipy, pandas), paid only when classArgs need NNI's validator."""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from nni_manager.config import ConfigError, TunerConfig

OPTIMIZE_MODES = ("maximize", "minimize")


def check_optimize_mode(algo: TunerConfig, where: str) -> None:
    """Every NNI algorithm that takes `optimize_mode` accepts only these two words."""
    mode = algo.class_args.get("optimize_mode")
    if mode is not None and mode not in OPTIMIZE_MODES:
        close = difflib.get_close_matches(str(mode), OPTIMIZE_MODES, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`? " if close else ""
        raise ConfigError(f"{where}.classArgs.optimize_mode", f"must be maximize or minimize, got {mode!r}",
                          f"{hint}write `optimize_mode: maximize` (or minimize)")


def check_nni_algorithm(algo: TunerConfig, where: str) -> None:
    """ConfigError for an unknown built-in name or wrong classArgs (needs the `nni` package)."""
    check_optimize_mode(algo, where)
    if algo.class_name or not algo.name:  # customised: NNI imports it from codeDirectory
        return
    kind = "assessor" if algo.kind == "assessor" else "tuner"
    metas = algo_metas()
    meta = next((m for m in metas if algo.name.lower() in (m.name.lower(), (m.alias or "").lower())), None)
    if meta is None or meta.algo_type != kind:
        names = [m.name for m in metas if m.algo_type == kind]
        by_lower = {n.lower(): n for n in names}
        close = difflib.get_close_matches(algo.name.lower(), list(by_lower), n=1, cutoff=0.6)
        hint = f"did you mean `{by_lower[close[0]]}`? " if close else ""
        what = (f"{algo.name!r} is an {meta.algo_type}, not a {algo.kind}" if meta is not None
                else f"no built-in {algo.kind} is named {algo.name!r}")
        raise ConfigError(f"{where}.name", what, f"{hint}use one of: {', '.join(names)}")
    args = dict(algo.class_args)
    if not args:
        return
    validator_name = meta.validator_class_name
    try:
        if validator_name:
            module, _, cls = validator_name.rpartition(".")
            getattr(importlib.import_module(module), cls)().validate_class_args(**args)
        else:
            module, _, cls = meta.class_name.rpartition(".")
            _check_signature(getattr(importlib.import_module(module), cls), args, f"{where}.classArgs", meta.name)
    except ConfigError:
        raise
    except ImportError as exc:  # the algorithm needs a package nni does not install (SMAC, PPO's gym)
        raise ConfigError(f"{where}.name", f"{meta.name} needs {exc.name or exc}, which is not installed",
                          f"`pip install {exc.name}` next to nni-manager, or choose another {algo.kind}") from None
    except Exception as exc:  # noqa: BLE001 - NNI's validators raise schema.SchemaError (and others)
        message = " ".join(str(exc).split())
        raise ConfigError(f"{where}.classArgs", f"{meta.name} refuses them: {message}",
                          f"see the classArgs of {meta.name} in NNI's docs (https://nni.readthedocs.io/en/stable/"
                          f"hpo/{kind}s.html)") from None


@dataclass(frozen=True)
class AlgoMeta:
    """One entry of NNI's algorithm lists (the fields of nni.tools.package_utils.common.AlgoMeta we use)."""

    name: str
    alias: str | None
    class_name: str
    validator_class_name: str | None
    algo_type: str  # tuner (advisors included) or assessor


def algo_metas() -> list[AlgoMeta]:
    """NNI's built-in algorithms, then those the user registered, as nni's config_manager lists them."""
    spec = importlib.util.find_spec("nni")
    if spec is None or not spec.submodule_search_locations:
        return []
    package = Path(next(iter(spec.submodule_search_locations)))
    metas = _load(package / "runtime" / "default_config" / "builtin_algorithms.yml", builtin=True)
    return metas + _load(_nni_config_dir() / "registered_algorithms.yml", builtin=False)


def _nni_config_dir() -> Path:
    """nni.runtime.config.get_config_directory(), without importing nni or creating the folder."""
    if os.environ.get("NNI_CONFIG_DIR") is not None:
        return Path(os.environ["NNI_CONFIG_DIR"])
    if sys.prefix != sys.base_prefix or Path(sys.prefix, "conda-meta").is_dir():
        return Path(sys.prefix, "nni")
    if sys.platform == "win32":
        return Path(os.environ["APPDATA"], "nni")
    return Path.home() / ".config" / "nni"


def _load(path: Path, *, builtin: bool) -> list[AlgoMeta]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []  # NNI creates the user's list on first use; a broken one NNI itself would refuse later
    metas = []
    for section in ("tuner", "assessor", "advisor"):
        for entry in doc.get(section + "s") or []:
            if not isinstance(entry, dict) or "builtinName" not in entry:
                continue
            if not builtin and entry.get("source") == "nni":  # NNI <= 2.5 kept the built-ins in this file too
                continue
            metas.append(AlgoMeta(name=str(entry["builtinName"]), alias=entry.get("alias"),
                                  class_name=str(entry.get("className", "")),
                                  validator_class_name=entry.get("classArgsValidator"),
                                  algo_type="assessor" if section == "assessor" else "tuner"))
    return metas


def _check_signature(cls: type, args: dict[str, object], path: str, name: str) -> None:
    params = inspect.signature(cls).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    known = [p for p in params if p != "self"]
    for key in args:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean `{close[0]}`? " if close else ""
            raise ConfigError(f"{path}.{key}", f"not an argument of {name}", f"{hint}use only: {', '.join(known)}")
