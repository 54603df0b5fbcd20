"""The REST-job pattern shared by the platforms whose jobs are created, polled and stopped over
HTTP (OpenPAI, DLTS, Azure ML).

A platform file says only what differs: how a job request looks (`job_request`, rendered for
dry runs by `render_request`), how it is submitted and stopped, and how one listing of the
experiment's jobs maps onto `JobView`s (its status table). Everything else lives here once:

- `RestClient`: an aiohttp session with timeouts; GET, PUT and DELETE (idempotent) are retried
  on connection errors, timeouts, 5xx and 429 with exponential backoff (429's `Retry-After`
  honoured); an error is one line in the platform's words, without credentials or query strings.
- `RestJobBackend`: an elastic backend where one environment is one job. A poll loop makes one
  listing call for all the experiment's jobs, turns waiting and running states into the WAITING
  trial's message, and reports a job that ended on its own (failed, stopped by someone else,
  vanished) to the core; jobs are named `nni_exp_<exp>_env_<n>` / `nni_exp_<exp>_trial_<trial>`
  so a restarted manager re-attaches to them and `stop` finds every one by prefix.
"""
from __future__ import annotations

import abc
import asyncio
import contextlib
import json as _json
import logging
import random
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from nni_manager.backends.agent_command import AgentCommand, Sh
from nni_manager.backends.base import AgentSpec, Backend, BackendContext, BackendError, DryRun, EnvironmentRequest
from nni_manager.config import ConfigSection

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 5.0  # NNI polled OpenPAI every 5 s, DLTS every 3 s
DEFAULT_CONNECT_TIMEOUT = 600.0
STOP_LIST_TRIES = 3  # listings (each retried by the client) before clean-up says which jobs may still run
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class RestError(BackendError):
    """A platform's REST API refused a request or could not be reached: one line, no secret."""

    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any  # parsed JSON when the reply is JSON, else text
    sent_auth: str = field(default="", repr=False)  # the Authorization header it answered


ErrorWords = Callable[[int, Any], tuple[str, str]]  # (status, body) -> (code, message) in the platform's words


def _default_error_words(status: int, body: Any) -> tuple[str, str]:
    if isinstance(body, dict):
        err = body.get("error") if isinstance(body.get("error"), dict) else body
        return str(err.get("code", "")), str(err.get("message", "")) or str(body)[:300]
    return "", str(body).strip()[:300]


