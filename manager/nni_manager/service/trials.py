"""The trial table: the one place that changes a trial's status, persists it and tells listeners.

A trial runs on one agent (fixed platforms) or on every member of an environment (a TFJob's
replicas, a Framework's tasks). Members report their own TrialStatus; `Completion` decides
when that makes the trial end and how, as the operator does for its object.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import Completion
from nni_manager.errors import TrialNotFoundError
from nni_manager.store import Store
from nni_manager.types import TrialJobDetail, TrialJobStatus

STATE = {
    pb.TRIAL_STATE_RUNNING: TrialJobStatus.RUNNING,
    pb.TRIAL_STATE_SUCCEEDED: TrialJobStatus.SUCCEEDED,
    pb.TRIAL_STATE_FAILED: TrialJobStatus.FAILED,
    pb.TRIAL_STATE_USER_CANCELED: TrialJobStatus.USER_CANCELED,
    pb.TRIAL_STATE_EARLY_STOPPED: TrialJobStatus.EARLY_STOPPED,
    pb.TRIAL_STATE_SYS_CANCELED: TrialJobStatus.SYS_CANCELED,
}
CONTACT_LOST = "contact with agent "
LEGACY_SIGNALLED = "agent received SIG"  # how agents before protocol 1.3 worded a stop by a signal


def end_cause(st: pb.TrialStatus) -> int:
    """Why a trial ended (pb.EndCause); agents before protocol 1.3 send none, so their one
    cause the manager acts on (the agent was signalled) is read from their fixed wording."""
    if st.end_cause or st.state != pb.TRIAL_STATE_SYS_CANCELED:
        return st.end_cause
    return pb.END_CAUSE_AGENT_SIGNALLED if st.reason.startswith(LEGACY_SIGNALLED) else pb.END_CAUSE_UNSPECIFIED
_STOPPED = (TrialJobStatus.USER_CANCELED, TrialJobStatus.EARLY_STOPPED, TrialJobStatus.SYS_CANCELED)
Notes = list[tuple[str, object]]


class _Table(dict[str, TrialJobDetail]):
    """The trial table by id, which also keeps, in submission order, the trials not ended yet,
    and those per agent: placement and the hub look only at those, so their cost follows the
    running trials, not every trial the experiment ever had (100,000 after a long run).

    `touched` collects the agents whose live trials changed, for placement's cached views."""

    def __init__(self, trials: list[TrialJobDetail]) -> None:
        super().__init__((t.id, t) for t in trials)
        self.live: dict[str, TrialJobDetail] = {}
        self.unplaced: dict[str, TrialJobDetail] = {}  # WAITING on no agent: what placement places
        self.on_agent: dict[str, dict[str, TrialJobDetail]] = {}  # agent -> its live trials
        self._indexed: dict[str, tuple[str, ...]] = {}  # live trial -> the agents it is indexed under
        self.touched: set[str] = set()
        self._order: dict[str, int] = {}  # trial -> submission order
        for t in trials:
            self._order[t.id] = len(self._order)
            self.reindex(t)

    def __setitem__(self, trial_id: str, t: TrialJobDetail) -> None:
        super().__setitem__(trial_id, t)
        self._order.setdefault(trial_id, len(self._order))
        self.reindex(t)

    def waiting(self) -> list[TrialJobDetail]:
        """Unplaced trials in submission order (a trial put back by a rolled-back change keeps
        its turn; sorting what is nearly sorted costs one pass)."""
        return sorted(self.unplaced.values(), key=lambda t: self._order[t.id])

    def __delitem__(self, trial_id: str) -> None:
        super().__delitem__(trial_id)
        self._order.pop(trial_id, None)
        self._unindex(trial_id)
        self.live.pop(trial_id, None)
        self.unplaced.pop(trial_id, None)

    def reindex(self, t: TrialJobDetail) -> None:
        """Bring the live and per-agent indexes up to date with `t` (after any change to it)."""
        self._unindex(t.id)
        agents = tuple(t.agents)
        if not agents and t.status == TrialJobStatus.WAITING:
            self.unplaced[t.id] = t
        else:
            self.unplaced.pop(t.id, None)
        if t.status.is_terminal:
            self.live.pop(t.id, None)
            return
        self.live[t.id] = t
        if agents:
            self._indexed[t.id] = agents
            for a in agents:
                self.on_agent.setdefault(a, {})[t.id] = t
            self.touched.update(agents)

    def _unindex(self, trial_id: str) -> None:
        for a in self._indexed.pop(trial_id, ()):
            on = self.on_agent.get(a)
            if on is not None:
                on.pop(trial_id, None)
                if not on:
                    del self.on_agent[a]
            self.touched.add(a)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclasses.dataclass(frozen=True)
