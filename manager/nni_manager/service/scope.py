"""Which trials an agent may speak for: only those placed on it.

Every agent has its own token, but a token proves only who is talking, not what it may touch.
Anything an agent sends keyed by a trial id (status, metrics, parameter requests, log chunks,
resource samples) is taken only for trials placed on that agent: a single agent on fixed
platforms (local, remote, hybrid), every member of the trial's environment on cluster
platforms. The rest is refused and logged once per (agent, trial), so a compromised or
confused worker can neither end, score nor write into another worker's trials.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from nni_manager.service.trials import Trials

log = logging.getLogger(__name__)

_MAX_NOTED = 4096  # (agent, trial) pairs remembered for the once-only warning: a flood of ids stays bounded


class AgentScope:
    def __init__(self, trials: Trials, name: Callable[[str], str]) -> None:
        self._trials = trials
        self._name = name
        self._noted: set[tuple[str, str]] = set()

    def allows(self, agent_id: str, trial_id: str, what: str) -> bool:
        """Whether `agent_id` may report `what` for `trial_id`; a refusal is logged once per pair."""
        t = self._trials.by_id.get(trial_id)
        if t is not None and agent_id in t.agents:
            return True
        pair = (agent_id, trial_id)
        if pair not in self._noted:
            if len(self._noted) < _MAX_NOTED:
                self._noted.add(pair)
            where = "a trial placed on other agents" if t is not None else "no trial of this experiment"
            log.warning("agent %s sent %s for trial %r, %s: refused (an agent reports only its own trials)",
                        self._name(agent_id), what, trial_id[:64], where)
        return False
