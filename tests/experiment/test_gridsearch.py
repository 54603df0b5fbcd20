"""The built-in GridSearch (used without nni) proposes exactly what NNI 3.0's GridSearchTuner does."""
from __future__ import annotations

import math

import pytest

from nni_manager.dispatcher.gridsearch import GridSearch

SPACES = [
    {"x": {"_type": "choice", "_value": [1, 2, 3]}, "lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}},
    {"a": {"_type": "quniform", "_value": [0, 10, 2]}, "b": {"_type": "randint", "_value": [1, 4]}},
    {"n": {"_type": "normal", "_value": [0, 1]}, "q": {"_type": "qlognormal", "_value": [1, 0.5, 1]}},
    {"m": {"_type": "choice", "_value": [{"_name": "A", "u": {"_type": "uniform", "_value": [0, 1]}}, {"_name": "B"}]}},
]


def _close(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("space", SPACES)
def test_same_points_in_the_same_order_as_nni(space) -> None:
    nni = pytest.importorskip("nni")
    from nni.algorithms.hpo.gridsearch_tuner import GridSearchTuner

    theirs = GridSearchTuner()
    theirs.update_search_space(space)
    ours = GridSearch(space)
    for i in range(60):
        try:
            expected = theirs.generate_parameters(i)
        except nni.NoMoreTrialError:
            expected = None
        got = ours.next()
        assert _close(got, expected), (i, got, expected)
        if expected is None:
            break


def test_progressive_refinement_without_nni() -> None:
    grid = GridSearch({"lr": {"_type": "uniform", "_value": [0, 1]}})
    assert [grid.next()["lr"] for _ in range(5)] == [0.5, 0.25, 0.75, 0.125, 0.375]
    discrete = GridSearch({"a": {"_type": "quniform", "_value": [0, 4, 2]}})
    assert sorted(p["a"] for p in iter(discrete.next, None)) == [0, 2, 4]  # exhausted once nothing is new