class Member:
    """One agent of a trial that runs on several: who it is in the group."""

    agent_id: str
    role: str
    index: int

    @property
    def label(self) -> str:
        return f"{self.role}-{self.index}" if self.role else self.agent_id


def decide(completion: Completion, members: list[tuple[Member, pb.TrialStatus | None]]) -> tuple[TrialJobStatus, str] | None:
    """The trial's end from its members' latest statuses, or None while it goes on."""
    ended = [(m, s, STATE[s.state]) for m, s in members if s is not None and s.state in STATE
             and s.state != pb.TRIAL_STATE_RUNNING]

    def said(m: Member, s: pb.TrialStatus) -> str:
        return f"{m.label}: {s.reason}" if s.reason else f"{m.label} ended"

    for m, s, status in ended:  # stopped by us or the system: the whole trial is
        if status in _STOPPED:
            return status, said(m, s)
    if completion.decisive is not None:
        for m, s, status in ended:
            if (m.role, m.index) == completion.decisive:
                return status, ("" if status == TrialJobStatus.SUCCEEDED else said(m, s))
    failed: dict[str, list[tuple[Member, pb.TrialStatus]]] = {}
    succeeded: dict[str, int] = {}
    for m, s, status in ended:
        if status == TrialJobStatus.FAILED:
            failed.setdefault(m.role, []).append((m, s))
        elif status == TrialJobStatus.SUCCEEDED:
            succeeded[m.role] = succeeded.get(m.role, 0) + 1
    for role, members_failed in failed.items():
        need = completion.min_failed.get(role, 1)
        if 0 < need <= len(members_failed):
            return TrialJobStatus.FAILED, said(*members_failed[0])
    for role, count in succeeded.items():
        need = completion.min_succeeded.get(role, -1)
        if 0 < need <= count:
            return TrialJobStatus.SUCCEEDED, ""
    if len(ended) == len(members):
        return TrialJobStatus.SUCCEEDED, ""
    return None


