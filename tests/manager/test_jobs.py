"""backends/jobs.py, the job pattern every batch platform builds on, decision by decision and in
milliseconds: the platforms' state tables, and the algorithm (provision guard, poll, the
"missing for 3 polls" rule, the agent connect timeout, the start deadline, ended reasons, re-attach, release,
stop-all) over `Pbs` below, a batch scheduler that keeps its queue in memory. `Pbs` is also the
proof of the pattern's promise: a new scheduler is a submit / list / cancel trio and a state table.
The platforms' own behaviour is tested end to end in tests/{openpai,dlts,aml,slurm}."""
from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest

from nni_manager.backends import registry
from nni_manager.backends.base import AgentSpec, BackendError, EnvironmentRequest, PlacementHints
from nni_manager.backends.jobs import PHASES, Job, JobBackend, JobView, Phase, StateTable
from nni_manager.config import ExperimentConfig, TrainingServiceConfig

# ----------------------------------------------------------------------------- state tables

JOB_PLATFORMS = {p: c for p in registry.platforms() if issubclass(c := registry.backend_class(p), JobBackend)}
# The Kubernetes operator platforms map their main object's states through the same tables (their
# plain pods and AdaptDLJobs have no "stopped by someone else" state: tests/kube/test_options.py)
TABLES = {**{p: c.states for p, c in JOB_PLATFORMS.items()},
          **{p: registry.backend_class(p).states for p in ("kubeflow", "frameworkcontroller")}}


def test_every_job_platform_is_here() -> None:
    """Every registered job platform's table is checked below (a new one joins by registering)."""
    assert {"openpai", "dlts", "aml", "dlc", "slurm"} <= set(TABLES)


@pytest.mark.parametrize("platform", sorted(JOB_PLATFORMS))
def test_a_platform_says_what_differs_through_the_hooks_only(platform: str) -> None:
    """A platform overrides the pattern's hooks (list_jobs, describe, cancel, ...), never its
    machinery (the private methods: polling, re-attaching, stopping everything)."""
    cls = JOB_PLATFORMS[platform]
    machinery = {name for name, value in vars(JobBackend).items()
                 if name.startswith("_") and not name.startswith("__") and inspect.isfunction(value)}
    assert {"_stop_all", "_reattach", "_views"} <= machinery
    overridden = {name for klass in cls.__mro__[:cls.__mro__.index(JobBackend)] for name in vars(klass)} & machinery
    assert not overridden, f"{cls.__name__} overrides the job pattern's own {sorted(overridden)}"


def test_phases_are_the_literal_type() -> None:
    assert set(PHASES) == set(get_args(Phase))


NO_STOPPED_STATE = {"kubernetes", "adl"}


@pytest.mark.parametrize("platform", sorted(TABLES))
def test_every_platform_table_maps_onto_phases_and_its_ends(platform: str) -> None:
    table = TABLES[platform]
    assert len(table) >= 4 and all(table.phase(s) in PHASES for s in table)
    # every platform says how a job waits, runs, succeeds, fails and is stopped by someone else; a
    # plain pod and an AdaptDLJob have no "stopped" state (deleted is gone: the listing's rule)
    ends = {"waiting", "running", "succeeded", "failed"} | (set() if platform in NO_STOPPED_STATE else {"stopped"})
    assert ends <= set(table.values())


