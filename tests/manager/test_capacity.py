"""`service/capacity.plan`: the elastic platforms' decisions (which environments to ask for, which
to give back) as a pure function of the picture and the clock, which the tests pass in."""
from __future__ import annotations

from nni_manager.service.agents import FAILED, PROVISIONING, READY, RELEASED, Environment
from nni_manager.service.capacity import IDLE_RELEASE_S, plan
from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail, TrialJobStatus

NOW = 1000.0


def env(env_id: str, state: str = READY, trial: str | None = None, since: float = NOW) -> Environment:
    return Environment(env_id, [env_id], trial, state=state, since=since)


def waiting(*ids: str) -> list[TrialJobDetail]:
    return [TrialJobDetail(i, TrialJobStatus.WAITING, 0, TrialJobApplicationForm(n, HyperParameters("{}")), n)
            for n, i in enumerate(ids)]


def test_pool_grows_with_waiting_trials_up_to_the_limit() -> None:
    p = plan([], {}, waiting("a", "b", "c"), limit=2, reuse=True, now=NOW)
    assert p.provision == [None, None] and p.release == []


def test_pool_counts_free_and_provisioning_environments_before_asking_for_more() -> None:
    envs = [env("env1"), env("env2", PROVISIONING), env("env3")]
    # env1 is busy; env2 (coming) and env3 (idle) take two of the three waiting trials
    p = plan(envs, {"env1": "t0"}, waiting("a", "b", "c"), limit=5, reuse=True, now=NOW)
    assert p.provision == [None]


def test_ended_environments_do_not_count_against_the_limit() -> None:
    envs = [env("env1", FAILED), env("env2", RELEASED)]
    assert plan(envs, {}, waiting("a", "b"), limit=2, reuse=True, now=NOW).provision == [None, None]


def test_idle_pool_environment_is_released_only_after_the_idle_time_and_when_nothing_waits() -> None:
    envs = [env("env1", since=NOW), env("env2", since=NOW - 5), env("busy", since=NOW - 100)]
    busy = {"busy": "t9"}
    assert plan(envs, busy, [], limit=3, reuse=True, now=NOW + 1).release == []  # none idle that long yet
    # env1 is idle exactly IDLE_RELEASE_S: not longer than it, so kept
    assert plan(envs, busy, [], limit=3, reuse=True, now=NOW + IDLE_RELEASE_S).release == ["env2"]
    later = NOW + IDLE_RELEASE_S + 1
    assert plan(envs, busy, [], limit=3, reuse=True, now=later).release == ["env1", "env2"]
    assert plan(envs, busy, [], limit=3, reuse=True, now=NOW + 6, idle_release=10.0).release == ["env2"]
    assert plan(envs, busy, waiting("a"), limit=3, reuse=True, now=later).release == []  # a trial waits


def test_provisioning_environment_is_never_released_as_idle() -> None:
    p = plan([env("env1", PROVISIONING, since=0.0)], {}, [], limit=1, reuse=True, now=NOW)
    assert p.release == []


def test_one_environment_per_trial_in_submission_order_within_the_limit() -> None:
    envs = [env("trial-a", PROVISIONING, trial="a")]
    p = plan(envs, {}, waiting("a", "b", "c", "d"), limit=3, reuse=False, now=NOW)
    assert p.provision == ["b", "c"]  # a has its environment already; d waits for room


def test_one_trial_environment_is_released_when_its_trial_is_over_and_its_agents_left() -> None:
    envs = [env("trial-a", trial="a"), env("trial-b", trial="b"), env("trial-c", PROVISIONING, trial="c"),
            env("trial-d", trial="d")]
    # a runs; b's trial ended (not busy, not waiting); c's trial waits again; d's agents are still exiting
    p = plan(envs, {"trial-a": "a"}, waiting("c"), limit=4, reuse=False, now=NOW, exiting=frozenset({"trial-d"}))
    assert p.release == ["trial-b"] and p.provision == []


def test_plan_is_pure() -> None:
    envs = [env("env1", since=NOW - 60)]
    first = plan(envs, {}, [], limit=1, reuse=True, now=NOW)
    assert first == plan(envs, {}, [], limit=1, reuse=True, now=NOW) and first.release == ["env1"]
    assert envs[0].state == READY and envs[0].since == NOW - 60  # the picture is not changed