class Trials:
    """Every trial of the experiment, mirrored in the store."""

    def __init__(self, store: Store, notify: Callable[[TrialJobDetail], None], wake: Callable[[], None]) -> None:
        self.store = store
        self.by_id = _Table(store.trials())
        self.pids: dict[str, int] = {}
        self._ended_pids: dict[str, collections.deque[int]] = {}  # agent -> pids of its last ended trials
        self._members: dict[str, dict[str, pb.TrialStatus]] = {}  # multi-agent trial -> agent -> latest status
        # trials we were asked to stop: (USER_CANCELED | EARLY_STOPPED, reason) is their outcome
        self.cancelling: dict[str, tuple[TrialJobStatus, str]] = {}
        self.end_causes: dict[str, int] = {}  # ended trial -> pb.EndCause: why, as the agent said (not its words)
        self._notify = notify
        self._wake = wake

    def get(self, trial_id: str, experiment_id: str = "") -> TrialJobDetail:
        try:
            return self.by_id[trial_id]
        except KeyError:
            raise TrialNotFoundError(f"no trial {trial_id!r} in experiment {experiment_id}") from None

    def live_on(self, agent_id: str) -> list[TrialJobDetail]:
        return list(self.by_id.on_agent.get(agent_id, {}).values())

    def waiting(self) -> list[TrialJobDetail]:
        return self.by_id.waiting()

    def live(self) -> list[TrialJobDetail]:
        return [t for t in self.by_id.live.values() if not t.status.is_terminal]

    def agent_pids(self, agent_id: str) -> frozenset[int]:
        """Pids of this experiment's trials on the agent: its live ones and the last few ended
        (their processes may still show in a GPU report)."""
        live = (self.pids.get(t) for t in self.by_id.on_agent.get(agent_id, ()))
        return frozenset(p for p in (*live, *self._ended_pids.get(agent_id, ())) if p)

    def member_ended(self, trial_id: str, agent_id: str) -> bool:
        """Whether this member of a multi-agent trial has reported its own end."""
        st = self._members.get(trial_id, {}).get(agent_id)
        return st is not None and st.state != pb.TRIAL_STATE_RUNNING

    # ------------------------------------------------------------------ changes
    def change(self, t: TrialJobDetail, notes: Notes | None = None, **fields: object) -> None:
        """Update a trial, persist it (plus an event on status change) and tell listeners."""
        status_changed = "status" in fields and fields["status"] != t.status
        for k, v in fields.items():
            setattr(t, k, v)
        if "agents" in fields:
            t.agent_id = t.agents[0] if t.agents else None
        with self.store.transaction():
            self.store.save_trial(t)
            if status_changed:
                self.store.add_event(t.id, t.status, t.message, now_ms())
        if status_changed or "agents" in fields:
            if t.status.is_terminal and t.id in self.pids:
                for a in t.agents:
                    self._ended_pids.setdefault(a, collections.deque(maxlen=16)).append(self.pids[t.id])
            self.by_id.reindex(t)
        if notes is not None:
            notes.append(("status", t.snapshot()))
        else:
            self._notify(t.snapshot())

    def finish(self, t: TrialJobDetail, status: TrialJobStatus, message: str, notes: Notes | None = None,
               end_time: int | None = None) -> None:
        self.change(t, notes, status=status, message=message, end_time=end_time or now_ms(),
                    is_early_stopped=status == TrialJobStatus.EARLY_STOPPED)
        self._wake()

    @contextlib.contextmanager
    def undone_on_failure(self, trial_ids: set[str]) -> Iterator[None]:
        """Undo in memory what the block changed of these trials when it fails: its store
        transaction rolled back (a full disk), so the agent's replay must find them as they were."""
        kept = {i: dataclasses.replace(self.by_id[i]) for i in trial_ids if i in self.by_id}
        cancelling, members = dict(self.cancelling), {k: dict(v) for k, v in self._members.items()}
        try:
            yield
        except BaseException:
            for trial_id, old in kept.items():
                t = self.by_id[trial_id]
                for f in dataclasses.fields(old):  # in place: callers hold this object
                    setattr(t, f.name, getattr(old, f.name))
                self.by_id[trial_id] = t  # back among the live ones if it was
            self.cancelling.clear()
            self.cancelling.update(cancelling)
            self._members.clear()
            self._members.update(members)
            raise

    def clear_contact_message(self, t: TrialJobDetail) -> None:
        if t.message.startswith(CONTACT_LOST):
            self.change(t, message="" if t.status == TrialJobStatus.RUNNING else f"starting on {t.agent_id}")

    def apply_status(self, agent_id: str, st: pb.TrialStatus, members: list[Member], completion: Completion,
                     notes: Notes | None = None) -> list[str]:
        """Apply one agent's status of a trial; returns the members still running that must be
        stopped because the trial as a whole has ended."""
        t = self.by_id.get(st.trial_id)
        status = STATE.get(st.state)
        if t is None or status is None or t.status.is_terminal:
            return []
        if st.pid and len(members) <= 1 and self.pids.get(t.id) != st.pid:
            self.pids[t.id] = st.pid
            self.by_id.touched.update(t.agents)
        fields: dict[str, object] = {}
        if st.working_directory and (not t.working_directory or len(members) <= 1):
            fields["working_directory"] = st.working_directory
        if len(members) > 1:
            self._members.setdefault(t.id, {})[agent_id] = st
            known = self._members[t.id]
            outcome = decide(completion, [(m, known.get(m.agent_id)) for m in members])
            if outcome is None:
                if status == TrialJobStatus.RUNNING and t.status != TrialJobStatus.RUNNING:
                    self.change(t, notes, status=status, message="", start_time=st.start_time_ms or now_ms(), **fields)
                return []
            status, reason = outcome
            st = pb.TrialStatus(end_time_ms=st.end_time_ms, reason=reason, end_cause=st.end_cause)
            del self._members[t.id]
            running = [m.agent_id for m in members if m.agent_id not in known
                       or known[m.agent_id].state == pb.TRIAL_STATE_RUNNING]
        else:
            running = []
        if status == TrialJobStatus.RUNNING:
            if t.status == TrialJobStatus.RUNNING:
                return []
            self.change(t, notes, status=status, message="", start_time=st.start_time_ms or now_ms(), **fields)
            return []
        if st.start_time_ms and not t.start_time:
            fields["start_time"] = st.start_time_ms
        reason = st.reason
        cause = end_cause(st)
        asked = self.cancelling.pop(t.id, None)
        if asked is not None and status in (TrialJobStatus.SYS_CANCELED, TrialJobStatus.USER_CANCELED,
                                            TrialJobStatus.EARLY_STOPPED):
            status, reason = asked  # we stopped it (perhaps through the platform, whose signal the agent saw)
            cause = pb.END_CAUSE_CANCELLED
        self.end_causes[t.id] = cause
        self.change(t, notes, status=status, message=reason, end_time=st.end_time_ms or now_ms(),
                    is_early_stopped=status == TrialJobStatus.EARLY_STOPPED, **fields)
        self._wake()
        return running
