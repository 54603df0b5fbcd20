"""The REST-job pattern shared by the platforms whose jobs are created, polled and stopped over
HTTP (OpenPAI, DLTS, Azure ML).

A platform file says only what differs: how a job request looks (`job_request`, rendered for
dry runs by `render_request`), how it is submitted and stopped, and how one listing of the
experiment's jobs maps onto `JobView`s (its state table). Everything else lives here or in
`jobs.py` once:

- `RestClient`: an aiohttp session with timeouts; GET, PUT and DELETE (idempotent) are retried
  on connection errors, timeouts, 5xx and 429 with exponential backoff (429's `Retry-After`
  honoured); an error is one line in the platform's words, without credentials or query strings.
- `RestJobBackend`: `jobs.JobBackend` (one environment = one job: names, re-attach, one listing
  per poll for all jobs, the connect timeout, stop-all) whose request is the platform's JSON,
  rendered the same way for dry runs; a refusal is one `RestError` naming the job.
"""
from __future__ import annotations

import abc
import asyncio
import json as _json
import logging
import os
import random
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from nni_manager.jsontypes import JSONValue
from nni_manager.backends import agent_deps
from nni_manager.backends.agent_command import AgentCommand, Sh
from nni_manager.backends.base import BackendError, DryRun, EnvironmentRequest, RequestT
from nni_manager.backends.jobs import (  # noqa: F401  (the platforms' names for the shared job pattern)
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_POLL_INTERVAL, Job, JobBackend, JobOptionsT, JobView, Phase, StateTable, parse_watch_fields,
)

if TYPE_CHECKING:
    import ssl as ssl_

    import aiohttp

log = logging.getLogger(__name__)

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
    # parsed JSON when the reply is JSON, else text; Any: each platform reads its own answers' shapes
    body: Any
    sent_auth: str = field(default="", repr=False)  # the Authorization header it answered


ErrorWords = Callable[[int, object], tuple[str, str]]  # (status, body) -> (code, message) in the platform's words


def _default_error_words(status: int, body: object) -> tuple[str, str]:
    if isinstance(body, dict):
        inner = body.get("error")
        err = inner if isinstance(inner, dict) else body
        return str(err.get("code", "")), str(err.get("message", "")) or str(body)[:300]
    return "", str(body).strip()[:300]


BACKOFF_ENV = "NNI_MANAGER_REST_BACKOFF_S"


def default_backoff() -> float:
    """The first retry's pause: 1 s. For tests only, NNI_MANAGER_REST_BACKOFF_S shortens it where a
    test waits out every retry of a failing platform (docs/testing.md); users have no reason to set it."""
    try:
        return max(0.0, float(os.environ.get(BACKOFF_ENV, "") or 1.0))
    except ValueError:
        return 1.0


