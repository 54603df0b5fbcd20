"""Search-space sampling and grids, and the built-in tuners."""
from __future__ import annotations

import random

import pytest

from nni_manager.config import ConfigError, TunerConfig
from nni_manager.search_space import grid, sample, validate
from nni_manager.dispatcher.tuners import GridSearchTuner, RandomTuner, make_tuner

SPACE = {
    "opt": {"_type": "choice", "_value": [{"_name": "sgd", "momentum": {"_type": "uniform", "_value": [0.0, 0.9]}},
                                          {"_name": "adam"}, "rmsprop"]},
    "layers": {"_type": "randint", "_value": [1, 4]},
    "width": {"_type": "quniform", "_value": [10, 50, 15]},
    "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
    "steps": {"_type": "qloguniform", "_value": [1, 100, 10]},
    "drop": {"_type": "uniform", "_value": [0.1, 0.5]},
    "noise": {"_type": "normal", "_value": [0, 1]},
    "qn": {"_type": "qnormal", "_value": [5, 2, 1]},
    "ln": {"_type": "lognormal", "_value": [0, 0.5]},
    "qln": {"_type": "qlognormal", "_value": [2, 0.5, 2]},
}


def test_samples_stay_in_range_and_on_grid() -> None:
    validate(SPACE)
    rng = random.Random(7)
    for _ in range(300):
        p = sample(SPACE, rng)
        assert p["opt"] == "rmsprop" or p["opt"]["_name"] in ("sgd", "adam")
        if isinstance(p["opt"], dict) and p["opt"]["_name"] == "sgd":
            assert 0 <= p["opt"]["momentum"] <= 0.9
        assert p["layers"] in (1, 2, 3)  # randint's upper bound is exclusive
        assert p["width"] in (15, 30, 45)
        assert 1e-4 <= p["lr"] <= 1e-1
        assert p["steps"] in (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
        assert 0.1 <= p["drop"] <= 0.5 and p["ln"] > 0
        assert p["qn"] == int(p["qn"]) and p["qln"] % 2 == 0


def test_sampling_is_seeded() -> None:
    assert sample(SPACE, random.Random(1)) == sample(SPACE, random.Random(1))
    assert sample(SPACE, random.Random(1)) != sample(SPACE, random.Random(2))


def test_grid_exact_for_discrete_types() -> None:
    space = {k: SPACE[k] for k in ("layers", "width", "steps")}
    points = list(grid(space))
    assert len(points) == 3 * 3 * 11  # quniform [10, 50, 15] rounds to 15, 30, 45 only
    assert sorted({p["width"] for p in points}) == [15, 30, 45]
    assert sorted({p["steps"] for p in points}) == [1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    # every value random sampling can produce is a grid point
    rng = random.Random(3)
    assert {p["width"] for p in (sample(space, rng) for _ in range(200))} <= {p["width"] for p in points}


def test_grid_nested_choice_and_continuous() -> None:
    points = list(grid({"opt": SPACE["opt"], "drop": SPACE["drop"], "lr": SPACE["lr"]}, points=3))
    opts = [p["opt"] for p in points]
    assert len(points) == (3 + 1 + 1) * 3 * 3
    assert {"_name": "sgd", "momentum": 0.45} in opts and {"_name": "adam"} in opts and "rmsprop" in opts
    assert sorted({p["drop"] for p in points}) == pytest.approx([0.1, 0.3, 0.5])
    assert sorted({p["lr"] for p in points}) == pytest.approx([1e-4, 10 ** -2.5, 1e-1])
    normals = sorted({p["noise"] for p in grid({"noise": SPACE["noise"]}, points=3)})
    assert normals[1] == pytest.approx(0) and normals[0] == pytest.approx(-normals[2])


def test_nested_space_errors_name_the_path() -> None:
    bad = {"opt": {"_type": "choice", "_value": [{"_name": "sgd", "lr": {"_type": "uniform", "_value": [1]}}]}}
    with pytest.raises(ConfigError) as info:
        validate(bad)
    assert info.value.field == "searchSpace.opt._value[0].lr._value"


def test_random_tuner_seeded_and_avoids_repeats() -> None:
    space = {"a": {"_type": "choice", "_value": [1, 2, 3]}}
    tuner = make_tuner(TunerConfig("Random", {"seed": 5}), space)
    assert isinstance(tuner, RandomTuner)
    assert sorted(tuner.generate_parameters(i)["a"] for i in range(3)) == [1, 2, 3]
    other = make_tuner(TunerConfig("random", {"seed": 5}), space)
    assert [other.generate_parameters(i) for i in range(3)] != [] and other.optimize_mode == "maximize"


def test_grid_tuner_exhausts() -> None:
    tuner = make_tuner(TunerConfig("GridSearch", {"optimize_mode": "minimize"}),
                       {"a": {"_type": "randint", "_value": [0, 3]}})
    assert isinstance(tuner, GridSearchTuner)
    assert [tuner.generate_parameters(i) for i in range(4)] == [{"a": 0}, {"a": 1}, {"a": 2}, None]
    assert tuner.better(0.1, 0.2) and not tuner.better(0.3, 0.2) and tuner.better(5.0, None)


@pytest.mark.parametrize("tuner,space,field,fix", [
    (TunerConfig("TPE"), {}, "tuner.name", "Random, GridSearch"),
    (TunerConfig("Random", {"optimize_mode": "max"}), {}, "tuner.classArgs.optimize_mode", "maximize"),
    (TunerConfig("Random", {"seed": "x"}), {}, "tuner.classArgs.seed", "seed: 42"),
    (TunerConfig("GridSearch", {"seed": 1}), {}, "tuner.classArgs.seed", "optimize_mode"),
    (None, {}, "tuner", "name: Random"),
    (TunerConfig("Random"), None, "searchSpace", "searchSpaceFile"),
])
def test_tuner_mistakes(tuner: TunerConfig | None, space: dict | None, field: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_tuner(tuner, space)
    assert info.value.field == field and fix in info.value.fix


def test_import_data_skips_tried_points() -> None:
    space = {"a": {"_type": "randint", "_value": [0, 3]}}
    grid_tuner = make_tuner(TunerConfig("GridSearch"), space)
    grid_tuner.import_data([{"parameter": {"a": 1}, "value": 0.5}, {"parameter": {"a": 0}, "value": None}])
    assert [grid_tuner.generate_parameters(i) for i in range(2)] == [{"a": 2}, None]
    random_tuner = make_tuner(TunerConfig("Random", {"seed": 1}), space)
    random_tuner.import_data([{"parameter": {"a": 1}, "value": 0.5}, {"parameter": {"a": 0}, "value": None}])
    assert random_tuner.generate_parameters(0) == {"a": 2}
