"""Optuna studies run by the agents (docs/optuna.md): study.py (the command's experiment),
storage.py (the study's storage served to the trials). Optuna is imported only when used."""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nni_manager.config import ConfigError
from nni_manager.experiment import ExperimentResult

__all__ = ["optimize"]


def optimize(study: Any, target: str, *, n_trials: int, config: str | Path | Mapping[str, Any],
             experiment_id: str | None = None) -> ExperimentResult:
    """Run `n_trials` trials of `study` (an `optuna.Study`) with the objective `target`
    (`file.py:function` or `module:function` in trialCodeDirectory) on the platform of `config`
    (a CONFIG.yml path or the same as a mapping), as `nni-manager optuna` does; returns at the end.
    The manager serves the study's own storage object to the trials; its sampler and pruner are
    made again, with their default arguments, in each trial's process (Optuna's distributed mode)."""
    from nni_manager.optuna.study import StudyExperiment, StudySpec, check_spec, study_config
    from nni_manager.startup import preflight

    names = []
    for kind, obj in (("samplers", study.sampler), ("pruners", study.pruner)):
        import optuna

        name = type(obj).__name__
        if getattr(getattr(optuna, kind), name, None) is not type(obj):
            raise ConfigError("study", f"its {kind[:-1]} {name} is not one of optuna.{kind}",
                              f"use a class of optuna.{kind} (each trial makes it again, with default arguments)")
        names.append(name)
    spec = StudySpec(target, study.study_name, "", n_trials, [d.name.lower() for d in study.directions], *names)
    check_spec(spec)
    cfg = study_config(config if isinstance(config, Mapping) else Path(config), spec)
    preflight(cfg, tuner=False)
    source = dict(config) if isinstance(config, Mapping) else str(Path(config).expanduser().resolve())
    return asyncio.run(StudyExperiment(cfg, study=spec, storage=study._storage, source=source,
                                       experiment_id=experiment_id).run())