class RestClient:
    """One platform's REST endpoint. `auth` gives the headers for each attempt (tokens that expire
    are fetched anew); `service` names the platform in errors."""

    def __init__(self, base_url: str, service: str, *, auth: Callable[[], Awaitable[dict[str, str]]] | None = None,
                 error_words: ErrorWords = _default_error_words, timeout: float = 30.0, attempts: int = 5,
                 backoff: float = 1.0, max_backoff: float = 30.0, ssl: Any = None,
                 fix_for: Callable[[int, str], str] | None = None,
                 reauth: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.service = service
        self._auth = auth
        # drops the refused cached credential (its Authorization header): a 401 is sent once more with a fresh one
        self._reauth = reauth
        self._error_words = error_words
        self._fix_for = fix_for or (lambda status, code: "")
        self.timeout, self.attempts, self.backoff, self.max_backoff = timeout, attempts, backoff, max_backoff
        self._ssl = ssl
        self._session: Any = None
        self._closed = False  # closed for good: a late request (a submission still waiting) is refused
        self.requests = 0  # sent, retries included (benchmarks and tests read it)

    async def _get_session(self) -> Any:
        import aiohttp

        if self._closed:
            raise RestError(f"{self.service}: the client is closed (the experiment is stopping)")
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, *, json: Any = None, data: str | bytes | None = None,
                      content_type: str | None = None, params: dict[str, str] | None = None,
                      retry: bool | None = None, accept: tuple[int, ...] = ()) -> Reply:
        """Send one request; retry it where that is safe (`retry` defaults to the method being
        idempotent). Statuses < 400 and those in `accept` are answers; others raise RestError."""
        import aiohttp

        retry = method in IDEMPOTENT if retry is None else retry
        # an absolute URL (a platform's next-page link, checked by the caller) is sent as given
        url = path if "://" in path else self.base_url + path
        where = f"{self.service} {method} {urlsplit(path).path if '://' in path else path}"
        delay = self.backoff
        last = ""
        for attempt in range(1, (self.attempts if retry else 1) + 1):
            wait: float | None = None
            try:
                reply = await self._send(method, url, json=json, data=data, params=params, content_type=content_type)
                if reply.status == 401 and self._reauth is not None:
                    # a refused credential did nothing: once more at once with a fresh one (revoked, rotated)
                    await self._reauth(reply.sent_auth)
                    reply = await self._send(method, url, json=json, data=data, params=params,
                                             content_type=content_type)
            except aiohttp.InvalidURL as e:
                raise RestError(f"{where}: not a valid URL: {e}") from None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                last = f"{where}: {type(e).__name__}: {e}" if str(e) else f"{where}: no answer within {self.timeout:g} s"
                if isinstance(e, asyncio.TimeoutError):
                    last = f"{where}: no answer within {self.timeout:g} s"
                if not retry or attempt == self.attempts:
                    raise RestError(f"{last} (is {self.base_url} reachable from this machine?)") from None
            else:
                if reply.status < 400 or reply.status in accept:
                    return reply
                code, message = self._error_words(reply.status, reply.body)
                fix = self._fix_for(reply.status, code)
                last = f"{where}: {reply.status}{' ' + code if code else ''}: {message}" + (f"; {fix}" if fix else "")
                transient = reply.status >= 500 or reply.status == 429
                if not (retry and transient) or attempt == self.attempts:
                    raise RestError(last, reply.status, code)
                if reply.status == 429:
                    wait = _retry_after(reply.headers.get("Retry-After"))
            pause = wait if wait is not None else min(delay, self.max_backoff) * (0.5 + random.random() / 2)
            log.warning("%s; retrying in %.1f s (attempt %d of %d)", last, pause, attempt, self.attempts)
            await asyncio.sleep(pause)
            delay *= 2
        raise RestError(last)  # not reached


    async def _send(self, method: str, url: str, *, json: Any, data: str | bytes | None,
                    params: dict[str, str] | None, content_type: str | None) -> Reply:
        """One HTTP exchange; the body parsed as JSON when it is JSON."""
        headers = {"Accept": "application/json"}
        if self._auth is not None:
            headers.update(await self._auth())
        if content_type:
            headers["Content-Type"] = content_type
        session = await self._get_session()
        self.requests += 1
        async with session.request(method, url, json=json, data=data, params=params, headers=headers,
                                   ssl=self._ssl) as resp:
            raw = await resp.read()
            text = raw.decode("utf-8", errors="replace")
            body: Any = text
            if "json" in (resp.headers.get("Content-Type") or "") or text[:1] in "{[":
                try:
                    body = _json.loads(text) if text else None
                except ValueError:
                    body = text
            return Reply(resp.status, dict(resp.headers), body, headers.get("Authorization", ""))


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, min(float(value), 300.0))
    except ValueError:
        from email.utils import parsedate_to_datetime
        try:
            return max(0.0, min(parsedate_to_datetime(value).timestamp() - time.time(), 300.0))
        except (TypeError, ValueError):
            return None


def agent_boot(*, hub_address: str, agent_id: str, token_lines: list[str], tls: bool, ca_lines: list[str],
               orphan_timeout: float, single_trial: bool, env: dict[str, str], image: str,
               pythonpath: str | None = None) -> list[str]:
    """Shell lines (POSIX sh, safe under `set -eu`) that start one agent inside a job's container:
    a private 0700 directory, the token (and CA) written there by `token_lines` / `ca_lines` as
    files of mode 0600 (`"$NNI_AGENT_DIR/token"`, `"$NNI_AGENT_DIR/ca.crt"`), then the boot step
    (nni_agent/boot.py, inline: the image may not have the agent): the Python version, the agent
    and its dependencies' versions checked, one line saying what is wrong otherwise (the job's
    log, then the trial's message), then the agent. `agent_id` may be a shell expression in double
    quotes' syntax; `image` names the image in that line; `pythonpath`: the agent's wheel or
    directory as the container sees it."""
    q = shlex.quote
    lines = ["umask 077",
             'NNI_AGENT_DIR=$(mktemp -d "/tmp/nni-agent.XXXXXX")',
             *token_lines]
    if tls:
        lines += ca_lines
    lines += [f"export {k}={q(v)}" for k, v in env.items()]
    command = AgentCommand(agent_id=Sh(f'"{agent_id}"'), manager=hub_address, token_file=Sh('"$NNI_AGENT_DIR/token"'),
                           work_dir=Sh('"$NNI_AGENT_DIR/work"'), orphan_timeout=orphan_timeout,
                           ca_file=Sh('"$NNI_AGENT_DIR/ca.crt"') if tls else "", single_trial=single_trial,
                           paths=(pythonpath,) if pythonpath else (), where=f"the image {image}")
    lines += command.shell_lines()
    return lines


