"""Capacity for elastic platforms: which environments to ask for, and which to give back.

Pure decisions over the current picture, the clock included (`now`, time.monotonic's, is a
parameter): the service carries them out. Rules:
- never more live environments than `trialConcurrency`;
- reuseMode false: one environment per trial, made for it and released when it ends (once
  its --single-trial agents have exited on their own, so that the object's status follows the
  trial: `exiting` lists those still on their way out);
- reuseMode true: a pool that grows while trials wait and shrinks when environments have
  been idle for `idle_release` seconds with nothing waiting.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from nni_manager.service.agents import PROVISIONING, READY, Environment
from nni_manager.types import TrialJobDetail

IDLE_RELEASE_S = 10.0


@dataclass
class Plan:
    provision: list[str | None] = field(default_factory=list)  # one entry per new environment: its trial (or None)
    release: list[str] = field(default_factory=list)  # env ids


def plan(envs: list[Environment], busy: dict[str, str], waiting: list[TrialJobDetail],
         limit: int, reuse: bool, *, now: float, idle_release: float = IDLE_RELEASE_S,
         exiting: frozenset[str] = frozenset()) -> Plan:
    """`envs`: every known environment; `busy`: env id -> the live trial on it; `now`: the
    time.monotonic() the environments' `since` is measured on."""
    out = Plan()
    live = [e for e in envs if e.live]
    if reuse:
        free = [e for e in live if e.env_id not in busy and e.trial_id is None]
        shortfall = len(waiting) - len(free)
        room = limit - len(live)
        out.provision = [None] * max(0, min(shortfall, room))
        if not waiting:
            out.release = [e.env_id for e in free if e.state == READY and now - e.since > idle_release]
        return out
    bound = {e.trial_id for e in live if e.trial_id}
    room = limit - len(live)
    for t in waiting:
        if room <= 0:
            break
        if t.id not in bound:
            out.provision.append(t.id)
            room -= 1
    waiting_ids = {t.id for t in waiting}
    out.release = [e.env_id for e in live if e.trial_id and e.env_id not in busy and e.trial_id not in waiting_ids
                   and e.state in (READY, PROVISIONING) and e.env_id not in exiting]
    return out
