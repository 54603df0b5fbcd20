"""NNI's built-in algorithms checked before start, as NNI 2.x's nnictl did: the name (with a
did-you-mean), the kind (an assessor named as the tuner), and the classArgs, by NNI's own
ClassArgsValidator where the algorithm has one, else by its constructor's parameters. Without
this, a misspelled tuner failed in NNI's dispatcher process after the experiment had started."""
from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any

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
    from nni.tools.package_utils import config_manager

    kind = "assessor" if algo.kind == "assessor" else "tuner"
    metas = config_manager.get_all_algo_meta()
    meta = config_manager.get_algo_meta(algo.name)
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
    validator_name = getattr(meta, "validator_class_name", None)
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


def _check_signature(cls: Any, args: dict[str, Any], path: str, name: str) -> None:
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    known = [p for p in params if p != "self"]
    for key in args:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean `{close[0]}`? " if close else ""
            raise ConfigError(f"{path}.{key}", f"not an argument of {name}", f"{hint}use only: {', '.join(known)}")
