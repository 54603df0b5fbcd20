"""GPU-aware placement of waiting trials on connected agents.

Pure logic: the service hands in a snapshot of agents (hints, latest GPU report, the
trials it runs) and the waiting trials in FIFO order, and gets back, per trial, where to
start it, that it can never run (FAILED), or a precise reason why it keeps WAITING.
NNI's knobs: trialGpuNumber (None = no scheduling, 0 = no GPU), gpuIndices,
maxTrialNumberPerGpu (slots per device), useActiveGpu.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import PlacementHints


@dataclass
class AgentView:
    """What placement knows about one agent."""

    agent_id: str
    name: str
    connected: bool
    hints: PlacementHints = field(default_factory=PlacementHints)
    gpus: pb.GpuReport | None = None  # latest report; None = never received
    trials: dict[str, tuple[int, ...]] = field(default_factory=dict)  # its live trials -> GPU indices
    pids: frozenset[int] = frozenset()  # pids of this experiment's trials on it (live or just ended)
    status: str = ""  # the platform's words on why it is not connected (yet)
    names: tuple[str, ...] = ()  # besides its name: the config's host, the hostname it reported (Device)
    host_known: bool = False  # it has said hello, so `names` holds its hostname


@dataclass(frozen=True)
class Request:
    trial_id: str
    gpu_number: int | None
    device: tuple[str, tuple[int, ...]] | None = None  # placementConstraint Device: (host, its GPU indices)
    invalid: str = ""  # a placementConstraint that can never be met: why


@dataclass(frozen=True)
class Decision:
    trial_id: str
    agent_id: str | None = None  # set: start it there
    scheduled: bool = False  # GPU scheduling on (CUDA_VISIBLE_DEVICES set)
    gpu_indices: tuple[int, ...] = ()
    failed: bool = False  # can never run: `message` says why
    message: str = ""  # why it waits / fails


class Placer:
    """Stateful only for round-robin fairness between equally loaded agents."""

    def __init__(self) -> None:
        self._turn = 0

    def place(self, requests: list[Request], agents: list[AgentView]) -> list[Decision]:
        load = _Load()
        used = _Occupancy()
        reserved: set[str] = set()  # agents a blocked earlier GPU trial is waiting for (FIFO)
        connected = [a for a in agents if a.connected]
        decisions = []
        for req in requests:
            if req.invalid:
                decisions.append(Decision(req.trial_id, failed=True, message=req.invalid))
                continue
            if req.device is not None:
                decisions.append(self._place_device(req, agents, used))
                if decisions[-1].agent_id:
                    load.add(decisions[-1].agent_id)
                continue
            if not connected:
                said = "; ".join(dict.fromkeys(a.status for a in agents if a.status))
                decisions.append(Decision(req.trial_id, message="waiting for an agent to connect"
                                          + (f": {said}" if said else "")))
                continue
            if req.gpu_number is None or req.gpu_number == 0:
                agent = self._pick(connected, load)
                decisions.append(Decision(req.trial_id, agent.agent_id, scheduled=req.gpu_number == 0))
            else:
                decisions.append(self._place_gpu(req, agents, connected, load, used, reserved))
            if decisions[-1].agent_id:
                load.add(decisions[-1].agent_id)
        return decisions

    def _place_device(self, req: Request, agents: list[AgentView], used: _Occupancy) -> Decision:
        """NNI's Device constraint: exactly these GPUs of the machine named (by agent name, the
        config's host, or its hostname); a machine or GPU that does not exist fails the trial."""
        assert req.device is not None
        host, indices = req.device
        matches = [a for a in agents if host in (a.agent_id, a.name)] or [a for a in agents if host in a.names]
        if not matches:
            listing = "; ".join(f"{a.name} ({', '.join(a.names)})" if a.names else a.name for a in agents)
            if agents and all(a.host_known for a in agents):
                return Decision(req.trial_id, failed=True,
                                message=f"placementConstraint Device names host {host!r}, which is no machine of "
                                        f"this experiment (machines: {listing}): use a machineList host, an agent "
                                        "name or a hostname")
            return Decision(req.trial_id, message=f"waiting: no machine named {host!r} has connected yet "
                                                  f"(so far: {listing or 'none'})")
        a = matches[0]
        if not a.connected:
            return Decision(req.trial_id, message=f"waiting for {a.name} (named by placementConstraint Device) to "
                                                  "connect" + (f": {a.status}" if a.status else ""))
        if a.gpus is None:
            return Decision(req.trial_id, message=f"waiting: no GPU information from {a.name} yet")
        present = sorted(g.index for g in a.gpus.gpus)
        missing = [i for i in indices if i not in present]
        if missing:
            return Decision(req.trial_id, failed=True, message=f"placementConstraint Device asks for {_span(missing)} "
                                                               f"of {a.name}, which has {_span(present)}")
        usable, _ = _usable(a)
        excluded = [i for i in indices if i not in usable]
        if excluded:
            return Decision(req.trial_id, failed=True,
                            message=f"placementConstraint Device asks for {_span(excluded)} of {a.name}, which its "
                                    f"gpuIndices {list(a.hints.gpu_indices or ())} leave out")
        free, why = _free_devices(a, usable, used.of(a))
        busy = [i for i in indices if i not in free]
        if busy:
            return Decision(req.trial_id, message=f"waiting for {_span(busy)} of {a.name} (placementConstraint "
                                                  f"Device): {why}")
        for i in indices:
            used.of(a).setdefault(i, []).append(req.trial_id)
        return Decision(req.trial_id, a.agent_id, scheduled=True, gpu_indices=tuple(indices))

    def _pick(self, candidates: list[AgentView], load: _Load) -> AgentView:
        """Least loaded; ties broken round-robin."""
        loads = [load.of(a) for a in candidates] if load.added else [len(a.trials) for a in candidates]
        least = min(loads)
        tied = [a for a, n in zip(candidates, loads) if n == least]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def _place_gpu(
        self,
        req: Request,
        agents: list[AgentView],
        connected: list[AgentView],
        load: _Load,
        used: _Occupancy,
        reserved: set[str],
    ) -> Decision:
        n = req.gpu_number or 0
        unknown = [a for a in agents if a.gpus is None]
        capable = [a for a in agents if a.gpus is not None and len(_usable(a)[0]) >= n]
        if not capable and not unknown:
            return Decision(req.trial_id, failed=True, message=_too_big(n, agents))
        fits: dict[str, tuple[int, ...]] = {}
        reasons = []
        for a in connected:
            if a.gpus is None:
                reasons.append(f"no GPU information from {a.name} yet")
                continue
            usable, note = _usable(a)
            if len(usable) < n:
                reasons.append(_capacity(a, n, usable, note))
                continue
            if a.agent_id in reserved:
                reasons.append(f"{a.name} is kept for an earlier trial waiting for GPUs")
                continue
            free, why = _free_devices(a, usable, used.of(a))
            if len(free) >= n:
                fits[a.agent_id] = tuple(free[:n])
            else:
                reasons.append(why)
        if not fits:
            for a in capable:
                reserved.add(a.agent_id)
            if not reasons:
                names = ", ".join(a.name for a in capable)
                reasons.append(f"{names} not connected")
            return Decision(req.trial_id, message="; ".join(_waiting(r) for r in reasons))
        agent = self._pick([a for a in connected if a.agent_id in fits], load)
        indices = fits[agent.agent_id]
        for i in indices:
            used.of(agent).setdefault(i, []).append(req.trial_id)
        return Decision(req.trial_id, agent.agent_id, scheduled=True, gpu_indices=indices)


