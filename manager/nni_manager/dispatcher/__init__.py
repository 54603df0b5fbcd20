"""Tuners, assessors and advisors for the experiment loop.

With the `nni` package importable, every algorithm runs in NNI's own dispatcher process
(`nni_process.NniDispatcher`), so all of NNI's built-in names and customised classes behave
exactly as under NNI. Without it, the built-in Random and GridSearch run in process
(`base.BuiltinDispatcher`) and any other name is a config error saying `pip install nni`.
`NNI_MANAGER_BUILTIN_TUNERS=1` (a test knob) runs Random and GridSearch without an assessor in
process even where nni is installed (NNI's dispatcher costs seconds of CPU to import `nni` and up to
3 s to exit); every other algorithm still runs in NNI's dispatcher.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from nni_manager.config import ConfigError, ExperimentConfig, TunerConfig
from nni_manager.dispatcher.base import (
    BuiltinDispatcher,
    Dispatcher,
    DispatcherError,
    DispatcherEvents,
    parameter_record,
)

__all__ = ["BuiltinDispatcher", "Dispatcher", "DispatcherError", "DispatcherEvents", "make_dispatcher",
           "nni_available", "parameter_record"]


def nni_available() -> bool:
    """Whether NNI's dispatcher (`python -m nni`) can run with this Python."""
    return importlib.util.find_spec("nni") is not None


def _in_process(config: ExperimentConfig) -> bool:
    """Whether the built-in dispatcher runs this experiment's algorithms."""
    if not nni_available():
        return True
    if os.environ.get("NNI_MANAGER_BUILTIN_TUNERS", "") in ("", "0"):
        return False
    from nni_manager.dispatcher.tuners import BUILTIN

    tuner = config.tuner
    return (tuner is not None and not tuner.class_name and tuner.kind != "advisor" and config.assessor is None
            and tuner.name.lower() in {n.lower() for n in BUILTIN})


def check_algorithms(config: ExperimentConfig) -> None:
    """Config errors that need no process: a missing tuner / search space, or (without nni)
    an algorithm only NNI has."""
    if config.tuner is None:
        raise ConfigError("tuner", "is required", "add `tuner: {name: TPE}` (or Random, GridSearch, ...)")
    if config.search_space is None:
        raise ConfigError("searchSpace", "is required to run an experiment",
                          "add `searchSpace:` inline or `searchSpaceFile: search_space.json`")
    if not _in_process(config):
        from nni_manager.dispatcher.algorithms import check_nni_algorithm

        check_nni_algorithm(config.tuner, "advisor" if config.tuner.kind == "advisor" else "tuner")
        if config.assessor is not None:
            check_nni_algorithm(config.assessor, "assessor")
        return
    from nni_manager.dispatcher.tuners import BUILTIN, make_tuner

    where = "advisor" if config.tuner.kind == "advisor" else "tuner"
    if config.tuner.class_name:
        raise ConfigError(f"{where}.className", "customised algorithms run in NNI's dispatcher, and the `nni` "
                          "package is not installed", "`pip install nni` next to nni-manager")
    if config.tuner.name.lower() not in {n.lower() for n in BUILTIN} or where == "advisor":
        raise ConfigError(f"{where}.name", f"{config.tuner.name!r} is one of NNI's algorithms, and the `nni` package "
                          "is not installed", f"`pip install nni` next to nni-manager, or use a built-in tuner: "
                          f"{', '.join(BUILTIN)}")
    if config.assessor is not None:
        raise ConfigError("assessor", "assessors run in NNI's dispatcher, and the `nni` package is not installed",
                          "`pip install nni` next to nni-manager, or remove the assessor")
    make_tuner(config.tuner, config.search_space)  # its classArgs, before start


def optimize_mode(config: ExperimentConfig) -> str:
    mode = (config.tuner.class_args if config.tuner else {}).get("optimize_mode", "maximize")
    return "minimize" if mode == "minimize" else "maximize"


def _algorithm_json(algo: TunerConfig) -> dict[str, object]:
    """NNI's canonical form of an algorithm config (`ExperimentConfig.json()`)."""
    if algo.class_name:
        return {"className": algo.class_name, "codeDirectory": str(algo.code_directory), "classArgs": algo.class_args}
    return {"name": algo.name, "classArgs": algo.class_args}


def make_dispatcher(config: ExperimentConfig, experiment_dir: Path, *, resume: bool = False) -> Dispatcher:
    """The dispatcher for the configured algorithms (a ConfigError before any work)."""
    check_algorithms(config)
    tuner = config.tuner
    assert tuner is not None
    if _in_process(config):
        from nni_manager.dispatcher.tuners import make_tuner

        return BuiltinDispatcher(make_tuner(tuner, config.search_space), tuner.name)
    from nni_manager.dispatcher.nni_process import NniDispatcher

    exp_params: dict[str, object] = {"experimentType": "hpo", "trialConcurrency": config.trial_concurrency,
                                  "tuner": _algorithm_json(tuner)}
    if config.assessor is not None:
        exp_params["assessor"] = _algorithm_json(config.assessor)
    name = tuner.name or tuner.class_name or "tuner"
    if config.assessor is not None:
        name += f" + {config.assessor.name or config.assessor.class_name}"
    return NniDispatcher(name, optimize_mode(config), exp_params, log_dir=experiment_dir / "log",
                         checkpoint_dir=experiment_dir / "checkpoint", log_level=config.log_level,
                         include_intermediate_results=tuner.include_intermediate_results, resume=resume,
                         tuner_gpu_indices=config.tuner_gpu_indices)