@pytest.mark.parametrize("platform, state, phase", [
    ("openpai", "WAITING", "waiting"), ("openpai", "RUNNING", "running"), ("openpai", "STOPPING", "stopped"),
    ("openpai", "SUCCEEDED", "succeeded"), ("openpai", "FAILED", "failed"), ("openpai", "ARCHIVED", "unknown"),
    ("dlts", "queued", "waiting"), ("dlts", "error", "failed"), ("dlts", "paused", "stopped"),
    ("dlts", "finished", "succeeded"), ("dlts", "something-new", "unknown"),
    ("aml", "Preparing", "waiting"), ("aml", "Finalizing", "running"), ("aml", "Canceled", "stopped"),
    ("aml", "Failed", "failed"), ("aml", "Paused", "unknown"),
    ("dlc", "Queuing", "waiting"), ("dlc", "EnvPreparing", "waiting"), ("dlc", "Restarting", "running"),
    ("dlc", "Completed", "succeeded"), ("dlc", "Failed", "failed"), ("dlc", "Stopping", "stopped"),
    ("dlc", "SomethingNew", "unknown"),
    ("slurm", "PENDING", "waiting"), ("slurm", "CONFIGURING", "waiting"), ("slurm", "RUNNING", "running"),
    ("slurm", "COMPLETING", "unknown"), ("slurm", "SUSPENDED", "unknown"), ("slurm", "COMPLETED", "succeeded"),
    ("slurm", "OUT_OF_MEMORY", "failed"), ("slurm", "TIMEOUT", "failed"), ("slurm", "PREEMPTED", "stopped"),
    ("slurm", "NODE_FAIL", "stopped"), ("slurm", "CANCELLED", "stopped"),
    ("slurm", "A_STATE_SLURM_ADDS_LATER", "stopped"),  # not live: an ended job, as Slurm's unlisted states were
    ("kubeflow", "Created", "waiting"), ("kubeflow", "Restarting", "running"), ("kubeflow", "Suspended", "stopped"),
    ("kubeflow", "Succeeded", "succeeded"), ("kubeflow", "Failed", "failed"),
    ("frameworkcontroller", "AttemptPreparing", "waiting"), ("frameworkcontroller", "AttemptDeleting", "running"),
    ("frameworkcontroller", "StopFrameworkRequested", "stopped"), ("frameworkcontroller", "Failed", "failed"),
    ("frameworkcontroller", "Completed", "unknown"),  # completed, its completion status not yet recorded
])
def test_platform_state_maps_to_phase(platform: str, state: str, phase: str) -> None:
    assert TABLES[platform].phase(state) == phase


def test_state_table_refuses_what_is_not_a_phase_and_builds_from_groups() -> None:
    with pytest.raises(ValueError, match="Q: queued"):
        StateTable({"Q": "queued"})  # type: ignore[dict-item]
    table = StateTable.of(waiting=["Q", "H"], running=["R"], default="stopped")
    assert (table.phase("H"), table.phase("R"), table.phase("Z")) == ("waiting", "running", "stopped")
    assert dict(table) == {"Q": "waiting", "H": "waiting", "R": "running"}


@pytest.mark.parametrize("phase, settled, live", [
    ("waiting", True, True), ("running", True, True), ("unknown", True, True), ("failed", True, False),
    ("succeeded", True, False), ("stopped", True, False), ("stopped", False, True)])  # still stopping
def test_view_is_live_while_the_job_may_have_processes(phase: Phase, settled: bool, live: bool) -> None:
    assert JobView("j", phase, "", settled=settled).live is live


# ----------------------------------------------------------------------------- the algorithm

class PbsError(BackendError):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Queued:
    name: str
    state: str = "Q"
    comment: str = ""


@dataclass
class Options:
    poll_interval: float | None = 60.0  # the loop never polls on its own here: the tests call poll()
    connect_timeout: float | None = None


