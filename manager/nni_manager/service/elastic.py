"""Elastic platforms: asking for environments, placing trials on whole ones, giving them back.

An environment is a group of agents started together (one TFJob, one pod). `capacity.plan`
decides how many there should be; this module carries it out: it registers the members
(named by the backend: its pods' own names), has the backend submit the environment, marks it
ready once every member is connected, places a waiting trial on an idle ready one (gang
placement: every member starts its role's command), and handles an environment's death.
"""
from __future__ import annotations

import logging
import time

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import BackendError, EnvironmentRequest, PlacementHints, as_elastic
from nni_manager.config import ConfigError
from nni_manager.service import capacity
from nni_manager.service.agents import (
    FAILED,
    PROVISIONING,
    READY,
    RELEASED,
    Environment,
)
from nni_manager.service.ports import ElasticCore
from nni_manager.service.trials import now_ms
from nni_manager.types import TrialJobDetail, TrialJobStatus

log = logging.getLogger(__name__)

# Environments that fail before any became ready, in a row, before waiting trials are failed.
MAX_START_FAILURES = 2
# How long the agents of a one-trial environment (reuseMode false) get to exit on their own
# after the trial ended, so the object's status records the outcome by the operator's rule,
# before the environment is released anyway.
EXIT_WAIT_S = 30.0