class RestClient:
    """One platform's REST endpoint. `auth` gives the headers for each attempt (tokens that expire
    are fetched anew); `service` names the platform in errors."""

    def __init__(self, base_url: str, service: str, *, auth: Callable[[], Awaitable[dict[str, str]]] | None = None,
                 error_words: ErrorWords = _default_error_words, timeout: float = 30.0, attempts: int = 5,
                 backoff: float | None = None, max_backoff: float = 30.0, ssl: ssl_.SSLContext | bool | None = None,
                 fix_for: Callable[[int, str], str] | None = None,
                 reauth: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.service = service
        self._auth = auth
        # drops the refused cached credential (its Authorization header): a 401 is sent once more with a fresh one
        self._reauth = reauth
        self._error_words = error_words
        self._fix_for = fix_for or (lambda status, code: "")
        self.timeout, self.attempts, self.max_backoff = timeout, attempts, max_backoff
        self.backoff = default_backoff() if backoff is None else backoff
        self._ssl = ssl
        self._session: aiohttp.ClientSession | None = None
        self._closed = False  # closed for good: a late request (a submission still waiting) is refused
        self.requests = 0  # sent, retries included (benchmarks and tests read it)

    async def _get_session(self) -> aiohttp.ClientSession:
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

    async def request(self, method: str, path: str, *, json: object = None, data: str | bytes | None = None,
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


    async def _send(self, method: str, url: str, *, json: object, data: str | bytes | None,
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
            body: JSONValue = text
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
               wheel: str = "", deps_dir: str = "",
               sha256: tuple[tuple[str, str], ...] = (),
               message_file: str = "") -> list[str]:
    """Shell lines (POSIX sh, safe under `set -eu`) that start one agent inside a job's container:
    a private 0700 directory, the token (and CA) written there by `token_lines` / `ca_lines` as
    files of mode 0600 (`"$NNI_AGENT_DIR/token"`, `"$NNI_AGENT_DIR/ca.crt"`), then the boot step
    (nni_agent/boot.py, inline: the image may not have the agent): the Python version, the agent
    and its dependencies' versions checked, one line saying what is wrong otherwise (the job's
    log, then the trial's message), then the agent. `agent_id` may be a shell expression in double
    quotes' syntax; `image` names the image in that line. `wheel`: the agent wheel in the
    container, unpacked into the private directory; `deps_dir`: where shipped dependency wheels
    lie in the container, one directory per CPython (`cp311/`, agent_deps.resolve_for_pythons), of
    which the job's Python picks its own. The agent removes the private directory when it exits
    (its TMPDIR may be a scratch disk that outlives the job). Both are shell words (an `Sh`, config values already
    quoted) or literals. `sha256`: (name, digest) of each shipped file (AgentCommand.sha256), which
    the boot step checks before it unpacks anything.
    `message_file`: the boot step also writes its failure line there (a pod's
    /dev/termination-log, where the platform shows it)."""
    q = shlex.quote
    lines = ["umask 077",
             # the job's TMPDIR where it names a usable directory (a scratch disk), else /tmp
             'NNI_AGENT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/nni-agent.XXXXXX" 2>/dev/null '
             '|| mktemp -d "/tmp/nni-agent.XXXXXX")',
             # gone if this shell ends before it execs the boot step (no Python): then the agent removes it
             "trap 'rm -rf \"$NNI_AGENT_DIR\"' EXIT",
             *token_lines]
    if tls:
        lines += ca_lines
    lines += [f"export {k}={q(v)}" for k, v in env.items()]
    command = AgentCommand(agent_id=Sh(f'"{agent_id}"'), manager=hub_address, token_file=Sh('"$NNI_AGENT_DIR/token"'),
                           work_dir=Sh('"$NNI_AGENT_DIR/work"'), orphan_timeout=orphan_timeout,
                           ca_file=Sh('"$NNI_AGENT_DIR/ca.crt"') if tls else "", single_trial=single_trial,
                           where=f"the image {image}",
                           wheel=wheel, unpack_to=Sh('"$NNI_AGENT_DIR/agent"') if wheel else "",
                           parts=(Sh(f'{_word(deps_dir)}/"${{{agent_deps.PYV_VAR}:-none}}"'),) if deps_dir else (),
                           deps_to=Sh('"$NNI_AGENT_DIR/deps"') if deps_dir else "", sha256=sha256,
                           message_file=message_file, remove_at_exit=Sh('"$NNI_AGENT_DIR"'))
    find, start = command.shell_lines()
    lines += [find, *([agent_deps.PICK_PYTHON_DIR] if deps_dir else []), start]
    return lines


def _word(value: str) -> str:
    return value if isinstance(value, Sh) else shlex.quote(value)


def literal_secret_lines(token: str, ca_certificate: bytes) -> tuple[list[str], list[str]]:
    """(token_lines, ca_lines) for agent_boot on platforms with no secret store: the single-use
    enrolment credential and the (public) CA written as literals."""
    q = shlex.quote
    return ([f'printf "%s" {q(token)} > "$NNI_AGENT_DIR/token"'],
            [f'printf "%s\\n" {q(ca_certificate.decode().strip())} > "$NNI_AGENT_DIR/ca.crt"'])


class RestJobBackend(JobBackend[JobOptionsT, RequestT]):
    """Base of the REST-job platforms: one environment = one job (see the module docstring)."""

    stop_job_on_cancel = True
    service: ClassVar[str] = "REST"  # the platform's name in messages
    errors: ClassVar[tuple[type[Exception], ...]] = (RestError,)
    # what the dry run's header says of how the agents' credentials reach the job
    secret_words: ClassVar[str] = "agent tokens and the CA travel as the platform's secrets, masked here"
    # platforms with no secret store a job can mount (DLTS, AML) say this instead
    LITERAL_SECRET_WORDS: ClassVar[str] = (
        "no secret store: each agent's token and the CA are literals in the job's command, which anyone who may "
        "read the job sees; the token is single-use, spent when the agent enrols; shown here as a placeholder")

    def submit_pause(self) -> float:
        return default_backoff()

    @abc.abstractmethod
    def job_request(self, env: EnvironmentRequest, name: str) -> RequestT:
        """The request that creates the job of `env` (with its secrets)."""

    @abc.abstractmethod
    def render_request(self, request: RequestT) -> str:
        """The request for people (dry run, logs): secrets masked."""

    async def prepare(self, job: Job, env: EnvironmentRequest) -> RequestT:
        return self.build_request(env)  # job.name is the env's job_name

    def refused(self, job: Job, error: Exception) -> Exception:
        status, code = (error.status, error.code) if isinstance(error, RestError) else (0, "")
        return RestError(f"{self.service} refused job {job.name}: {error}", status, code)

    # ------------------------------------------------------------------ dry run
    def build_request(self, env: EnvironmentRequest, hub: str | None = None) -> RequestT:
        return self.job_request(env, self.job_name(env.env_id, env.trial_id))

    def render(self) -> DryRun:
        request = self.build_request(self.dry_run_env())
        how = "a pool of up to" if self.reuse else "one job per trial, up to"
        text = (f"# {self.platform}: {how} {self.config.trial_concurrency} job(s) like this one "
                f"({self.secret_words})\n" + self.render_request(request))
        return DryRun(self.platform, [request], text)