class Pbs(JobBackend):
    """A PBS-like scheduler in memory: what a new batch platform costs (the trio and a table)."""

    platform = "pbs"
    options_type = Options
    service = "PBS"
    states = StateTable.of(waiting=["Q", "H"], running=["R"], unknown=["E"], succeeded=["F"], failed=["X"],
                           stopped=["C"], default="stopped")
    errors = (PbsError,)

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.queue: dict[str, Queued] = {}
        self.calls: list[str] = []
        self.down = False  # the scheduler does not answer
        self.unlisted: set[str] = set()  # jobs qstat leaves out (as a scheduler lists only its newest)
        self.detail = False  # whether `qstat -f <ref>` answers (the `describe` hook)
        self.replicas: dict[str, tuple[Phase, str]] = {}  # per-member states the listing carries (JobView.members)
        self.deadline: float | None = None  # the start deadline (`start_deadline`; None: none)
        self.qsub_faults: list[tuple[int, bool]] = []  # the next qsubs' answers: (status, whether it made the job)
        self.qstat_faults = 0  # how many of the next listings fail

    def submit_pause(self) -> float:
        return 0.0

    @property
    def start_deadline(self) -> float | None:
        return self.deadline

    async def open(self) -> None:
        self.calls.append("open")

    async def prepare(self, job: Job, env: EnvironmentRequest) -> str:
        return f"#PBS -N {job.name}\nnni-agent --agent-id {env.env_id}"

    async def submit(self, job: Job, request: str) -> None:
        self._answer("qsub")
        status, made = self.qsub_faults.pop(0) if self.qsub_faults else (0, True)
        ref = f"{len(self.queue) + 1}.pbs"
        if made:
            self.queue[ref] = Queued(job.name)
        if status:
            raise PbsError(f"qsub: {status}", status)
        job.ref = ref

    async def list_jobs(self) -> dict[str, JobView]:
        self._answer("qstat")
        if self.qstat_faults:
            self.qstat_faults -= 1
            raise PbsError("qstat: 503", 503)
        return {q.name: self._view(ref, q) for ref, q in self.queue.items()
                if q.name.startswith(self.prefix) and ref not in self.unlisted}  # the experiment's, by name

    async def describe(self, job: Job) -> JobView | None:
        self._answer(f"qstat -f {job.ref}")
        q = self.queue.get(job.ref)
        return self._view(job.ref, q) if q is not None and self.detail else None

    def _view(self, ref: str, q: Queued) -> JobView:
        return JobView(q.name, self.states.phase(q.state), f"PBS job {ref} is {q.state}{q.comment}", ref,
                       members=dict(self.replicas))

    async def cancel(self, job: Job) -> None:
        self._answer("qdel")
        if job.ref in self.queue:
            self.queue[job.ref].state = "C"

    def _answer(self, command: str) -> None:
        self.calls.append(command)
        if self.down:
            raise PbsError(f"{command}: cannot connect to server")


@dataclass
class Ctx:
    """What the core offers a backend, recorded."""

    experiment_id: str = "exp1"
    experiment_dir: Path = Path("/nonexistent")
    envs: list[EnvironmentRequest] = field(default_factory=list)
    connected: set[str] = field(default_factory=set)
    status: dict[str, str] = field(default_factory=dict)
    failed: list[tuple[str, str, bool]] = field(default_factory=list)

    def add_agent(self, name: str, hints: PlacementHints = PlacementHints()) -> AgentSpec:
        raise AssertionError("not a fixed backend")

    def agent_failed(self, agent_id: str, reason: str, *, failed: bool = False) -> None:
        self.failed.append((agent_id, reason, failed))

    def agent_status(self, agent_id: str, message: str) -> None:
        self.status[agent_id] = message

    def agent_url(self, agent_id: str, url: str) -> None:
        pass

    def agent_connected(self, agent_id: str) -> bool:
        return agent_id in self.connected

    def environments(self) -> list[EnvironmentRequest]:
        return self.envs


def backend(ctx: Ctx, **options: Any) -> Pbs:
    config = ExperimentConfig(trial_command="true", trial_code_directory=Path("."), trial_grace_period=0.0,
                              training_service=TrainingServiceConfig(platform="pbs", options=Options(**options)))
    b = Pbs(config)
    b.ctx, b.experiment_id = ctx, ctx.experiment_id
    return b


def env(env_id: str = "env1", trial: str | None = None) -> EnvironmentRequest:
    spec = AgentSpec(agent_id=env_id, token="t", hub_address="10.0.0.1:8999",  # not dialed
                     hub_unix_socket=Path("/dev/null"))
    return EnvironmentRequest(env_id, (spec,), trial)


