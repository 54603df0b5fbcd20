"""NNI's placementConstraint: GPUNumber and Device honoured, an impossible one a clear FAILED."""
from __future__ import annotations

from nni_manager.service import constraints
from nni_manager.backends.base import PlacementHints
from nni_manager.service.placement import AgentView, Placer, Request
from tests.support.manager.placement import gpus


def view(name: str, n: int = 2, *, host: str = "", hostname: str = "", connected: bool = True,
         trials: dict[str, tuple[int, ...]] | None = None, gpu_indices: tuple[int, ...] | None = None) -> AgentView:
    names = tuple(x for x in (host, hostname) if x)
    return AgentView(agent_id=name, name=name, connected=connected, gpus=gpus(n), trials=trials or {},
                     hints=PlacementHints(gpu_indices=gpu_indices, host=host), names=names, host_known=bool(hostname))


def request(trial_id: str, pc: object, default: int | None = None) -> Request:
    c = constraints.parse(pc, default)
    return Request(trial_id, c.gpu_number, device=c.device, invalid=c.invalid)


def test_parse() -> None:
    assert constraints.parse(None, 2) == constraints.Constraint(2)
    assert constraints.parse({"type": "None", "gpus": []}, 1).gpu_number == 1
    assert constraints.parse({"type": "GPUNumber", "gpus": [3]}, 1).gpu_number == 3
    device = constraints.parse({"type": "Device", "gpus": [["box", 1], ("box", 0), ["box", 1]]}, None)
    assert (device.gpu_number, device.device) == (2, ("box", (0, 1)))
    for bad, words in [({"type": "GPUNumber", "gpus": [1, 2]}, "exactly one number"),
                       ({"type": "GPUNumber", "gpus": [True]}, "exactly one number"),
                       ({"type": "Device", "gpus": []}, "lists no GPU"),
                       ({"type": "Device", "gpus": [["a", 0], ["b", 0]]}, "several hosts (a, b)"),
                       ({"type": "Device", "gpus": [["a", -1]]}, "is not [host, GPU index]"),
                       ({"type": "Nodes", "gpus": [1]}, "not one of None, GPUNumber, Device")]:
        assert words in constraints.parse(bad, None).invalid, bad


def test_device_takes_exactly_those_gpus_of_that_host() -> None:
    agents = [view("local", hostname="devbox"), view("root_10.0.0.7_22", host="10.0.0.7", hostname="gpu7")]  # not dialed: data only
    a, b, c = Placer().place([request("t1", {"type": "Device", "gpus": [["10.0.0.7", 1]]}),  # not dialed: data only
                              request("t2", {"type": "Device", "gpus": [["local", 0], ["local", 1]]}),
                              request("t3", {"type": "Device", "gpus": [["gpu7", 0]]})], agents)
    assert (a.agent_id, a.scheduled, a.gpu_indices) == ("root_10.0.0.7_22", True, (1,))
    assert (b.agent_id, b.gpu_indices) == ("local", (0, 1))
    assert (c.agent_id, c.gpu_indices) == ("root_10.0.0.7_22", (0,))  # by the hostname it reported


def test_device_busy_waits_naming_the_holder() -> None:
    agents = [view("box", host="10.0.0.7", hostname="h", trials={"old": (1,)})]  # not dialed: data only
    [d] = Placer().place([request("t1", {"type": "Device", "gpus": [["10.0.0.7", 1]]})], agents)  # not dialed: data only
    assert d.agent_id is None and not d.failed
    assert "GPU 1 of box" in d.message and "old" in d.message


def test_device_impossible_fails_with_the_reason() -> None:
    agents = [view("local", hostname="devbox"), view("box", n=2, host="10.0.0.7", hostname="h", gpu_indices=(0,))]  # not dialed: data only
    unknown, missing, excluded, invalid = Placer().place([
        request("t1", {"type": "Device", "gpus": [["nosuch", 0]]}),
        request("t2", {"type": "Device", "gpus": [["10.0.0.7", 5]]}),  # not dialed: data only
        request("t3", {"type": "Device", "gpus": [["10.0.0.7", 1]]}),  # not dialed: data only
        request("t4", {"type": "Device", "gpus": [["a", 0], ["b", 1]]}),
    ], agents)
    assert unknown.failed and "'nosuch'" in unknown.message and "10.0.0.7" in unknown.message  # not dialed: data only
    assert missing.failed and "GPU 5 of box" in missing.message and "GPUs 0-1" in missing.message
    assert excluded.failed and "gpuIndices" in excluded.message
    assert invalid.failed and "several hosts" in invalid.message


def test_device_host_not_known_yet_waits() -> None:
    """A machine that has not said hello yet may be the one named by its hostname."""
    agents = [view("local", hostname="devbox"), view("box", host="10.0.0.7", connected=False)]  # not dialed: data only
    [d] = Placer().place([request("t1", {"type": "Device", "gpus": [["gpu7", 0]]})], agents)
    assert not d.failed and d.agent_id is None and "gpu7" in d.message


def test_gpu_number_overrides_trial_gpu_number() -> None:
    agents = [view("a", n=1), view("b", n=4)]
    big, too_big = Placer().place([request("t1", {"type": "GPUNumber", "gpus": [3]}, default=1),
                                   request("t2", {"type": "GPUNumber", "gpus": [8]}, default=1)], agents)
    assert (big.agent_id, len(big.gpu_indices)) == ("b", 3)
    assert too_big.failed and "needs 8 GPUs" in too_big.message

