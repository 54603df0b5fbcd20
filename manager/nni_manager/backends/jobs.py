"""The job pattern, once, for every platform where one environment is one job a scheduler runs:
OpenPAI, DLTS and Azure ML over REST (`rest_jobs.py`), Slurm over its commands (`slurm/`), the
Kubernetes family over the API server (`kubernetes/common.py`: a job is an environment's main
object; its pod watch ends members and jobs through `_members_ended` / `_ended` too).

A platform says only what differs, as TorchX's `Scheduler` and submitit's `InfoWatcher` do:

- `submit(job, request)`: create the job from what `build_request(env)` made (the dry run renders
  the same request, for placeholder credentials; `prepare` writes what the job needs first);
- `list_jobs()`: one call for every job of the experiment, each mapped onto a `JobView` through
  the platform's `StateTable` (its states -> waiting / running / succeeded / failed / stopped),
  optionally with each member's own phase (`JobView.members`: a failed replica fails its member);
- `describe(job)` (optional): one tracked job the listing left out, from the platform's per-job
  detail (DLTS lists only its newest jobs; AML lists only live ones, and only at start and stop:
  `list_once`);
- `cancel(job)`: ask the platform to stop the job (idempotent).

Everything else lives here: job names `nni_exp_<exp>_env_<n>` / `nni_exp_<exp>_trial_<trial>`
(so a restarted manager re-attaches by name and `stop` finds every job of the experiment by
prefix, an earlier manager's too); the provision guard; `release`; the poll loop (one listing
for all jobs, sooner when an agent dials early); the "missing for `missing_polls` polls" rule;
`agentConnectTimeout` (a job that runs without its agents dialling in is failed and stopped);
the start deadline (`start_deadline`, a platform's `environmentStartTimeout`: a job not started by
then is failed and stopped, in its last words);
stop-all bounded by `Backend.stop_deadline`; and how a job that ended on its own ends its trials
(phase failed: FAILED, the trial's own doing; otherwise SYS_CANCELED, in the platform's words).
"""
from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, TypeVar, cast

from nni_agent.compat import wait_for
from nni_manager.backends.base import BackendContext, BackendError, ElasticBackend, EnvironmentRequest, RequestT

if TYPE_CHECKING:
    from nni_manager.config import ConfigSection, ExperimentConfig

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 5.0  # NNI polled OpenPAI every 5 s, DLTS every 3 s
DEFAULT_CONNECT_TIMEOUT = 600.0
STOP_LIST_TRIES = 3  # listings (each retried by the client) before clean-up says which jobs may still run
MISSING_POLLS = 3  # polls in a row a submitted job may be absent from the listing before it counts as gone

Phase = Literal["waiting", "running", "succeeded", "failed", "stopped", "unknown"]
PHASES: tuple[Phase, ...] = ("waiting", "running", "succeeded", "failed", "stopped", "unknown")
LIVE_PHASES = frozenset({"waiting", "running", "unknown"})  # the job may still have processes


class StateTable(Mapping[str, Phase]):
    """A platform's job states mapped onto phases; a state the table does not list takes
    `default` ("unknown": live, watched, never failed for a slow agent)."""

    def __init__(self, phases: Mapping[str, Phase], default: Phase = "unknown") -> None:
        bad = sorted(f"{s}: {p}" for s, p in phases.items() if p not in PHASES)
        if bad or default not in PHASES:
            raise ValueError(f"not a phase ({', '.join(PHASES)}): {', '.join(bad) or default}")
        self._phases = dict(phases)
        self.default: Phase = default

    @classmethod
    def of(cls, default: Phase = "unknown", **groups: Iterable[str]) -> StateTable:
        """`StateTable.of(waiting=["PENDING"], running=["RUNNING"], failed=[...], ...)`."""
        # a key that is not a phase is refused by __init__
        return cls({state: cast(Phase, phase) for phase, states in groups.items() for state in states}, default)

    def phase(self, state: str) -> Phase:
        return self._phases.get(state, self.default)

    def __getitem__(self, state: str) -> Phase:
        return self._phases[state]

    def __iter__(self) -> Iterator[str]:
        return iter(self._phases)

    def __len__(self) -> int:
        return len(self._phases)