def clocked(deadline: float | None = None, **options: Any) -> tuple[Ctx, Pbs, list[float]]:
    """A backend on a clock the test moves (`clock[0] += 60`), with a start deadline if given."""
    ctx = Ctx()
    b = backend(ctx, **options)
    b.deadline = deadline
    clock = [1000.0]
    b.clock = lambda: clock[0]
    return ctx, b, clock


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_names_follow_nnis_pattern_for_pools_and_single_trials() -> None:
    b = backend(Ctx())
    assert b.job_name("env7", None) == "nni_exp_exp1_env_7"
    assert b.job_name("trial-ab", "Ab") == "nni_exp_exp1_trial_Ab"


def test_waiting_then_running_words_and_the_agent_that_dials() -> None:
    ctx, b, clock = clocked()

    async def main() -> None:
        await b.provision(env())
        assert ctx.status["env1"] == "PBS job nni_exp_exp1_env_1 is submitted"
        await b.provision(env())  # the guard: a job that still runs is not submitted twice
        assert b.calls.count("qsub") == 1
        clock[0] += 5
        await b.poll()
        assert ctx.status["env1"] == "PBS job 1.pbs is Q (for 5 s)"
        clock[0] += 150
        await b.poll()
        assert ctx.status["env1"] == "PBS job 1.pbs is Q (for 2 min)"
        b.queue["1.pbs"].state = "R"
        clock[0] += 150
        await b.poll()
        assert ctx.status["env1"].startswith("PBS job 1.pbs is R (for 0 s) but its agent has not dialled 10.0.0.1:8999 "  # not dialed
                                             "yet: if this lasts, check that the job's nodes can reach 10.0.0.1:8999")  # not dialed
        clock[0] += 7
        await b.poll()
        assert ctx.status["env1"].startswith("PBS job 1.pbs is R (for 7 s) but")
        assert b.enrolment_open("env1") is True
        ctx.connected.add("env1")
        await b.poll()
        assert ctx.status["env1"] == "PBS job 1.pbs is R" and ctx.failed == []

    run(main())


def test_a_running_job_whose_agent_never_dials_is_failed_and_cancelled() -> None:
    ctx, b, clock = clocked(connect_timeout=30.0)

    async def main() -> None:
        await b.provision(env())
        b.queue["1.pbs"].state = "R"
        await b.poll()  # seen running now
        clock[0] += 30
        await b.poll()
        assert ctx.failed == [] and b.queue["1.pbs"].state == "R"  # 30 s: not longer than the timeout
        clock[0] += 1
        await b.poll()
        [(agent, reason, failed)] = ctx.failed
        assert agent == "env1" and failed and b.queue["1.pbs"].state == "C"
        assert reason.startswith("PBS job nni_exp_exp1_env_1 ran for 30 s but its agent never dialled 10.0.0.1:8999")  # not dialed
        assert reason.endswith("; the job was stopped")
        await b.poll()
        assert len(ctx.failed) == 1  # reported once

    run(main())


def test_a_job_not_started_by_the_start_deadline_is_failed_in_its_last_words_and_cancelled() -> None:
    ctx, b, clock = clocked(deadline=60.0)

    async def main() -> None:
        await b.provision(env())
        b.queue["1.pbs"].comment = " (no node has 8 GPUs)"
        clock[0] += 60
        await b.poll()
        assert ctx.failed == [] and ctx.status["env1"] == "PBS job 1.pbs is Q (no node has 8 GPUs) (for 60 s)"
        clock[0] += 1
        await b.poll()
        assert ctx.failed == [("env1", "PBS job 1.pbs is Q (no node has 8 GPUs) (not started within "
                                       "environmentStartTimeout, 60 s)", True)]
        assert b.queue["1.pbs"].state == "C"
        await b.poll()
        assert len(ctx.failed) == 1  # reported once

    run(main())