class Elastic:
    def __init__(self, core: ElasticCore) -> None:
        self.core = core
        self.start_failures = 0

    def tick(self, waiting: list[TrialJobDetail] | None = None) -> None:
        """Provide capacity, then place what waits (`waiting`: the trials left to environments,
        in hybrid mode those the fixed machines do not take; default every waiting trial)."""
        waiting = self.core.trials.waiting() if waiting is None else waiting
        self._provide_capacity(waiting)
        self._place(waiting)

    def _provide_capacity(self, waiting: list[TrialJobDetail]) -> None:
        core = self.core
        agents, trials = core.agents, core.trials
        for env in agents.live_envs():
            if env.state == PROVISIONING and agents.all_connected(env):
                agents.set_state(env, READY)
                self.start_failures = 0
        busy = {t.environment_id: t.id for t in trials.live() if t.environment_id and t.agents}
        now = now_ms()
        exiting = frozenset(e.env_id for e in agents.live_envs() if e.state == READY and e.trial_id
                            and (t := trials.by_id.get(e.trial_id)) is not None and t.status.is_terminal
                            and now - (t.end_time or now) < EXIT_WAIT_S * 1000)
        decided = capacity.plan(list(agents.envs.values()), busy, waiting,
                                core.config.trial_concurrency, as_elastic(core.backend).reuse, now=time.monotonic(),
                                exiting=exiting)
        for env_id in decided.release:
            self.release(agents.envs[env_id])
        # a pool's new environments are for the waiting trials free ones do not take, the last ones
        # (hybrid mode: each on the platform its trial names, if it names one)
        pool_new = [p for p in decided.provision if p is None]
        for_pool = iter(waiting[len(waiting) - len(pool_new):] if pool_new else [])
        for trial_id in decided.provision:
            trial = trials.by_id.get(trial_id) if trial_id else next(for_pool, None)
            self._provision(trial_id, trial)

    def _provision(self, trial_id: str | None, trial: TrialJobDetail | None = None) -> None:
        agents = self.core.agents
        env_id = f"trial-{trial_id.lower()}" if trial_id else f"env{len(agents.envs) + 1}"
        while env_id in agents.envs:  # trial ids differing only in case
            env_id += "x"
        part = as_elastic(self.core.backend).environment_backend(env_id, trial)  # hybrid mode: the platform that makes it
        env = agents.add_environment(env_id, trial_id)
        specs = []
        for name, role, index in as_elastic(self.core.backend).member_names(env_id):
            specs.append(agents.add(name, PlacementHints(), env_id, role, index,
                                    enrol=part.single_use_credentials))
            env.members.append(name)
        self.core.spawn(self._submit(env, EnvironmentRequest(env_id, tuple(specs), trial_id)))

    async def _submit(self, env: Environment, request: EnvironmentRequest) -> None:
        try:
            await as_elastic(self.core.backend).provision(request)
        except (BackendError, ConfigError) as e:  # the platform refused it: one line, on the trials waiting for it
            log.warning("environment %s: %s", env.env_id, e)
            self.failed(env, str(e) or type(e).__name__, TrialJobStatus.FAILED)
        except Exception as e:  # a bug of ours, not the platform's word: say so, traceback in nnimanager.log
            log.exception("environment %s: internal error in the %s backend", env.env_id, as_elastic(self.core.backend).platform)
            self.failed(env, f"internal error in the {as_elastic(self.core.backend).platform} backend ({type(e).__name__}: {e}); "
                             "the traceback is in nnimanager.log", TrialJobStatus.FAILED)

    def release(self, env: Environment) -> None:
        self.core.agents.set_state(env, RELEASED)
        if env.trial_id is None:  # a one-trial environment's members stop with its object (see stops_members)
            for agent_id in env.members:
                self.core.send(agent_id, shutdown=pb.Shutdown(reason=f"environment {env.env_id} is released"))
        self.core.spawn(as_elastic(self.core.backend).release(env.env_id))
        self.core.wake()  # its place may go to a waiting trial now, not at the next periodic look

    def cancelled(self, trial: TrialJobDetail) -> None:
        """We cancel a trial: where the platform shows a stopped job for that (OpenPAI's STOP), its
        one-trial environment is stopped through the platform at once, as NNI did."""
        env = self.core.agents.envs.get(trial.environment_id or "")
        if (env is not None and env.trial_id == trial.id and env.live
                and as_elastic(self.core.backend).environment_backend(env.env_id).stop_job_on_cancel):
            self.release(env)

    def stops_members(self, environment_id: str | None, trial_id: str) -> bool:
        """Whether the platform, not the core, stops the members still running when this trial
        ends: an environment made for this one trial is deleted once the trial is over, after
        the object recorded the outcome by the operator's rule (stopping the members first would
        let their clean exits decide it instead)."""
        env = self.core.agents.envs.get(environment_id or "")
        return env is not None and env.trial_id == trial_id

    def agent_ended(self, env: Environment, agent_id: str) -> bool:
        """A member's pod is over. True when that was expected (nothing to fail)."""
        trials = self.core.trials
        if not env.live:
            return True  # released or failed already
        bound = trials.by_id.get(env.trial_id or "")
        if bound is not None and bound.status.is_terminal:  # its one trial is over: done with it
            self.release(env)
            return True
        live = trials.live_on(agent_id)
        # a member whose part is done (its pod ended after its one trial): the others go on
        return bool(live) and all(trials.member_ended(t.id, agent_id) for t in live)

    def failed(self, env: Environment, reason: str, status: TrialJobStatus) -> None:
        core = self.core
        agents, trials = core.agents, core.trials
        was_ready = env.ever_ready
        agents.set_state(env, FAILED, reason)
        for t in trials.live():
            if t.environment_id == env.env_id or (t.id == env.trial_id and not t.agents):
                trials.finish(t, status, reason)
        if not was_ready:
            self.start_failures += 1
            if self.start_failures >= MAX_START_FAILURES and not any(e.ever_ready for e in agents.envs.values()):
                for t in trials.waiting():
                    trials.finish(t, TrialJobStatus.FAILED, f"no environment could be started: {reason}")
        core.spawn(as_elastic(core.backend).release(env.env_id))
        core.wake()

    def _place(self, waiting: list[TrialJobDetail]) -> None:
        core = self.core
        agents, trials = core.agents, core.trials
        busy = {t.environment_id for t in trials.live() if t.environment_id and t.agents}
        free = [e for e in agents.envs.values() if e.state == READY and e.env_id not in busy
                and agents.all_connected(e)]
        starting = [e for e in agents.envs.values() if e.state == PROVISIONING]
        for t in waiting:
            env = next((e for e in free if e.trial_id in (None, t.id) and as_elastic(core.backend).environment_fits(e.env_id, t)),
                       None)
            if env is None:
                mine = [e for e in starting if e.trial_id == t.id] or [e for e in starting if e.trial_id is None]
                if mine:
                    message = "waiting: " + "; ".join(f"environment {e.env_id}: {agents.why_not_ready(e)}"
                                                      for e in mine)
                else:
                    message = (f"waiting for an environment: all {core.config.trial_concurrency} allowed "
                               "(trialConcurrency) are in use")
                if message != t.message:
                    trials.change(t, message=message)
                continue
            free.remove(env)
            trials.change(t, agents=list(env.members), environment_id=env.env_id,
                          message=f"starting on environment {env.env_id}")
            for agent_id in env.members:
                core.send_start(t, agent_id)