def literal_secret_lines(token: str, ca_certificate: bytes) -> tuple[list[str], list[str]]:
    """(token_lines, ca_lines) for agent_boot on platforms with no secret store: the single-use
    enrolment credential and the (public) CA written as literals."""
    q = shlex.quote
    return ([f'printf "%s" {q(token)} > "$NNI_AGENT_DIR/token"'],
            [f'printf "%s\\n" {q(ca_certificate.decode().strip())} > "$NNI_AGENT_DIR/ca.crt"'])


Phase = Literal["waiting", "running", "succeeded", "failed", "stopped", "unknown"]


@dataclass(frozen=True)
class JobView:
    """What one listing says about a job, mapped through the platform's status table.

    `words` are the platform's own (state, reason, exit diagnostics): the WAITING trial's
    message while the job waits, the trial's message when the job ends on its own."""

    name: str
    phase: Phase
    words: str
    ref: str = ""  # the platform's id of the job, when it is not its name
    settled: bool = True  # False while an ended job is still stopping (its processes may live)

    @property
    def live(self) -> bool:
        """Whether the job may still have processes (what clean_up waits for)."""
        return self.phase in ("waiting", "running", "unknown") or not self.settled


@dataclass
class Job:
    env_id: str
    name: str
    members: list[str]
    trial_id: str | None = None
    ref: str = ""
    submitted: bool = False
    done: bool = False
    released: bool = False
    missing: int = 0
    last_words: str = ""
    since: float = field(default_factory=time.monotonic)
    running_since: float | None = None  # when the platform first said the job runs
    hub: str = ""  # the address its agents dial