def test_the_start_deadline_waits_for_every_member_and_ends_once_the_job_started() -> None:
    ctx, b, clock = clocked(deadline=60.0)

    async def main() -> None:
        await b.provision(env())
        b.queue["1.pbs"].state = "R"
        b.replicas = {"env1": ("waiting", "pod p1: ImagePullBackOff: pulling")}  # its job runs; it does not
        clock[0] += 61
        await b.poll()
        assert ctx.failed == [("env1", "pod p1: ImagePullBackOff: pulling (not started within "
                                       "environmentStartTimeout, 60 s)", True)]
        await b.provision(env("env2"))
        b.queue["2.pbs"].state = "R"
        b.replicas = {}
        await b.poll()  # started: the deadline is behind it
        b.queue["2.pbs"].state = "H"  # held again, long after
        clock[0] += 600
        await b.poll()
        assert len(ctx.failed) == 1 and b.queue["2.pbs"].state == "H"

    run(main())


def test_a_job_missing_from_three_listings_in_a_row_is_gone() -> None:
    ctx = Ctx()
    b = backend(ctx)

    async def main() -> None:
        await b.provision(env())
        saved = b.queue.pop("1.pbs")
        await b.poll()
        await b.poll()
        b.queue["1.pbs"] = saved  # a glitch: back in the listing, the count starts again
        await b.poll()
        del b.queue["1.pbs"]
        await b.poll()
        await b.poll()
        assert ctx.failed == []
        await b.poll()
        assert ctx.failed == [("env1", "PBS job nni_exp_exp1_env_1 is no longer known to PBS", False)]

    run(main())


@pytest.mark.parametrize("state, failed", [("X", True), ("C", False), ("F", False), ("Z", False)])
def test_a_job_that_ends_on_its_own_ends_its_trials_in_the_platforms_words(state: str, failed: bool) -> None:
    ctx = Ctx()
    b = backend(ctx)

    async def main() -> None:
        await b.provision(env("trial-a", "a"))
        b.queue["1.pbs"].state, b.queue["1.pbs"].comment = state, " (exit 3)"
        await b.poll()
        assert ctx.failed == [("trial-a", f"PBS job 1.pbs is {state} (exit 3)", failed)]
        assert b.jobs["trial-a"].done

    run(main())


def test_a_released_job_is_cancelled_and_its_end_is_not_news() -> None:
    ctx = Ctx()
    b = backend(ctx)

    async def main() -> None:
        await b.provision(env())
        await b.release("env1")
        assert b.queue["1.pbs"].state == "C"
        await b.poll()
        assert ctx.failed == [] and b.jobs["env1"].done

    run(main())


def test_a_refusal_raises_and_the_job_is_not_watched() -> None:
    ctx = Ctx()
    b = backend(ctx)
    b.down = True

    async def main() -> None:
        with pytest.raises(PbsError, match="qsub: cannot connect"):
            await b.provision(env())
        assert b.jobs["env1"].done and not b.jobs["env1"].submitted

    run(main())


def test_a_creation_answered_5xx_is_looked_up_by_name_then_tried_again_never_made_twice() -> None:
    async def provision(qsub: list[tuple[int, bool]], qstat: int = 0) -> Pbs:
        b = backend(Ctx())
        b.qsub_faults, b.qstat_faults = qsub, qstat
        await b.provision(env())
        return b

    async def main() -> None:
        made = await provision([(503, True)])  # it made the job after all: adopted
        assert made.calls == ["qsub", "qstat"] and len(made.queue) == 1 and made.jobs["env1"].ref == "1.pbs"
        lost = await provision([(503, False), (429, False)])  # nothing made: tried again after each look
        assert lost.calls == ["qsub", "qstat", "qsub", "qstat", "qsub"] and len(lost.queue) == 1
        blind = await provision([(502, False)], qstat=2)  # no listing yet: no new try until one answers
        assert blind.calls == ["qsub", "qstat", "qstat", "qstat", "qsub"] and len(blind.queue) == 1
        with pytest.raises(PbsError, match="qsub: 403"):  # a refusal is not retried
            await provision([(403, False)])
        b = backend(Ctx())
        b.qsub_faults = [(503, False)] * 5
        with pytest.raises(PbsError, match="qsub: 503"):  # it gives up after submit_attempts
            await b.provision(env())
        assert b.calls.count("qsub") == b.submit_attempts and not b.queue

    run(main())


