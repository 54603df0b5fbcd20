"""NNI's search-space format: validation, seeded sampling and grid enumeration.

A search space maps parameter names to `{"_type": ..., "_value": [...]}`. A `choice`
option that is a mapping with `_name` is a nested search space: picking it yields
`{"_name": name, <its parameters sampled>}`, like NNI's built-in tuners.
"""
from __future__ import annotations

import difflib
import itertools
import math
import random
from collections.abc import Iterator
from statistics import NormalDist
from typing import Any

from nni_manager.types import ParameterSpec, SearchSpace
from nni_manager.config import ConfigError

# _type -> (number of _value items, a usage example for error messages)
TYPES: dict[str, tuple[int, str]] = {
    "choice": (0, "[16, 32, 64]"),
    "randint": (2, "[lower, upper)  e.g. [1, 10]"),
    "uniform": (2, "[low, high]  e.g. [0.1, 0.9]"),
    "quniform": (3, "[low, high, q]  e.g. [0, 100, 10]"),
    "loguniform": (2, "[low, high] with low > 0  e.g. [0.0001, 0.1]"),
    "qloguniform": (3, "[low, high, q] with low > 0  e.g. [1, 1000, 1]"),
    "normal": (2, "[mu, sigma]  e.g. [0, 1]"),
    "qnormal": (3, "[mu, sigma, q]  e.g. [0, 1, 0.1]"),
    "lognormal": (2, "[mu, sigma]  e.g. [0, 1]"),
    "qlognormal": (3, "[mu, sigma, q]  e.g. [0, 1, 1]"),
}


def validate(space: object, path: str = "searchSpace") -> None:
    """Raise ConfigError naming the first wrong entry (e.g. `searchSpace.lr._value`)."""
    if not isinstance(space, dict):
        raise ConfigError(path, "must be a mapping of parameter names to {_type, _value}",
                          "write e.g. `lr: {_type: loguniform, _value: [0.0001, 0.1]}`")
    for name, spec in space.items():
        _validate_param(spec, f"{path}.{name}")


def _validate_param(spec: object, path: str) -> None:
    if not isinstance(spec, dict) or "_type" not in spec or "_value" not in spec:
        raise ConfigError(path, "must be a mapping with `_type` and `_value`",
                          "write e.g. `{_type: choice, _value: [1, 2, 3]}`")
    extra = sorted(set(spec) - {"_type", "_value"})
    if extra:
        raise ConfigError(f"{path}.{extra[0]}", "unknown key in a parameter", "keep only _type and _value")
    kind, value = spec["_type"], spec["_value"]
    if kind not in TYPES:
        close = difflib.get_close_matches(str(kind), TYPES, n=1)
        hint = f"did you mean `{close[0]}`? " if close else ""
        raise ConfigError(f"{path}._type", f"unknown type {kind!r}", f"{hint}use one of: {', '.join(TYPES)}")
    count, example = TYPES[kind]
    vpath = f"{path}._value"
    if not isinstance(value, list):
        raise ConfigError(vpath, f"must be a list for {kind}", f"write `_value: {example}`")
    if kind == "choice":
        if not value:
            raise ConfigError(vpath, "choice needs at least one option", "list the options, e.g. [16, 32, 64]")
        for i, option in enumerate(value):
            if isinstance(option, dict) and "_name" in option:
                validate({k: v for k, v in option.items() if k != "_name"}, f"{vpath}[{i}]")
        return
    if len(value) != count or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ConfigError(vpath, f"{kind} takes {count} numbers", f"write `_value: {example}`")
    a, b = value[0], value[1]
    if kind in ("normal", "qnormal", "lognormal", "qlognormal"):
        if b <= 0:
            raise ConfigError(vpath, f"sigma must be > 0, got {b}", f"write `_value: {example}`")
    elif a >= b:
        raise ConfigError(vpath, f"the lower bound {a} must be below the upper bound {b}", f"write `_value: {example}`")
    if kind == "randint" and not all(isinstance(v, int) for v in value):
        raise ConfigError(vpath, "randint bounds must be integers", f"write `_value: {example}`")
    if kind in ("loguniform", "qloguniform") and a <= 0:
        raise ConfigError(vpath, f"{kind} needs a lower bound > 0, got {a}", f"write `_value: {example}`")
    if count == 3 and value[2] <= 0:
        raise ConfigError(vpath, f"q must be > 0, got {value[2]}", f"write `_value: {example}`")