class _Load:
    """Trials per agent: its live ones plus those placed in this round (no per-agent table
    built up front: one placement among 1,000 agents stays cheap)."""

    def __init__(self) -> None:
        self.added: dict[str, int] = {}

    def of(self, a: AgentView) -> int:
        return len(a.trials) + self.added.get(a.agent_id, 0)

    def add(self, agent_id: str) -> None:
        self.added[agent_id] = self.added.get(agent_id, 0) + 1


class _Occupancy:
    """GPU index -> trials, per agent, built when placement first looks at that agent."""

    def __init__(self) -> None:
        self._occ: dict[str, dict[int, list[str]]] = {}

    def of(self, a: AgentView) -> dict[int, list[str]]:
        occ = self._occ.get(a.agent_id)
        if occ is None:
            occ = self._occ[a.agent_id] = _occupancy(a)
        return occ


def _waiting(reason: str) -> str:
    return reason if reason.startswith("waiting") else f"waiting: {reason}"


def _occupancy(a: AgentView) -> dict[int, list[str]]:
    occ: dict[int, list[str]] = {}
    for trial_id, indices in a.trials.items():
        for i in indices:
            occ.setdefault(i, []).append(trial_id)
    return occ


def _span(indices: list[int]) -> str:
    if not indices:
        return "no GPUs"
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 1:
        return f"GPUs {indices[0]}-{indices[-1]}"
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(map(str, indices))