def test_reattach_finds_wanted_jobs_fails_gone_ones_and_stops_unwanted_ones() -> None:
    ctx = Ctx(envs=[env("env1"), env("env2")])
    b = backend(ctx)
    b.queue = {"7.pbs": Queued("nni_exp_exp1_env_1", "R"), "8.pbs": Queued("nni_exp_exp1_env_9", "R"),
               "9.pbs": Queued("nni_exp_exp1_env_8", "F")}

    async def main() -> None:
        await b.start(ctx)  # type: ignore[arg-type]
        try:
            assert b.jobs["env1"].ref == "7.pbs" and not b.jobs["env1"].done
            assert ctx.failed == [("env2", "PBS job nni_exp_exp1_env_2 is gone (it ended while the manager was down)",
                                   False)]
            assert (b.queue["8.pbs"].state, b.queue["9.pbs"].state) == ("C", "F")  # only the live one is stopped
        finally:
            await b.stop()

    run(main())


def test_start_fails_when_the_scheduler_cannot_list_and_nothing_is_to_reattach() -> None:
    ctx = Ctx()
    b = backend(ctx)
    b.down = True
    with pytest.raises(PbsError, match="qstat"):
        run(b.start(ctx))  # type: ignore[arg-type]


def test_stop_all_cancels_known_and_listed_jobs_then_waits_for_their_end() -> None:
    ctx = Ctx()
    b = backend(ctx)
    b.queue["1.pbs"] = Queued("nni_exp_exp1_env_5", "R")  # an earlier manager's job, by prefix
    b.queue["2.pbs"] = Queued("nni_exp_other_env_1", "R")  # another experiment's: not ours

    async def main() -> None:
        await b.provision(env())
        b._opened = True
        await b.stop()
        assert {r: q.state for r, q in b.queue.items()} == {"1.pbs": "C", "2.pbs": "R", "3.pbs": "C"}
        assert b.calls[-1] == "qstat"  # it looked once more and saw nothing live

    run(main())


def test_a_job_the_listing_leaves_out_is_described_not_counted_missing() -> None:
    ctx = Ctx()
    b = backend(ctx)
    b.detail = True

    async def main() -> None:
        await b.provision(env())
        b.unlisted.add("1.pbs")
        for _ in range(4):
            await b.poll()
        assert ctx.failed == [] and b.calls[-2:] == ["qstat", "qstat -f 1.pbs"]
        assert ctx.status["env1"].startswith("PBS job 1.pbs is Q")
        b.queue["1.pbs"].state = "X"
        await b.poll()
        assert ctx.failed == [("env1", "PBS job 1.pbs is X", True)]  # the detail's end, in its words

    run(main())


def test_a_platform_that_lists_once_describes_each_tracked_job_per_poll() -> None:
    """`list_once` (AML): the listing at start and stop, `describe` for each tracked job between."""
    ctx = Ctx(envs=[env("env1")])
    b = backend(ctx)
    b.list_once = True  # type: ignore[misc]
    b.detail = True
    b.queue = {"7.pbs": Queued("nni_exp_exp1_env_1", "R"), "8.pbs": Queued("nni_exp_exp1_env_9", "R")}

    async def main() -> None:
        await b.start(ctx)  # type: ignore[arg-type]
        try:
            assert b.calls == ["open", "qstat", "qdel"]  # listed once: env 9 is no longer wanted
            await b.poll()
            await b.poll()
            assert b.calls[3:] == ["qstat -f 7.pbs", "qstat -f 7.pbs"]
        finally:
            b.calls.clear()
            await b.stop()
        assert b.calls == ["qdel", "qstat"] and b.queue["7.pbs"].state == "C"  # stop lists everything once more

    run(main())