def _quantize(x: float, q: float, low: float | None = None, high: float | None = None) -> float:
    """NNI's q-rule: round(x / q) * q, clipped to [low, high] for bounded types."""
    value = _clean(round(x / q) * q)
    if low is not None and high is not None:
        value = float(min(max(value, low), high))
    return value


def _clean(x: float) -> float:
    """Drop float noise (0.30000000000000004 -> 0.3) so samples and grid points compare equal."""
    return float(f"{x:.12g}")


def sample(space: SearchSpace, rng: random.Random) -> dict[str, object]:
    """One random point of a validated search space."""
    return {name: _sample_param(spec, rng) for name, spec in space.items()}


def _sample_param(spec: ParameterSpec, rng: random.Random) -> object:
    kind, v = spec["_type"], spec["_value"]
    if kind == "choice":
        return _option(rng.choice(v), rng)
    if kind == "randint":
        return rng.randrange(v[0], v[1])
    if kind == "uniform":
        return rng.uniform(v[0], v[1])
    if kind == "quniform":
        return _quantize(rng.uniform(v[0], v[1]), v[2], v[0], v[1])
    if kind == "loguniform":
        return math.exp(rng.uniform(math.log(v[0]), math.log(v[1])))
    if kind == "qloguniform":
        return _quantize(math.exp(rng.uniform(math.log(v[0]), math.log(v[1]))), v[2], v[0], v[1])
    if kind == "normal":
        return rng.gauss(v[0], v[1])
    if kind == "qnormal":
        return _quantize(rng.gauss(v[0], v[1]), v[2])
    if kind == "lognormal":
        return math.exp(rng.gauss(v[0], v[1]))
    return _quantize(math.exp(rng.gauss(v[0], v[1])), v[2])  # qlognormal


def _option(option: object, rng: random.Random) -> object:
    if isinstance(option, dict) and "_name" in option:
        nested = {k: s for k, s in option.items() if k != "_name"}
        return {"_name": option["_name"], **sample(nested, rng)}
    return option


def grid(space: SearchSpace, points: int = 5) -> Iterator[dict[str, Any]]:
    """Every combination of per-parameter grids, in order. Discrete types (choice, randint,
    quniform, qloguniform) are enumerated exactly; continuous ones get `points` evenly
    spaced values (in log space for log types, by quantiles for normal types)."""
    names = list(space)
    axes = [_axis(space[name], points) for name in names]
    for combo in itertools.product(*axes):
        yield dict(zip(names, combo))


def _axis(spec: ParameterSpec, points: int) -> list[Any]:
    kind, v = spec["_type"], spec["_value"]
    if kind == "choice":
        values: list[Any] = []
        for option in v:
            if isinstance(option, dict) and "_name" in option:
                nested = {k: s for k, s in option.items() if k != "_name"}
                values.extend({"_name": option["_name"], **point} for point in grid(nested, points))
            else:
                values.append(option)
        return values
    if kind == "randint":
        return list(range(v[0], v[1]))
    if kind in ("quniform", "qloguniform"):
        low, high, q = v
        inner = [_clean(k * q) for k in range(math.ceil(low / q), math.floor(high / q) + 1)]
        return _unique([_quantize(x, q, low, high) for x in (low, *inner, high)])
    if kind == "uniform":
        return _linspace(v[0], v[1], points)
    if kind == "loguniform":
        return [math.exp(x) for x in _linspace(math.log(v[0]), math.log(v[1]), points)]
    quantiles = [NormalDist(v[0], v[1]).inv_cdf((i + 0.5) / points) for i in range(points)]
    if kind == "normal":
        return quantiles
    if kind == "qnormal":
        return _unique([_quantize(x, v[2]) for x in quantiles])
    if kind == "lognormal":
        return [math.exp(x) for x in quantiles]
    return _unique([_quantize(math.exp(x), v[2]) for x in quantiles])  # qlognormal


def _linspace(low: float, high: float, points: int) -> list[float]:
    if points == 1:
        return [(low + high) / 2]
    return [low + (high - low) * i / (points - 1) for i in range(points)]


def _unique(values: list[Any]) -> list[Any]:
    return sorted(set(values))