@dataclass(frozen=True)
class JobView:
    """What one listing says about a job, mapped through the platform's state table.

    `words` are the platform's own (state, reason, exit diagnostics): the WAITING trial's
    message while the job waits, the trial's message when the job ends on its own."""

    name: str
    phase: Phase
    words: str
    ref: str = ""  # the platform's id of the job, when it is not its name
    settled: bool = True  # False while an ended job is still stopping (its processes may live)
    state: str = ""  # the platform's own state, as listed
    # per member (agent id -> (phase, words)), where the platform says how each replica fares: a
    # member that ended ends alone (a failed replica fails its member) while its job runs on, and
    # a live member's own words replace the job's for it
    members: Mapping[str, tuple[Phase, str]] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Whether the job may still have processes (what clean_up waits for)."""
        return self.phase in LIVE_PHASES or not self.settled


@dataclass
class Job:
    env_id: str
    name: str
    members: list[str]
    trial_id: str | None = None
    ref: str = ""  # the platform's id (OpenPAI: none; DLTS: jobId; Slurm: the job id)
    submitted: bool = False
    done: bool = False
    released: bool = False
    missing: int = 0
    said: dict[str, str] = field(default_factory=dict)  # member -> the words it was last told
    ended: set[str] = field(default_factory=set)  # members that ended alone (JobView.members)
    since: float = field(default_factory=time.monotonic)
    running_since: float | None = None  # when the platform first said the job runs
    started: bool = False  # the job and each of its members were seen running (no start deadline after)
    hub: str = ""  # the address its agents dial


def since(start: float, now: float) -> str:
    """How long before `now` `start` was, in words."""
    s = int(now - start)
    return f"{s} s" if s < 120 else f"{s // 60} min"


def parse_watch_fields(ts: ConfigSection) -> tuple[float | None, float | None]:
    """The fields every job platform takes: (`pollInterval`, `agentConnectTimeout`) in seconds."""
    return ts.duration("pollInterval"), ts.duration("agentConnectTimeout")


class JobOptions(Protocol):
    """What the pattern reads of every job platform's options (`parse_watch_fields`)."""

    @property
    def poll_interval(self) -> float | None: ...  # pollInterval, seconds (None: the default)

    @property
    def connect_timeout(self) -> float | None: ...  # agentConnectTimeout, seconds (None: the default)


JobOptionsT = TypeVar("JobOptionsT", bound=JobOptions)