def test_a_platform_that_lists_once_lists_until_the_listing_answers() -> None:
    ctx = Ctx(envs=[env("env1")])
    b = backend(ctx)
    b.list_once = True  # type: ignore[misc]
    b.detail = True
    b.queue = {"7.pbs": Queued("nni_exp_exp1_env_1", "R")}
    b.down = True

    async def main() -> None:
        await b.start(ctx)  # type: ignore[arg-type]  # a wanted job: re-attaching waits for the platform
        try:
            b.down = False
            await b.poll()
            await b.poll()
            assert [c for c in b.calls if c.startswith("qstat")] == ["qstat", "qstat", "qstat -f 7.pbs"]
        finally:
            await b.stop()

    run(main())


def test_a_member_the_listing_says_ended_ends_alone_while_its_job_runs_on() -> None:
    """JobView.members (a replica's pod on Kubernetes): a failed member fails alone, once; the others
    keep their job's words or their own; the job's end then ends only the members still there."""
    ctx = Ctx()
    b = backend(ctx)
    spec = [AgentSpec(agent_id=f"w{i}", token="t", hub_address="10.0.0.1:8999",  # not dialed
                      hub_unix_socket=Path("/dev/null")) for i in range(3)]

    async def main() -> None:
        await b.provision(EnvironmentRequest("env1", tuple(spec)))
        b.queue["1.pbs"].state = "R"
        ctx.connected.update({"w0", "w1", "w2"})
        b.replicas = {"w1": ("failed", "pod w1 failed: OOMKilled"), "w2": ("waiting", "pod w2 pulls its image")}
        await b.poll()
        assert ctx.failed == [("w1", "pod w1 failed: OOMKilled", True)]
        assert (ctx.status["w0"], ctx.status["w2"]) == ("PBS job 1.pbs is R", "pod w2 pulls its image")
        assert ctx.status["w1"] == "PBS job nni_exp_exp1_env_1 is submitted"  # not told the job's words after its end
        ctx.connected.discard("w1")
        await b.poll()
        assert len(ctx.failed) == 1  # once
        b.queue["1.pbs"].state = "F"
        await b.poll()
        assert ctx.failed[1:] == [("w0", "PBS job 1.pbs is F", False), ("w2", "PBS job 1.pbs is F", False)]

    run(main())


def test_a_running_member_whose_agent_has_not_dialled_says_so_over_its_own_words() -> None:
    """JobView.members carrying a running pod's own words (Kubernetes: "waiting for the agent in pod
    ... to connect") still say the agent has not dialled and what to check; a waiting member keeps
    its own words, and a member that dialled hears no such line."""
    ctx = Ctx()
    b = backend(ctx)
    spec = [AgentSpec(agent_id=f"w{i}", token="t", hub_address="10.0.0.1:8999",  # not dialed
                      hub_unix_socket=Path("/dev/null")) for i in range(3)]

    async def main() -> None:
        await b.provision(EnvironmentRequest("env1", tuple(spec)))
        b.queue["1.pbs"].state = "R"
        ctx.connected.add("w2")
        b.replicas = {"w0": ("running", "waiting for the agent in pod w0 to connect"),
                      "w1": ("waiting", "pod w1 pulls its image"), "w2": ("running", "pod w2 runs")}
        await b.poll()
        assert ctx.status["w0"].startswith("PBS job 1.pbs is R (for 0 s) but its agent has not dialled "
                                           "10.0.0.1:8999 yet: if this lasts, check"), ctx.status  # not dialed
        assert (ctx.status["w1"], ctx.status["w2"]) == ("pod w1 pulls its image", "pod w2 runs")

    run(main())
