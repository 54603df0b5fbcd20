"""Placement as pure logic: GPU knobs, NNI's bugs fixed, a reason for every waiting trial."""
from __future__ import annotations

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import PlacementHints
from nni_manager.service.placement import AgentView, Placer, Request
from tests.support.manager.placement import gpus


def agent(name: str = "local", n: int | None = 2, connected: bool = True, **kw: object) -> AgentView:
    hints = PlacementHints(**{k: v for k, v in kw.items() if k in ("gpu_indices", "max_trial_number_per_gpu", "use_active_gpu")})
    rest = {k: v for k, v in kw.items() if k in ("trials", "pids", "gpus")}
    rest.setdefault("gpus", None if n is None else gpus(n))
    return AgentView(agent_id=name, name=name, connected=connected, hints=hints, **rest)


def place(reqs: list[tuple[str, int | None]], agents: list[AgentView]):
    return Placer().place([Request(t, n) for t, n in reqs], agents)


def test_no_scheduling_and_zero_gpus() -> None:
    a, b = place([("t1", None), ("t2", 0)], [agent()])
    assert (a.agent_id, a.scheduled) == ("local", False)
    assert (b.agent_id, b.scheduled, b.gpu_indices) == ("local", True, ())


def test_concurrency_without_gpus_is_not_limited() -> None:
    ds = place([(f"t{i}", None) for i in range(10)], [agent(n=None)])
    assert all(d.agent_id == "local" for d in ds)


def test_waiting_for_agent() -> None:
    [d] = place([("t1", 1)], [agent(connected=False)])
    assert d.agent_id is None and not d.failed
    assert d.message == "waiting for an agent to connect"


def test_all_gpus_of_a_machine_works() -> None:
    [d] = place([("t1", 2)], [agent(n=2)])
    assert d.gpu_indices == (0, 1)


def test_too_many_gpus_fails_at_once_naming_capacity() -> None:
    [d] = place([("t1", 3)], [agent(n=2), agent("w2", n=1)])
    assert d.failed
    assert "needs 3 GPUs but no agent has that many" in d.message
    assert "local has 2 usable GPUs" in d.message and "w2 has 1 usable GPU," in d.message


def test_no_gpu_provider_says_why() -> None:
    report = pb.GpuReport(provider="none", unavailable_reason="NVML library not found")
    [d] = place([("t1", 1)], [agent(gpus=report)])
    assert d.failed and "local has no GPUs: NVML library not found" in d.message


def test_unknown_gpu_info_waits() -> None:
    [d] = place([("t1", 1)], [agent(n=None)])
    assert not d.failed and d.message == "waiting: no GPU information from local yet"


def test_fractional_sharing_per_device() -> None:
    ds = place([(f"t{i}", 1) for i in range(5)], [agent(n=2, max_trial_number_per_gpu=2)])
    placed = [d.gpu_indices for d in ds[:4]]
    assert sorted(placed) == [(0,), (0,), (1,), (1,)]
    assert ds[4].agent_id is None
    assert ds[4].message == "waiting for a GPU: all 2 GPUs of local are taken by trials t0, t1, t2, t3"


def test_two_gpu_trial_takes_two_devices_with_free_slots() -> None:
    a = agent(n=3, max_trial_number_per_gpu=2, trials={"old": (0,)})
    [d] = place([("t1", 2)], [a])
    assert d.gpu_indices == (1, 2)  # least occupied first


def test_existing_trials_occupy() -> None:
    a = agent(n=2, trials={"abc12": (0,), "def34": (1,)})
    [d] = place([("t1", 1)], [a])
    assert d.message == "waiting for a GPU: all 2 GPUs of local are taken by trials abc12, def34"


def test_gpu_indices_restrict_and_missing_index_is_named() -> None:
    [d] = place([("t1", 1)], [agent(n=2, gpu_indices=(1,))])
    assert d.gpu_indices == (1,)
    [d] = place([("t1", 1)], [agent(n=2, gpu_indices=(3,))])
    assert d.failed and "gpuIndices lists GPU 3 but local has GPUs 0-1" in d.message


def test_active_gpu() -> None:
    [d] = place([("t1", 1)], [agent(gpus=gpus(2, active=(0, 1)), gpu_indices=(1,))])
    assert d.message == "waiting: GPU 1 of local is active (used by a process outside this experiment) and useActiveGpu is false"
    [d] = place([("t1", 1)], [agent(gpus=gpus(2, active=(0,)))])
    assert d.gpu_indices == (1,)
    [d] = place([("t1", 1)], [agent(gpus=gpus(1, active=(0,)), use_active_gpu=True)])
    assert d.gpu_indices == (0,)


def test_activity_of_our_own_trials_does_not_block() -> None:
    a = agent(gpus=gpus(1, active=(0,), pid=4242), pids=frozenset({4242}), max_trial_number_per_gpu=2,
              trials={"mine1": (0,)})
    [d] = place([("t1", 1)], [a])
    assert d.gpu_indices == (0,)
    a = agent(gpus=gpus(1, active=(0,), pid=4242), pids=frozenset({4242}))
    [d] = place([("t1", 1)], [a])
    assert d.gpu_indices == (0,)  # only our own (finished-placement) process on it


def test_spread_across_agents_round_robin_and_least_loaded() -> None:
    ds = place([(f"t{i}", 1) for i in range(4)], [agent("a", n=2), agent("b", n=2)])
    assert sorted(d.agent_id for d in ds) == ["a", "a", "b", "b"]
    busy = agent("a", n=None, trials={"x": (), "y": ()})
    [d] = place([("t1", None)], [busy, agent("b", n=None)])
    assert d.agent_id == "b"


def test_blocked_head_does_not_block_trials_that_fit_elsewhere() -> None:
    a = agent("a", n=2, trials={"x": (0,)})
    b = agent("b", n=1)
    head, nxt = place([("big", 2), ("small", 1)], [a, b])
    assert head.agent_id is None and "taken by trials x" in head.message
    assert nxt.agent_id == "b"


def test_fifo_later_trial_does_not_overtake_on_the_same_agent() -> None:
    a = agent("a", n=2, trials={"x": (0,)})
    head, nxt = place([("big", 2), ("small", 1)], [a])
    assert head.agent_id is None and nxt.agent_id is None
    assert "kept for an earlier trial" in nxt.message
