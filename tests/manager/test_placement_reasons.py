"""placement.py's reasons not covered by test_placement / test_constraints: the platform's own
words while no agent is connected, the FIFO reservation named in a later trial's reason, a
disconnected Device machine, and an invalid request failing before anything else."""
from __future__ import annotations

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import PlacementHints
from nni_manager.service.placement import AgentView, Placer, Request


def gpus(n: int) -> pb.GpuReport:
    report = pb.GpuReport(provider="artificial")
    for i in range(n):
        report.gpus.add(index=i)
    return report


def agent(name: str, n: int = 2, *, connected: bool = True, status: str = "",
          trials: dict[str, tuple[int, ...]] | None = None, **hints: object) -> AgentView:
    return AgentView(agent_id=name, name=name, connected=connected, gpus=gpus(n), trials=trials or {},
                     status=status, hints=PlacementHints(**hints))  # type: ignore[arg-type]


def test_no_agent_connected_waits_with_each_platform_reason_once() -> None:
    pending = "Slurm job 12 (nni_exp_x_env_1) is PENDING (Resources)"
    agents = [agent("env1", connected=False, status=pending), agent("env2", connected=False, status=pending),
              agent("env3", connected=False)]
    [d] = Placer().place([Request("t1", None)], agents)
    assert d.agent_id is None and not d.failed
    assert d.message == f"waiting for an agent to connect: {pending}"


def test_an_earlier_gpu_trial_keeps_its_agent_and_a_later_one_says_so() -> None:
    # box has 2 GPUs, both busy: t1 (2 GPUs) waits for it; t2 (1 GPU) must not take a GPU there first
    box = agent("box", trials={"old1": (0,), "old2": (1,)})
    t1, t2 = Placer().place([Request("t1", 2), Request("t2", 1)], [box])
    assert t1.agent_id is None and "waiting" in t1.message and "old1" in t1.message
    assert t2.agent_id is None and t2.message == "waiting: box is kept for an earlier trial waiting for GPUs"


def test_a_trial_that_needs_more_gpus_than_any_agent_fails_while_small_ones_run() -> None:
    big, small = Placer().place([Request("big", 4), Request("small", 1)], [agent("box", 2)])
    assert big.failed and "needs 4 GPUs but no agent has that many: box has 2 usable GPUs, 4 needed" in big.message
    assert (small.agent_id, small.gpu_indices) == ("box", (0,))


def test_gpu_indices_and_slots_per_gpu_shape_what_is_free() -> None:
    box = agent("box", 4, gpu_indices=(2, 3), max_trial_number_per_gpu=2, trials={"old": (2,)})
    a, b, c, d = Placer().place([Request(t, 1) for t in "abcd"], [box])
    assert [x.gpu_indices for x in (a, b, c)] == [(3,), (2,), (3,)]  # least occupied first, only 2 and 3
    assert d.agent_id is None and "waiting" in d.message


def test_device_machine_not_connected_waits_with_its_words() -> None:
    box = agent("box", connected=False, status="pod box is Pending: 0/3 nodes are available")
    [d] = Placer().place([Request("t1", 1, device=("box", (0,)))], [box])
    assert not d.failed and d.agent_id is None
    assert d.message == ("waiting for box (named by placementConstraint Device) to connect: "
                         "pod box is Pending: 0/3 nodes are available")


def test_an_invalid_request_fails_at_once_even_with_no_agent() -> None:
    [d] = Placer().place([Request("t1", 1, invalid="placementConstraint type 'Nodes' is not one of ...")], [])
    assert d.failed and d.message.startswith("placementConstraint type 'Nodes'")