class JobBackend(ElasticBackend[JobOptionsT, RequestT]):
    """An elastic backend where one environment is one job (see the module docstring)."""

    hub = "network"
    default_reconnect_window = 300.0
    service: ClassVar[str] = "the platform"  # the platform's name in messages ("OpenPAI", "Slurm")
    states: ClassVar[StateTable] = StateTable({})
    missing_polls: ClassVar[int] = MISSING_POLLS
    # True: the listing is read once at start and once at stop (and until it first answers), a poll
    # looks at each tracked job with `describe` (a platform whose listing costs pages and leaves ended
    # jobs out)
    list_once: ClassVar[bool] = False
    # what the platform raises when it refuses or does not answer (others are bugs: logged with a traceback)
    errors: ClassVar[tuple[type[Exception], ...]] = (BackendError,)

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.experiment_id = "dryrun"
        self.ctx: BackendContext | None = None
        self.jobs: dict[str, Job] = {}  # by env id
        self._poller: asyncio.Task[None] | None = None
        self._opened = False  # the platform answered `open`: there may be jobs to stop
        self._listed = False  # the listing answered once (a `list_once` platform's polls list until it has)
        self._poked = asyncio.Event()  # an agent dialled before its job was seen running
        # what `poll` measures waits and the connect timeout with (unit tests pass their own)
        self.clock: Callable[[], float] = time.monotonic

    # ------------------------------------------------------------------ what a platform says
    @abc.abstractmethod
    async def open(self) -> None:
        """Reach the platform and check the credentials (raise one of `errors`, with the fix)."""

    async def close(self) -> None:
        """Let go of the platform (clients, connections, files of its own)."""

    async def prepare(self, job: Job, env: EnvironmentRequest) -> RequestT:
        """The request that creates the job of `env`: `build_request(env)` (files it needs, the
        tokens, are written here)."""
        return self.build_request(env)

    @abc.abstractmethod
    async def submit(self, job: Job, request: RequestT) -> None:
        """Create the job; set `job.ref` when the platform names jobs itself. Submitting the same
        name again after an unclear failure must not make a second job."""

    @abc.abstractmethod
    async def list_jobs(self) -> dict[str, JobView]:
        """Every job of this experiment the platform knows, by name (one call where the platform
        allows; the newest job of a name last). Raise one of `errors` when it does not answer."""

    async def describe(self, job: Job) -> JobView | None:
        """The platform's detail of one job it did not list; None when it has no such call or
        does not know the job either (then the "missing for `missing_polls` polls" rule decides)."""
        return None

    @abc.abstractmethod
    async def cancel(self, job: Job) -> None:
        """Ask the platform to stop the job (idempotent)."""

    def refused(self, job: Job, error: Exception) -> Exception:
        """The error `provision` raises when the platform refused the job."""
        return error

    # a job creation the platform answered 5xx or 429 (it may or may not have made the job) is
    # tried this many times, the job looked up by name before each new try, pausing 1, 2, 4 ... s
    submit_attempts: ClassVar[int] = 5

    def submit_pause(self) -> float:
        """The first pause between tries of a job creation (rest_jobs.py: its test knob)."""
        return 1.0

    async def _submit_through_faults(self, job: Job, request: RequestT) -> None:
        """`submit`, again after a transient answer once the listing shows no job of its name
        (one that does is adopted: never a second job of a name). Refusals raise at once."""
        pause, attempt = self.submit_pause(), 1
        while True:
            try:
                await self.submit(job, request)
                return
            except self.errors as e:
                status = getattr(e, "status", 0)
                if not (status >= 500 or status == 429) or attempt >= self.submit_attempts or job.released:
                    raise
                unclear = e
                log.warning("%s: %s; looking for it by name in %.1f s, then trying again (attempt %d of %d)",
                            job.name, e, pause, attempt, self.submit_attempts)
            while True:  # whether the platform made it after all
                await asyncio.sleep(pause)
                pause, attempt = pause * 2, attempt + 1
                try:
                    listed = (await self.list_jobs()).get(job.name)
                    break
                except self.errors as e:
                    if attempt >= self.submit_attempts or job.released:
                        raise unclear from None
                    log.warning("%s: looking for it: %s", job.name, e)
            if listed is not None:
                job.ref = job.ref or listed.ref
                return

    def job_url(self, job: Job) -> str:
        """The job's page in the platform's UI ("" when there is none)."""
        return ""

    def job_label(self, job: Job) -> str:
        """The job in messages."""
        return f"{self.service} job {job.name}"

    def submitted_words(self, job: Job) -> str:
        return f"{self.job_label(job)} is submitted"

    async def ended_words(self, job: Job, view: JobView) -> str:
        """Why a job ended on its own; platforms may fetch the job's exit diagnostics here."""
        return view.words

    async def forget(self, job: Job) -> None:
        """The job ended or was released: remove what was made for it alone (token files)."""

    def check_hint(self, job: Job) -> str:
        """What to check when a running job's agent does not dial in."""
        return (f"check that the job's nodes can reach {self._hub(job)} (nniManagerIp, hubPort, firewalls) and that "
                "its image has Python >= 3.8 with nni-agent (the job's log says which)")

    @property
    def poll_interval(self) -> float:
        """How often one listing looks at every job (`pollInterval`)."""
        return self.opts.poll_interval or DEFAULT_POLL_INTERVAL

    @property
    def start_deadline(self) -> float | None:
        """How long a submitted job may take to start (it runs and no member of it waits) before it is
        failed and stopped, saying `environmentStartTimeout`; None (the default): as long as the
        platform keeps it queued."""
        return None

    @property
    def connect_timeout(self) -> float:
        """How long a job may run without its agents dialling in before it is failed and stopped
        (`agentConnectTimeout`)."""
        return self.opts.connect_timeout or DEFAULT_CONNECT_TIMEOUT

    # ------------------------------------------------------------------ names
    @property
    def prefix(self) -> str:
        return f"nni_exp_{self.experiment_id}_"

    def job_name(self, env_id: str, trial_id: str | None) -> str:
        if trial_id:
            return f"{self.prefix}trial_{trial_id}"
        return f"{self.prefix}env_{env_id.removeprefix('env')}"

    # ------------------------------------------------------------------ lifecycle
    async def start(self, ctx: BackendContext) -> None:
        self.ctx = ctx
        self.experiment_id = ctx.experiment_id
        await self.open()
        self._opened = True
        await self._reattach()
        self._poller = asyncio.create_task(self._poll_loop(), name=f"{self.platform}-poll")

    async def _reattach(self) -> None:
        """After a manager restart: find the jobs of the environments the core still has, fail
        those whose job is gone, and stop jobs of this experiment nothing wants any more."""
        assert self.ctx is not None
        wanted: dict[str, Job] = {}
        for env in self.ctx.environments():
            job = Job(env.env_id, self.job_name(env.env_id, env.trial_id), [m.agent_id for m in env.members],
                      env.trial_id, submitted=True, hub=env.members[0].hub_address if env.members else "")
            wanted[job.name] = job
            self.jobs[env.env_id] = job
        try:
            views = await self._views(everything=True)
        except self.errors as e:
            if wanted:
                log.warning("%s; re-attaching when it answers", e)
                return
            raise
        for name, view in views.items():
            found = wanted.get(name)
            if found is not None:
                found.ref = view.ref
                self._tell_url(found)
            elif view.live:
                log.info("stopping %s job %s: its environment is no longer used", self.service, name)
                await self._cancel_quietly(Job("", name, [], ref=view.ref))
        for name, job in wanted.items():
            if name not in views and job.members:
                job.done = True
                self.ctx.agent_failed(job.members[0], f"{self.job_label(job)} is gone "
                                                      "(it ended while the manager was down)")

    async def provision(self, env: EnvironmentRequest) -> None:
        assert self.ctx is not None
        job = self.jobs.get(env.env_id)
        if job is not None and job.submitted and not job.done:
            return  # a restarted manager re-provisioning a job that still runs
        job = Job(env.env_id, self.job_name(env.env_id, env.trial_id), [m.agent_id for m in env.members],
                  env.trial_id, hub=env.members[0].hub_address if env.members else "")
        self.jobs[env.env_id] = job
        try:
            request = await self.prepare(job, env)
            await self._submit_through_faults(job, request)
        except self.errors as e:
            job.done = True
            raise self.refused(job, e) from None
        except BaseException:
            job.done = True
            raise
        job.submitted = True
        job.since = self.clock()
        if job.released:  # released while the platform was answering
            await self._cancel_quietly(job)
            return
        self._tell_url(job)
        self._say(job, self.submitted_words(job))

    async def release(self, env_id: str) -> None:
        job = self.jobs.get(env_id)
        if job is None:
            return
        job.released = True
        if job.submitted and not job.done:
            await self._cancel_quietly(job)
        await self.forget(job)

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        try:
            if self._opened:
                await self._stop_all()
        finally:
            await self.close()

    async def _stop_all(self) -> None:
        """Stop every job of this experiment and wait, bounded by `stop_deadline`, until the
        platform says they ended.

        The jobs this manager knows are asked to stop first, whether or not the platform can list
        them now; the listing (by name prefix: an earlier manager's jobs too) is retried with
        backoff; if it never answers, one line says which jobs may still run."""
        deadline = time.monotonic() + self.stop_deadline
        asked: set[str] = set()
        unsure: set[str] = set()  # asked, but the platform did not take the request
        for job in list(self.jobs.values()):
            job.released = True  # a submission still waiting (a rate limit) is abandoned
            if job.submitted and not job.done:
                asked.add(job.name)
                if not await self._cancel_quietly(job):
                    unsure.add(job.name)
        failures, pause = 0, 1.0
        listed = False  # a `list_once` platform lists once here, then describes what it tracks
        while True:
            try:
                views = await self._views(everything=not (self.list_once and listed))
                listed = True
            except self.errors as e:
                failures += 1
                if failures >= STOP_LIST_TRIES or time.monotonic() + pause > deadline:
                    left = ", ".join(sorted(asked)) or "none known to this manager"
                    log.error("%s jobs of experiment %s may still run, as the platform could not be listed to "
                              "stop and check them (%s): %s%s; any other job named %s* (an earlier manager's) too, "
                              "until it ends or its agents' orphan timeout", self.service, self.experiment_id, e,
                              left, f" (the stop request failed for {', '.join(sorted(unsure))})" if unsure else "",
                              self.prefix)
                    return
                log.warning("%s: listing the jobs of experiment %s to stop them: %s; again in %.0f s",
                            self.service, self.experiment_id, e, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)
                continue
            failures = 0
            live = {n: v for n, v in views.items() if v.live}
            for name, view in live.items():
                if name not in asked or name in unsure:
                    asked.add(name)
                    job = next((j for j in self.jobs.values() if j.name == name), None) or Job("", name, [], ref=view.ref)
                    job.released = True
                    if await self._cancel_quietly(job):
                        unsure.discard(name)
            if not live:
                return
            if time.monotonic() > deadline:
                log.error("%s jobs of experiment %s are still ending: %s", self.service, self.experiment_id,
                          ", ".join(sorted(live)))
                return
            await asyncio.sleep(min(self.poll_interval, 1.0))

    async def _cancel_quietly(self, job: Job) -> bool:
        """Ask the platform to stop the job; False (logged) when it did not take the request."""
        try:
            await self.cancel(job)
        except self.errors as e:
            log.warning("stopping %s job %s: %s", self.service, job.name, e)
            return False
        return True

    # ------------------------------------------------------------------ watching
    def _say(self, job: Job, words: str, members: Mapping[str, tuple[Phase, str]] | None = None) -> None:
        assert self.ctx is not None
        for m in job.members:
            said = (members or {}).get(m, ("", words))[1]
            if m not in job.ended and job.said.get(m) != said:
                job.said[m] = said
                self.ctx.agent_status(m, said)

    def _members_ended(self, job: Job, view: JobView) -> None:
        """Members the listing says ended, while their job runs on, end alone."""
        assert self.ctx is not None
        for m, (phase, words) in view.members.items():
            if phase not in LIVE_PHASES and m in job.members and m not in job.ended:
                job.ended.add(m)
                if not job.released:
                    self.ctx.agent_failed(m, words, failed=phase == "failed")

    def _tell_url(self, job: Job) -> None:
        assert self.ctx is not None
        url = self.job_url(job)
        if url:
            for m in job.members:
                self.ctx.agent_url(m, url)

    def enrolment_open(self, agent_id: str) -> bool | None:
        """True once a listing said the agent's job runs; False before (and then the next
        listing comes sooner: the agent is dialling)."""
        job = next((j for j in self.jobs.values() if agent_id in j.members), None)
        if job is None or job.done:
            return None
        if job.running_since is not None:
            return True
        self._poked.set()
        return False

    async def _poll_loop(self) -> None:
        last = time.monotonic()
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await wait_for(self._poked.wait(), self.poll_interval)
            self._poked.clear()
            # an agent dialling before its job was seen running (a poke) gets a look now, yet the
            # platform is listed at most once a second (or once a pollInterval, when shorter)
            wait = last + min(1.0, self.poll_interval) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            last = time.monotonic()
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except self.errors as e:
                log.warning("watching the %s jobs: %s", self.service, e)
            except Exception:
                log.exception("watching the %s jobs", self.service)

    async def poll(self) -> None:
        """One look at every job of the experiment."""
        assert self.ctx is not None
        views = await self._views(everything=not self.list_once or not self._listed)
        now = self.clock()
        for job in list(self.jobs.values()):
            if not job.submitted or job.done:
                continue
            view = views.get(job.name)
            if view is None:
                job.missing += 1
                if job.missing >= self.missing_polls:  # several polls in a row: not a glitch
                    await self._ended(job, JobView(job.name, "unknown",
                                                   f"{self.job_label(job)} is no longer known to {self.service}"))
                continue
            job.missing = 0
            if view.ref and not job.ref:
                job.ref = view.ref
            if view.phase not in LIVE_PHASES:
                await self._ended(job, view)
                continue
            self._members_ended(job, view)
            if not job.started and await self._past_start_deadline(job, view, now):
                continue
            words = view.words
            if view.phase == "waiting":
                words += f" (for {since(job.since, now)})"
            elif view.phase == "running":
                job.running_since = job.running_since or now
                if not all(self.ctx.agent_connected(m) for m in job.members if m not in job.ended):
                    if now - job.running_since > self.connect_timeout and not job.released:
                        await self._ended(job, JobView(
                            job.name, "failed", f"{self.job_label(job)} ran for {self.connect_timeout:g} s but its "
                            f"agent never dialled {self._hub(job)}: {self.check_hint(job)}; the job was stopped"),
                            ours=True)
                        await self._cancel_quietly(job)
                        continue
                    words += (f" (for {since(job.running_since, now)}) but its agent has not dialled {self._hub(job)} "
                              f"yet: if this lasts, {self.check_hint(job)}")
                    # a running member whose agent has not dialled says so too, not only its own
                    # platform's words (a Kubernetes pod's "waiting for the agent ... to connect")
                    members = {m: (ph, words if ph == "running" and not self.ctx.agent_connected(m) else w)
                               for m, (ph, w) in view.members.items()}
                    self._say(job, words, members)
                    continue
            self._say(job, words, view.members)

    async def _past_start_deadline(self, job: Job, view: JobView, now: float) -> bool:
        """Whether the job, not started yet, was failed and stopped now for missing `start_deadline`
        (its first waiting member's words, or the job's, then why); marks it started once it is."""
        waiting = [words for phase, words in view.members.values() if phase == "waiting"]
        if not waiting and view.phase == "running":
            job.started = True
            return False
        deadline = self.start_deadline
        if deadline is None or now - job.since <= deadline or job.released:
            return False
        await self._ended(job, JobView(job.name, "failed", f"{(waiting or [view.words])[0]} (not started within "
                                                           f"environmentStartTimeout, {deadline:g} s)"), ours=True)
        await self._cancel_quietly(job)
        return True

    async def _views(self, everything: bool) -> dict[str, JobView]:
        """The listing (when `everything`), completed with `describe` for each tracked job it left out."""
        views: dict[str, JobView] = {}
        if everything:
            views = await self.list_jobs()
            self._listed = True
        for job in list(self.jobs.values()):
            if job.submitted and not job.done and job.name not in views:
                view = await self.describe(job)
                if view is not None:
                    views[job.name] = view
        return views

    @staticmethod
    def _hub(job: Job) -> str:
        return job.hub or "the manager's hub"

    async def _ended(self, job: Job, view: JobView, ours: bool = False) -> None:
        """The job is over (the platform's verdict, or one of ours): its members end, each with its
        own words where the view has them (a replica that failed before its job ended fails).
        `ours`: the backend's own verdict (its words say why), not an end the platform reported."""
        assert self.ctx is not None
        if job.done:
            return  # ended already (a platform may learn of an end from more than the listing)
        job.done = True
        if job.released:
            await self.forget(job)
            return  # stopped by us: the core knows
        # its words first: a platform may look at the job (its exit diagnostics, its object) before forget cleans up
        words = view.words if ours else await self.ended_words(job, view)
        await self.forget(job)
        for m in job.members:  # the core tells an expected end (its one trial is over) from a loss
            if m not in job.ended:  # told already (JobView.members)
                phase, said = view.members.get(m, (view.phase, words))
                if phase in LIVE_PHASES:  # the member ran to its job's end: the job's words
                    phase, said = view.phase, words
                self.ctx.agent_failed(m, said, failed=phase == "failed")
