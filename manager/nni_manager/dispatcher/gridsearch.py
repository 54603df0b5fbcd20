"""NNI's GridSearch algorithm, ported from nni/algorithms/hpo/gridsearch_tuner.py (NNI 3.0) and
the search-space formatting it relies on (nni/common/hpo_utils/formatting.py), stdlib only.

Categorical parameters (choice, randint) are enumerated fully. Numerical ones are mapped to
[0, 1] (through the normal CDF for normal types, linearly in log space for log types) and
sampled progressively finer: the first epoch tries 0.5, each later epoch adds the midpoints of
the previous intervals, and only combinations not tried in an earlier epoch are proposed. A
quantised parameter stops being subdivided once neighbours round to the same value, so a
search space with only discrete values is eventually exhausted, as in NNI.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from statistics import NormalDist
from collections.abc import Mapping, Sequence
from typing import Any, cast

from nni_manager.types import SearchSpace

Key = tuple["str | int", ...]  # a parameter's path: names, and the option index inside a nested choice


@dataclass(frozen=True)
class Spec:
    """One parameter (NNI's ParameterSpec); for log types `low` / `high` are logarithms."""

    name: str
    type: str
    values: list[Any]
    key: Key
    categorical: bool
    size: int = 0
    low: float = 0.0
    high: float = 0.0
    normal_distributed: bool = False
    mu: float = 0.0
    sigma: float = 1.0
    q: float | None = None
    clip: tuple[float, float] | None = None
    log_distributed: bool = False

    def is_activated_in(self, partial: Mapping[Key, object]) -> bool:
        """In a nested choice, whether the parent picked the option this parameter belongs to."""
        if len(self.key) >= 2 and isinstance(self.key[-2], int):
            return partial[self.key[:-2]] == self.key[-2]
        return True


def format_search_space(space: SearchSpace, parent: Key = ()) -> dict[Key, Spec]:
    result: dict[Key, Spec] = {}
    for name, spec in space.items():
        if name == "_name":
            continue
        key = (*parent, name)
        result[key] = _format_parameter(key, spec["_type"], spec["_value"])
        if spec["_type"] == "choice" and _is_nested(spec["_value"]):
            for index, sub_space in enumerate(spec["_value"]):
                result.update(format_search_space(sub_space, (*parent, name, index)))
    return result


def _format_parameter(key: Key, kind: str, values: list[Any]) -> Spec:
    if kind in ("choice", "randint"):
        size = len(values) if kind == "choice" else math.ceil(float(values[1])) - math.ceil(float(values[0]))
        return Spec(str(key[-1]), kind, values, key, True, size=size)
    q = float(values[2]) if kind.startswith("q") else None
    log_distributed = "log" in kind
    if "normal" in kind:
        return Spec(str(key[-1]), kind, values, key, False, normal_distributed=True, mu=float(values[0]),
                    sigma=float(values[1]), q=q, log_distributed=log_distributed)
    low, high = float(values[0]), float(values[1])
    clip = (low, high) if q is not None else None
    if log_distributed:
        low, high = math.log(low), math.log(high)
    return Spec(str(key[-1]), kind, values, key, False, low=low, high=high, q=q, clip=clip,
                log_distributed=log_distributed)


def deformat_parameters(formatted: Mapping[Key, float], space: dict[Key, Spec]) -> dict[str, object]:
    """Internal values -> the user's parameters: indices to values, exp for log types, q rounding
    and clipping, nested choices as {"_name": ..., sub-parameters}."""
    result: dict[str, object] = {}
    for key, x in formatted.items():
        spec = space[key]
        if spec.categorical:
            if spec.type == "randint":
                _assign(result, key, int(min(math.ceil(float(v)) for v in spec.values) + x))
            elif _is_nested(spec.values):
                _assign(result, (*key, "_name"), spec.values[int(x)]["_name"])  # a categorical x is an index
            else:
                _assign(result, key, spec.values[int(x)])
        else:
            if spec.log_distributed:
                x = math.exp(x)
            if spec.q is not None:
                x = round(x / spec.q) * spec.q
            if spec.clip:
                x = min(max(x, spec.clip[0]), spec.clip[1])
            _assign(result, key, x)
    return result


def _is_nested(values: Sequence[object]) -> bool:
    return bool(values) and all(isinstance(v, dict) and "_name" in v for v in values)


def _assign(params: dict[str, object], key: Key, x: object) -> None:
    head = key[0]
    if isinstance(head, int):  # the option of a nested choice: its parameters sit beside `_name`
        _assign(params, key[1:], x)
    elif len(key) == 1:  # a key ends with a name
        params[head] = x
    else:
        inner = params.setdefault(head, {})
        assert isinstance(inner, dict)  # only _assign puts values here, and a name followed by more is a dict
        _assign(inner, key[1:], x)


class GridSearch:
    """The algorithm's state; `next()` gives the next new point, None once fully explored."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = format_search_space(space)
        if not self.space:
            raise ValueError("the search space is empty")
        self.specs = list(self.space.values())
        self.vector: list[int] | None = None
        self.history: set[str] = set()
        self.divisions: dict[int, list[tuple[float, float]]] = {}
        self.epoch_bar = [0] * len(self.specs)
        self.grid: list[list[float]] | None = []
        for i, spec in enumerate(self.specs):
            if spec.categorical:
                self.grid.append(list(range(spec.size)))
            else:
                self.grid.append([0.5])
                self.divisions[i] = [d for d in ((0.0, 0.5), (0.5, 1.0)) if _less(d[0], d[1], spec)]

    def next(self) -> dict[str, object] | None:
        while True:
            formatted = self._suggest()
            if formatted is None:
                return None
            params = deformat_parameters(formatted, self.space)
            text = json.dumps(params, sort_keys=True)
            if text not in self.history:
                self.history.add(text)
                return params

    def mark_tried(self, params: dict[str, object]) -> None:
        self.history.add(json.dumps(params, sort_keys=True))

    def _suggest(self) -> dict[Key, float] | None:
        while True:
            if self.grid is None:
                return None
            self._next_vector()
            if self.vector is None:  # this epoch is done: subdivide and go on
                self._next_grid()
                continue
            if all(self.vector[i] < self.epoch_bar[i] for i in range(len(self.specs))):
                continue  # tried in an earlier epoch
            return self._current()

    def _next_vector(self) -> None:
        assert self.grid is not None
        if self.vector is None:
            self.vector = [0] * len(self.specs)
            return
        params = self._current()
        active = [i for i, spec in enumerate(self.specs) if spec.is_activated_in(params)]
        for i in reversed(active):
            if self.vector[i] + 1 < len(self.grid[i]):
                self.vector[i] += 1
                return
            self.vector[i] = 0
        self.vector = None

    def _next_grid(self) -> None:
        assert self.grid is not None
        updated = False
        for i, spec in enumerate(self.specs):
            self.epoch_bar[i] = len(self.grid[i])
            if spec.categorical:
                continue
            new_values: list[float] = []
            new_divisions: list[tuple[float, float]] = []
            for left, right in self.divisions[i]:
                mid = (left + right) / 2
                diff_left, diff_right = _less(left, mid, spec), _less(mid, right, spec)
                if (diff_left or left == 0.0) and (diff_right or right == 1.0):
                    new_values.append(mid)
                    updated = True
                if diff_left:
                    new_divisions.append((left, mid))
                    updated = updated or left == 0.0
                if diff_right:
                    new_divisions.append((mid, right))
                    updated = updated or right == 1.0
            self.grid[i] += new_values
            self.divisions[i] = new_divisions
        if not updated:
            self.grid = None

    def _current(self) -> dict[Key, float]:
        assert self.grid is not None and self.vector is not None
        params: dict[Key, float] = {}  # categorical: the option's index; numerical: the point in [0, 1] mapped
        for i, spec in enumerate(self.specs):
            if spec.is_activated_in(params):
                x = self.grid[i][self.vector[i]]
                params[spec.key] = x if spec.categorical else _cdf_inverse(x, spec)
        return params


def _less(x: float, y: float, spec: Spec) -> bool:
    """Whether two grid positions give different (ordered) values once rounded as the user sees them."""
    return _real(_cdf_inverse(x, spec), spec) < _real(_cdf_inverse(y, spec), spec)


def _cdf_inverse(x: float, spec: Spec) -> float:
    if spec.normal_distributed:  # mu + sigma * sqrt(2) * erfinv(2x - 1), infinite at 0 and 1
        if x <= 0.0:
            return -math.inf
        if x >= 1.0:
            return math.inf
        return NormalDist(spec.mu, spec.sigma).inv_cdf(x)
    return spec.low + (spec.high - spec.low) * x


def _real(x: float, spec: Spec) -> float:
    if math.isinf(x):
        return x
    single = Spec(**{**spec.__dict__, "key": (spec.name,)})
    # cast: a numerical parameter deformats to the float computed from x
    return cast(float, deformat_parameters({single.key: x}, {single.key: single})[spec.name])