class RestJobBackend(Backend):
    """Base of the REST-job platforms: one environment = one job (see the module docstring)."""

    hub = "network"
    elastic = True
    stop_job_on_cancel = True
    default_reconnect_window = 300.0
    service: ClassVar[str] = "REST"  # the platform's name in messages
    # polls in a row a submitted job may be absent from the listing before it counts as gone
    missing_polls: ClassVar[int] = 3
    # what the dry run's header says of how the agents' credentials reach the job
    secret_words: ClassVar[str] = "agent tokens and the CA travel as the platform's secrets, masked here"
    # platforms with no secret store a job can mount (DLTS, AML) say this instead
    LITERAL_SECRET_WORDS: ClassVar[str] = (
        "no secret store: each agent's token and the CA are literals in the job's command, which anyone who may "
        "read the job sees; the token is single-use, spent when the agent enrols; shown here as a placeholder")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.experiment_id = "dryrun"
        self.ctx: BackendContext | None = None
        self.jobs: dict[str, Job] = {}  # by env id
        self._poller: asyncio.Task[None] | None = None
        self._opened = False  # the platform answered `open`: there may be jobs to stop
        self._poked = asyncio.Event()  # an agent dialled before its job was seen running

    # ------------------------------------------------------------------ what a platform says
    @abc.abstractmethod
    async def open(self) -> None:
        """Make the client and check the credentials (raise RestError with the fix)."""

    async def close(self) -> None:
        """Close the client."""

    @abc.abstractmethod
    def job_request(self, env: EnvironmentRequest, name: str) -> Any:
        """The request that creates the job of `env` (with its secrets)."""

    @abc.abstractmethod
    def render_request(self, request: Any) -> str:
        """The request for people (dry run, logs): secrets masked."""

    @abc.abstractmethod
    async def submit(self, job: Job, request: Any) -> None:
        """Create the job; set `job.ref` when the platform names jobs itself. Submitting the same
        name again after an unclear failure must not make a second job."""

    @abc.abstractmethod
    async def list_jobs(self) -> dict[str, JobView]:
        """Every job of this experiment the platform knows, by name (one call where the platform
        allows). Raise RestError when the platform does not answer."""

    @abc.abstractmethod
    async def cancel(self, job: Job) -> None:
        """Ask the platform to stop the job (idempotent)."""

    def job_url(self, job: Job) -> str:
        """The job's page in the platform's UI ("" when there is none)."""
        return ""

    async def ended_words(self, job: Job, view: JobView) -> str:
        """Why a job ended on its own; platforms may fetch the job's exit diagnostics here."""
        return view.words

    @property
    def poll_interval(self) -> float:
        """How often one listing looks at every job (`pollInterval`)."""
        return getattr(self.platform_options, "poll_interval", None) or DEFAULT_POLL_INTERVAL

    @property
    def connect_timeout(self) -> float:
        """How long a job may run without its agents dialling in before it is failed and stopped
        (`agentConnectTimeout`)."""
        return getattr(self.platform_options, "connect_timeout", None) or DEFAULT_CONNECT_TIMEOUT

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
                      env.trial_id, submitted=True)
            wanted[job.name] = job
            self.jobs[env.env_id] = job
        try:
            views = await self.list_jobs()
        except RestError as e:
            if wanted:
                log.warning("%s; re-attaching when it answers", e)
                return
            raise
        for name, view in views.items():
            job = wanted.get(name)
            if job is not None:
                job.ref = view.ref
                self._tell_url(job)
            elif view.live:
                log.info("stopping %s job %s: its environment is no longer used", self.service, name)
                await self._cancel_quietly(Job("", name, [], ref=view.ref))
        for name, job in wanted.items():
            if name not in views and job.members:
                job.done = True
                self.ctx.agent_failed(job.members[0], f"{self.service} job {name} is gone "
                                                      "(it ended while the manager was down)")

    async def provision(self, env: EnvironmentRequest) -> None:
        assert self.ctx is not None
        name = self.job_name(env.env_id, env.trial_id)
        job = self.jobs.get(env.env_id)
        if job is not None and job.submitted and not job.done:
            return  # a restarted manager re-provisioning a job that still runs
        job = Job(env.env_id, name, [m.agent_id for m in env.members], env.trial_id,
                  hub=env.members[0].hub_address if env.members else "")
        self.jobs[env.env_id] = job
        request = self.job_request(env, name)
        try:
            await self.submit(job, request)
        except RestError as e:
            job.done = True
            raise RestError(f"{self.service} refused job {name}: {e}", e.status, e.code) from None
        job.submitted = True
        job.since = time.monotonic()
        if job.released:  # released while the platform was answering
            await self._cancel_quietly(job)
            return
        self._tell_url(job)
        self._say(job, f"{self.service} job {name} is submitted")

    async def release(self, env_id: str) -> None:
        job = self.jobs.get(env_id)
        if job is None:
            return
        job.released = True
        if job.submitted and not job.done:
            await self._cancel_quietly(job)

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
        """Stop every job of this experiment and wait, bounded, until the platform says they ended.

        The jobs this manager knows are asked to stop first, whether or not the platform can list
        them now; the listing (by name prefix: an earlier manager's jobs too) is retried with
        backoff; if it never answers, one line says which jobs may still run."""
        deadline = time.monotonic() + self.stop_deadline
        asked: set[str] = set()
        unsure: set[str] = set()  # asked, but the platform did not take the request
        for job in list(self.jobs.values()):
            job.released = True  # a submission still waiting (a rate limit) is abandoned
            if job.submitted and not job.done:
                job.released = True
                asked.add(job.name)
                if not await self._cancel_quietly(job):
                    unsure.add(job.name)
        failures, pause = 0, 1.0
        while True:
            try:
                views = await self.list_jobs()
            except RestError as e:
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
        except RestError as e:
            log.warning("stopping %s job %s: %s", self.service, job.name, e)
            return False
        return True

    # ------------------------------------------------------------------ watching
    def _say(self, job: Job, words: str) -> None:
        assert self.ctx is not None
        if words != job.last_words:
            job.last_words = words
            for m in job.members:
                self.ctx.agent_status(m, words)

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
                await asyncio.wait_for(self._poked.wait(), self.poll_interval)
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
            except RestError as e:
                log.warning("watching the %s jobs: %s", self.service, e)
            except Exception:
                log.exception("watching the %s jobs", self.service)

    async def poll(self) -> None:
        """One look at every job of the experiment."""
        views = await self.list_jobs()
        for job in list(self.jobs.values()):
            if not job.submitted or job.done:
                continue
            view = views.get(job.name)
            if view is None:
                job.missing += 1
                if job.missing >= self.missing_polls and not job.released:
                    await self._ended(job, JobView(job.name, "unknown",
                                                   f"{self.service} job {job.name} is no longer known to {self.service}"))
                continue
            job.missing = 0
            if view.ref and not job.ref:
                job.ref = view.ref
            if view.phase in ("waiting", "running", "unknown"):
                words = view.words
                if view.phase == "waiting":
                    words += f" (for {_since(job.since)})"
                elif view.phase == "running":
                    job.running_since = job.running_since or time.monotonic()
                    assert self.ctx is not None
                    if not all(self.ctx.agent_connected(m) for m in job.members):
                        if time.monotonic() - job.running_since > self.connect_timeout and not job.released:
                            await self._ended(job, JobView(
                                job.name, "failed", f"{self.service} job {job.name} ran for "
                                f"{self.connect_timeout:g} s but its agent never dialled {self._hub(job)}: "
                                f"{self._check_hint(job)}; the job was stopped"))
                            await self._cancel_quietly(job)
                            continue
                        words += (f" (for {_since(job.running_since)}) but its agent has not dialled {self._hub(job)} "
                                  f"yet: if this lasts, {self._check_hint(job)}")
                self._say(job, words)
            else:
                await self._ended(job, view)

    @staticmethod
    def _hub(job: Job) -> str:
        return job.hub or "the manager's hub"

    def _check_hint(self, job: Job) -> str:
        return (f"check that the job's nodes can reach {self._hub(job)} (nniManagerIp, hubPort, firewalls) and that "
                "its image has Python >= 3.8 with nni-agent (the job's log says which)")

    async def _ended(self, job: Job, view: JobView) -> None:
        assert self.ctx is not None
        job.done = True
        if job.released:
            return  # stopped by us: the core knows
        words = await self.ended_words(job, view)
        for m in job.members:  # the core tells an expected end (its one trial is over) from a loss
            self.ctx.agent_failed(m, words, failed=view.phase == "failed")

    # ------------------------------------------------------------------ dry run
    def dry_run_env(self) -> EnvironmentRequest:
        ts = self.config.training_service
        hub = f"{ts.nni_manager_ip or '<nniManagerIp>'}:{ts.hub_port or '<hubPort>'}"
        env_id = "env1" if self.reuse else "trial-dryrun"
        members = tuple(AgentSpec(agent_id=n, token="<agent token>", hub_address=hub, hub_unix_socket=Path("/dev/null"),
                                  ca_certificate=b"<experiment CA certificate>" if ts.hub_tls else b"", role=r, index=i)
                        for n, r, i in self.member_names(env_id))
        return EnvironmentRequest(env_id, members, None if self.reuse else "dryrun")

    def render(self) -> DryRun:
        env = self.dry_run_env()
        name = self.job_name(env.env_id, env.trial_id)
        request = self.job_request(env, name)
        how = "a pool of up to" if self.reuse else "one job per trial, up to"
        text = (f"# {self.platform}: {how} {self.config.trial_concurrency} job(s) like this one "
                f"({self.secret_words})\n" + self.render_request(request))
        return DryRun(self.platform, [request], text)


def _since(start: float) -> str:
    s = int(time.monotonic() - start)
    return f"{s} s" if s < 120 else f"{s // 60} min"


def parse_watch_fields(ts: ConfigSection) -> tuple[float | None, float | None]:
    """The fields every REST-job platform takes: (`pollInterval`, `agentConnectTimeout`) in seconds."""
    return ts.duration("pollInterval"), ts.duration("agentConnectTimeout")