def _usable(a: AgentView) -> tuple[list[int], str]:
    """GPU indices placement may use on `a` (after gpuIndices), and a note on missing ones."""
    assert a.gpus is not None
    present = sorted(g.index for g in a.gpus.gpus)
    if a.hints.gpu_indices is None:
        return present, ""
    missing = [i for i in a.hints.gpu_indices if i not in present]
    note = ""
    if missing:
        listed = ("GPU " if len(missing) == 1 else "GPUs ") + ", ".join(map(str, missing))
        note = f"gpuIndices lists {listed} but {a.name} has {_span(present)}"
    return [i for i in present if i in a.hints.gpu_indices], note


def _capacity(a: AgentView, n: int, usable: list[int], note: str) -> str:
    assert a.gpus is not None
    if not a.gpus.gpus:
        why = a.gpus.unavailable_reason or f"its GPU provider is {a.gpus.provider or 'none'}"
        return f"{a.name} has no GPUs: {why}"
    text = f"{a.name} has {len(usable)} usable GPU{'s' if len(usable) != 1 else ''}"
    if a.hints.gpu_indices is not None:
        text += f" (gpuIndices {list(a.hints.gpu_indices)})"
    return f"{text}, {n} needed" + (f"; {note}" if note else "")


def _too_big(n: int, agents: list[AgentView]) -> str:
    details = "; ".join(_capacity(a, n, *_usable(a)) for a in agents)
    return f"the trial needs {n} GPU{'s' if n != 1 else ''} but no agent has that many: {details}"


def _free_devices(a: AgentView, usable: list[int], occ: dict[int, list[str]]) -> tuple[list[int], str]:
    """Devices with a free slot, least occupied first, and why the others are not free."""
    assert a.gpus is not None
    samples = {g.index: g for g in a.gpus.gpus}
    per_gpu = max(1, a.hints.max_trial_number_per_gpu)
    free, full, active = [], [], []
    for i in usable:
        trials = occ.get(i, [])
        if len(trials) >= per_gpu:
            full.append(i)
        elif not a.hints.use_active_gpu and not trials and _foreign_active(samples[i], a.pids):
            active.append(i)
        else:
            free.append(i)
    free.sort(key=lambda i: (len(occ.get(i, [])), i))
    parts = []
    if full and not active and len(full) == len(usable):
        owners = sorted({t for i in full for t in occ[i]})
        word = "the only GPU" if len(usable) == 1 else f"all {len(usable)} GPUs"
        return free, f"waiting for a GPU: {word} of {a.name} {'is' if len(usable) == 1 else 'are'} taken by trials {', '.join(owners)}"
    if full:
        owners = sorted({t for i in full for t in occ[i]})
        parts.append(f"{_span(full)} of {a.name} taken by trials {', '.join(owners)}")
    if active:
        verb = "is" if len(active) == 1 else "are"
        parts.append(
            f"{_span(active)} of {a.name} {verb} active (used by a process outside this experiment)"
            " and useActiveGpu is false"
        )
    return free, "; ".join(parts)


def _foreign_active(sample: pb.GpuSample, own_pids: frozenset[int]) -> bool:
    """Active, and not only because of this experiment's own trial processes."""
    if not sample.active:
        return False
    return not sample.processes or any(p.pid not in own_pids for p in sample.processes)
