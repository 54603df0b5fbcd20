"""Built-in tuners, used when the `nni` package is not installed (with it, every tuner runs in
NNI's own dispatcher: see `nni_manager.dispatcher`).

The interface follows NNI's Tuner (generate_parameters / receive_trial_result /
trial_end / update_search_space). Built in: Random, and GridSearch (NNI's algorithm, ported).
"""
from __future__ import annotations

import json
import random
from typing import TypedDict

from nni_manager.types import SearchSpace
from nni_manager import search_space as ss
from nni_manager.config import ConfigError, TunerConfig
from nni_manager.dispatcher.gridsearch import GridSearch
from nni_manager.metrics import metric_number

OPTIMIZE_MODES = ("maximize", "minimize")


class ImportedTrial(TypedDict):
    """An earlier trial as NNI's IMPORT_DATA carries it (a resumed experiment)."""

    parameter: dict[str, object]
    value: object  # the final result as reported: a number, or a dict whose "default" is one


class Tuner:
    """Base class; `optimize_mode` decides which trial is best."""

    class_args: tuple[str, ...] = ("optimize_mode",)

    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize") -> None:
        self.space = space
        self.optimize_mode = optimize_mode

    def generate_parameters(self, parameter_id: int) -> dict[str, object] | None:
        """Parameters for a new trial, or None once the tuner has nothing more to try."""
        raise NotImplementedError

    def receive_trial_result(self, parameter_id: int, parameters: dict[str, object], value: float) -> None:
        """A trial's final metric (the number, or the dict's "default")."""

    def trial_end(self, parameter_id: int, success: bool) -> None:
        """A trial ended (also without a final metric)."""

    def update_search_space(self, space: SearchSpace) -> None:
        """A new search space (NNI's UPDATE_SEARCH_SPACE)."""
        self.space = space

    def import_data(self, data: list[ImportedTrial]) -> None:
        """Earlier trials (a resumed experiment), NNI's format: [{"parameter": {...}, "value": x | None}]."""
        for item in data:
            value = metric_number(item["value"])  # the number receive_trial_result takes, as report_metric gives it
            if value is not None:
                self.receive_trial_result(-1, item["parameter"], value)

    def better(self, a: float, b: float | None) -> bool:
        """Whether metric `a` beats `b` under this tuner's optimize_mode."""
        return b is None or (a > b if self.optimize_mode == "maximize" else a < b)


class RandomTuner(Tuner):
    """Independent random samples; avoids repeating a point while unseen ones turn up."""

    class_args = ("optimize_mode", "seed")
    _RETRIES = 100

    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize", seed: int | None = None) -> None:
        super().__init__(space, optimize_mode)
        self._rng = random.Random(seed)
        self._seen: set[str] = set()

    def generate_parameters(self, parameter_id: int) -> dict[str, object]:
        for _ in range(self._RETRIES):
            params = ss.sample(self.space, self._rng)
            key = _key(params)
            if key not in self._seen:
                break
        self._seen.add(key)
        return params

    def import_data(self, data: list[ImportedTrial]) -> None:
        super().import_data(data)
        self._seen.update(_key(item["parameter"]) for item in data)


class GridSearchTuner(Tuner):
    """NNI's GridSearch (nni_manager.dispatcher.gridsearch): every combination of categorical values, and
    numerical parameters sampled progressively finer; exhausted once nothing new is left."""

    def __init__(self, space: SearchSpace, optimize_mode: str = "maximize") -> None:
        super().__init__(space, optimize_mode)
        self._grid = GridSearch(space)

    def update_search_space(self, space: SearchSpace) -> None:
        super().update_search_space(space)
        self._grid = GridSearch(space)

    def generate_parameters(self, parameter_id: int) -> dict[str, object] | None:
        return self._grid.next()

    def import_data(self, data: list[ImportedTrial]) -> None:
        super().import_data(data)
        for item in data:
            self._grid.mark_tried(item["parameter"])


def _key(params: dict[str, object]) -> str:
    return json.dumps(params, sort_keys=True)


BUILTIN: dict[str, type[Tuner]] = {"Random": RandomTuner, "GridSearch": GridSearchTuner}


def make_tuner(config: TunerConfig | None, space: SearchSpace | None) -> Tuner:
    """Build the configured tuner; every mistake is a ConfigError naming the field."""
    if config is None:
        raise ConfigError("tuner", "is required", "add `tuner: {name: Random}` (or GridSearch)")
    if space is None:
        raise ConfigError("searchSpace", "is required to run an experiment",
                          "add `searchSpace:` inline or `searchSpaceFile: search_space.json`")
    by_lower = {name.lower(): cls for name, cls in BUILTIN.items()}
    cls = by_lower.get(config.name.lower())
    if cls is None:
        raise ConfigError("tuner.name", f"unknown tuner {config.name!r}: without the `nni` package only the built-in "
                          f"tuners run", f"`pip install nni` for all of NNI's algorithms, or use one of: {', '.join(BUILTIN)}")
    args = dict(config.class_args)
    for key in args:
        if key not in cls.class_args:
            raise ConfigError(f"tuner.classArgs.{key}", f"not an argument of {config.name}",
                              f"use only: {', '.join(cls.class_args)}")
    mode = args.get("optimize_mode", "maximize")
    if mode not in OPTIMIZE_MODES:
        raise ConfigError("tuner.classArgs.optimize_mode", f"must be maximize or minimize, got {mode!r}",
                          "write `optimize_mode: maximize` (or minimize)")
    seed = args.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError("tuner.classArgs.seed", "must be an integer", "write e.g. `seed: 42`")
    return cls(space, **args)
