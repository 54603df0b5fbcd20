"""The agent's side of the one bidirectional stream: dial, hello, send, receive, redial.

Link loss never touches trials: the connection simply redials with exponential backoff
and full jitter, and replays every record the manager has not acknowledged. Only a
refusal (wrong token, incompatible protocol) or a manager silent for longer than the
orphan timeout ends the agent.

With TLS (`--ca-file`: the experiment's own CA) the Hello, and with it the token, is written
only on a channel whose hub certificate verified: whoever else answers on the hub's address (a
local user on a freed tunnel port) fails the handshake, gets no token and no obedience, and the
agent keeps redialling (the cause logged once). Over a Unix socket the directory's permissions
authenticate the hub.

Behind a relay (`relay_token`: a cluster's hub relay, a Slurm login node's), every connection
opens with an HTTP CONNECT whose Proxy-Authorization carries the experiment's relay token: the
relay pipes only connections that prove it, so a party without the experiment's secret cannot hold
what real agents need. gRPC writes the CONNECT itself (its `grpc.http_proxy` option, the relay as
the proxy); TLS to the hub then runs inside, end to end as before.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from nni_agent import __version__
from nni_agent import files
from nni_agent.bundles import BundleCache
from nni_agent.compat import wait_for
from nni_agent.keeper import Keeper
from nni_agent.outbox import Outbox
from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb
from nni_agent.wire import varint as _varint

log = logging.getLogger(__name__)

CONNECT_METHOD = "/nni_agent.v1.AgentHub/Connect"
FATAL_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION)
CHANNEL_OPTIONS = [
    ("grpc.enable_http_proxy", 0),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


class Refused(Exception):
    """The manager refused this agent for good (token, version): redialling cannot help."""


class LinkLost(Exception):
    """The stream ended or went silent; redial."""


def frame_records(records: list[bytes]) -> bytes:
    """Serialize AgentMessage{records: RecordBatch{records}} from already-serialized
    Records without re-parsing them (field 2 of AgentMessage, field 1 of RecordBatch)."""
    inner = b"".join(b"\x0a" + _varint(len(r)) + r for r in records)
    return b"\x12" + _varint(len(inner)) + inner


# how long a command's ack waits for a record frame to ride on (managers of protocol >= 1.4): a
# StartTrial's RUNNING status follows within it even on a loaded machine; a later ack only
# means the manager would send the command again after a reconnect (applied once: by trial id)
COMMAND_ACK_DELAY = 0.25


def _serialize(msg: pb.AgentMessage | bytes) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


@dataclass
class Timing:
    heartbeat_s: float = 5.0
    gpu_sample_s: float = 5.0
    resources_s: float = 2.0
    silence_factor: float = 3.0  # manager silent for factor x heartbeat -> the link is dead
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 5.0


class Connection:
    def __init__(
        self,
        *,
        target: str,
        agent_id: str,
        token: str,
        boot_id: str,
        keeper: Keeper,
        outbox: Outbox,
        bundles: BundleCache,
        host: pb.HostInfo,
        gpu_sample: Callable[[], pb.GpuReport],
        orphan_timeout: float = 0.0,
        timing: Timing | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        server_name: str | None = None,
        token_file: Path | None = None,
        relay_token: str | None = None,
    ) -> None:
        self.target = target
        self._dialled = target  # the address of the latest dial (for "@file" targets)
        self.agent_id = agent_id
        self._token = token
        self._token_file = token_file
        self.boot_id = boot_id
        self.keeper = keeper
        self.outbox = outbox
        self.bundles = bundles
        self.host = host
        self.gpu_sample = gpu_sample
        self.orphan_timeout = orphan_timeout
        self.timing = timing or Timing()
        self._credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates) if tls else None
        self._options = CHANNEL_OPTIONS + ([("grpc.ssl_target_name_override", server_name)] if server_name else [])
        self._relay_token = relay_token
        self.connected = asyncio.Event()
        self.sessions = 0  # how many streams were established (tests, logs)
        self._control: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        # trial files for the manager: bounded, so a large file is read only as fast as it is sent
        self._file_chunks: asyncio.Queue[pb.AgentMessage] = asyncio.Queue(maxsize=8)
        self._file_tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._exit_code = 0
        self._last_gpu: pb.GpuReport | None = None
        self._last_contact = time.monotonic()
        self._records_sent_at = 0.0  # monotonic time of the last RecordBatch written: it stands in for a heartbeat
        self._session_channel: grpc.aio.Channel | None = None  # while a session is up: study storage calls share it
        self._session_up = asyncio.Event()  # set while _session_channel is
        # this session's commands: the highest cmd_seq applied, and acknowledged; acks ride on
        # other messages when the manager reads them there (protocol >= 1.4)
        self._cmd_applied = self._cmd_acked = 0
        self._ride_acks = False
        self._cmd_ack_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ public

    async def study_call(self, trial_id: str, method: str, request: bytes) -> bytes:
        """One call of Optuna's storage service for `trial_id`, answered by the manager over this
        agent's channel (nni_agent.study_storage). Without a session (the manager restarting, the
        link lost) the call waits for the next one, as the trial's metrics do: the objective pauses
        rather than fails; StudyUnavailable once the agent stops (its orphan timeout, a stop)."""
        from nni_agent.study_storage import HUB_SERVICE, MD_TRIAL, StudyUnavailable

        while (channel := self._session_channel) is None:
            if self._stopping is not None or self._done.is_set():
                raise StudyUnavailable()
            up = asyncio.ensure_future(self._session_up.wait())
            done = asyncio.ensure_future(self._done.wait())
            try:  # (a stop ends _done within its drain; re-checked each second until then)
                await asyncio.wait([up, done], timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
                done.cancel()
        name = method.rsplit("/", 1)[-1]
        call = channel.unary_unary("/%s/%s" % (HUB_SERVICE, name))
        metadata = (("nni-agent-id", self.agent_id), ("nni-agent-token", self._token), (MD_TRIAL, trial_id))
        return await call(request, metadata=metadata)

    def request_bundle(self, digest: str) -> None:
        self._send_control(pb.AgentMessage(bundle_request=pb.BundleRequest(digest=digest)))

    def stop(self, reason: str, *, exit_code: int | None = None, drain_timeout: float | None = 10.0,
             by_manager: bool = False, cause: int = pb.END_CAUSE_AGENT_STOPPED, offline_too: bool = False) -> None:
        """Stop all trials, wait up to `drain_timeout` s (None: no limit) for the manager to
        store their final records, then end `run()` (returning `exit_code` if given). With no
        manager connected it waits only if `offline_too` (one may come back: a restarted one). Trials end
        USER_CANCELED when the manager asked (it stops the experiment), else SYS_CANCELED: a
        signal (a pod evicted or deleted, a machine going down) or a lost manager is the system's."""
        if self._stopping is None:
            if exit_code is not None:
                self._exit_code = exit_code
            state = pb.TRIAL_STATE_USER_CANCELED if by_manager else pb.TRIAL_STATE_SYS_CANCELED
            cause = pb.END_CAUSE_CANCELLED if by_manager else cause
            self._stopping = asyncio.get_running_loop().create_task(
                self._stop(reason, drain_timeout, state, cause, offline_too))

    async def run(self) -> int:
        """Keep a session open until stopped; return the agent's exit code."""
        attempt = 0
        lost_since = time.monotonic()
        last_problem = ""
        while not self._done.is_set():
            try:
                await self._session()
            except Refused as exc:
                log.error("%s", exc)
                self._exit_code = 2
                self.stop(f"refused by the manager: {exc}")
                break
            except Exception as exc:  # any other failure of a session is a lost link: trials must live on
                if not isinstance(exc, (LinkLost, grpc.aio.AioRpcError, OSError, asyncio.InvalidStateError)):
                    log.exception("session with %s failed unexpectedly; redialling", self._dialled)
                if self.connected.is_set():
                    lost_since, attempt, last_problem = time.monotonic(), 0, ""
                    log.warning("lost the manager at %s: %s; trials keep running, redialling", self._dialled, _brief(exc))
                elif _brief(exc) != last_problem:  # why dialling fails (TLS, refused, ...): once per cause
                    last_problem = _brief(exc)
                    log.warning("cannot reach the manager at %s: %s; redialling", self._dialled, last_problem)
                self.connected.clear()
            if self._done.is_set():
                break
            if self.orphan_timeout and time.monotonic() - lost_since > self.orphan_timeout:
                log.error("no manager for %.0f s (orphan timeout): stopping all trials", self.orphan_timeout)
                self._exit_code = 3
                self.stop(f"manager unreachable for {self.orphan_timeout:.0f} s")
                break
            delay = min(self.timing.backoff_cap_s, self.timing.backoff_base_s * 2**attempt)
            attempt += 1
            await self._sleep_or_done(random.uniform(0, delay))
        if self._stopping is not None:
            await self._stopping
        return self._exit_code

    # ------------------------------------------------------------------ one session

    def _resolve_target(self) -> str:
        """`self.target`, or for "@<path>" the address in that file (re-read at every dial)."""
        if not self.target.startswith("@"):
            return self.target
        path = self.target[1:]
        try:
            with open(path) as f:
                target = f.read().strip()
        except OSError as exc:
            raise LinkLost(f"cannot read the manager address from {path}: {exc.strerror}") from None
        if not target:
            raise LinkLost(f"{path} holds no manager address")
        return target

    def _channel(self, target: str) -> grpc.aio.Channel:
        options = self._options
        if self._relay_token is not None and not target.startswith("unix:"):
            options = [o for o in options if o[0] != "grpc.enable_http_proxy"] + [
                ("grpc.enable_http_proxy", 1), ("grpc.http_proxy", f"http://nni:{self._relay_token}@{target}")]
        with _relay_not_bypassed(self._relay_token is not None):
            if self._credentials is not None:
                return grpc.aio.secure_channel(target, self._credentials, options=options)
            return grpc.aio.insecure_channel(target, options=options)

    async def _session(self) -> None:
        target = self._dialled = self._resolve_target()
        channel = self._channel(target)
        async with channel:
            call = channel.stream_stream(
                CONNECT_METHOD, request_serializer=_serialize, response_deserializer=pb.ManagerMessage.FromString
            )()
            gpus = self.gpu_sample()
            await call.write(
                pb.AgentMessage(
                    hello=pb.Hello(
                        agent_id=self.agent_id,
                        token=self._token,
                        agent_version=__version__,
                        protocol_major=PROTOCOL_MAJOR,
                        protocol_minor=PROTOCOL_MINOR,
                        boot_id=self.boot_id,
                        host=self.host,
                        trials=self.keeper.snapshot(),
                        gpus=gpus,
                    )
                )
            )
            first = await self._read(call)
            if first.WhichOneof("body") != "welcome":
                raise LinkLost(f"manager answered Hello with {first.WhichOneof('body')}, not Welcome")
            welcome = first.welcome
            self._apply_welcome(welcome)
            self._cmd_applied = self._cmd_acked = 0
            self._ride_acks = welcome.protocol_minor >= 4
            self.outbox.ack(welcome.acked_seq)
            for digest in self.bundles.pending():
                self.request_bundle(digest)
            self.sessions += 1
            self._session_channel = channel
            self._session_up.set()
            self.connected.set()
            log.info("connected to %s (experiment %s), replaying from seq %d", target, welcome.experiment_id, welcome.acked_seq + 1)
            self._last_contact = time.monotonic()
            tasks = [
                asyncio.create_task(self._send_loop(call, welcome.acked_seq)),
                asyncio.create_task(self._receive_loop(call)),
                asyncio.create_task(self._telemetry_loop()),
                asyncio.create_task(self._done.wait()),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raise the reason the session ended
            finally:
                self._session_channel = None
                self._session_up.clear()
                if self._cmd_ack_timer is not None:
                    self._cmd_ack_timer.cancel()
                    self._cmd_ack_timer = None
                for task in [*tasks, *self._file_tasks]:  # the manager failed this session's file requests
                    task.cancel()
                await asyncio.gather(*tasks, *self._file_tasks, return_exceptions=True)
                while not self._file_chunks.empty():
                    self._file_chunks.get_nowait()
                call.cancel()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> pb.ManagerMessage:
        try:
            msg = await call.read()
        except grpc.aio.AioRpcError as exc:
            if exc.code() in FATAL_CODES:
                raise Refused(f"manager at {self._dialled} refused agent {self.agent_id}: {exc.details()}") from None
            raise
        if msg is grpc.aio.EOF:
            raise LinkLost("the manager closed the stream")
        self._last_contact = time.monotonic()
        return msg

    def _apply_welcome(self, welcome: pb.Welcome) -> None:
        # an older manager would file a trial.log chunk as stdout
        self.keeper.stream_trial_log = welcome.protocol_minor >= 2
        if welcome.session_token:  # our enrolment credential is spent: this token is for every later dial
            self._token = welcome.session_token
            if self._token_file is not None:  # a restarted agent process needs it too
                _replace_secret(self._token_file, welcome.session_token)
        if welcome.heartbeat_interval_ms:
            self.timing.heartbeat_s = welcome.heartbeat_interval_ms / 1000
        if welcome.gpu_sample_interval_ms:
            self.timing.gpu_sample_s = welcome.gpu_sample_interval_ms / 1000

    async def _send_loop(self, call: grpc.aio.StreamStreamCall, cursor: int) -> None:
        while True:
            while not self._control.empty():
                await call.write(self._with_command_ack(self._control.get_nowait()))
            while not self._file_chunks.empty():
                await call.write(self._with_command_ack(self._file_chunks.get_nowait()))
            cursor = max(cursor, self.outbox.acked_seq)
            if self.outbox.last_seq > cursor:
                first, records = self.outbox.read(cursor)
                if records:
                    await call.write(self._with_command_ack(frame_records(records)))
                    cursor = first + len(records) - 1
                    self._records_sent_at = time.monotonic()
                continue
            self._wake.clear()
            waiter = asyncio.ensure_future(self.outbox.wait_beyond(cursor))
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({waiter, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                woken.cancel()

    async def _receive_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await self._read(call)
            if msg.acked:
                self.outbox.ack(msg.acked)
            kind = msg.WhichOneof("body")
            if kind == "ack":
                self.outbox.ack(msg.ack.seq)
            elif kind == "command":
                cmd = msg.command
                if cmd.WhichOneof("body") == "shutdown":
                    self.stop(cmd.shutdown.reason or "the manager asked the agent to shut down", by_manager=True)
                else:
                    self.keeper.handle(cmd)
                if cmd.cmd_seq > self._cmd_applied:
                    self._cmd_applied = cmd.cmd_seq
                    if not self._ride_acks:
                        self._ack_commands()
                    elif self._cmd_ack_timer is None:
                        self._cmd_ack_timer = asyncio.get_running_loop().call_later(
                            COMMAND_ACK_DELAY, self._ack_commands)
            elif kind == "bundle_chunk":
                self.bundles.on_chunk(msg.bundle_chunk)
            elif kind == "file_request":
                self._serve_files(msg.file_request)

    def _serve_files(self, request: pb.FileRequest) -> None:
        """Answer in the background: records and heartbeats keep flowing meanwhile."""
        try:
            root, refusal = files.trial_directory(self.keeper, request.experiment_id, request.trial_id), None
        except files.FileRefused as exc:
            root, refusal = None, exc
        task = asyncio.create_task(files.serve(request, root, self._send_file_chunk, refusal))
        self._file_tasks.add(task)
        task.add_done_callback(self._file_tasks.discard)

    async def _send_file_chunk(self, msg: pb.AgentMessage) -> None:
        await self._file_chunks.put(msg)
        self._wake.set()

    async def _telemetry_loop(self) -> None:
        t = self.timing
        next_hb = next_gpu = next_res = time.monotonic()
        while True:
            now = time.monotonic()
            silent = now - self._last_contact
            if silent > t.silence_factor * t.heartbeat_s:
                raise LinkLost(f"no word from the manager for {silent:.1f} s")
            if now >= next_hb:
                if now - self._records_sent_at >= t.heartbeat_s:  # records (and their acks) say as much
                    self._send_control(pb.AgentMessage(heartbeat=pb.Heartbeat(time_ms=int(time.time() * 1000))))
                    next_hb = now + t.heartbeat_s
                else:
                    next_hb = self._records_sent_at + t.heartbeat_s
            if now >= next_gpu:
                report = self.gpu_sample()
                last = self._last_gpu
                if last is None or report.gpus != last.gpus or report.unavailable_reason != last.unavailable_reason:
                    self._send_control(pb.AgentMessage(gpus=report))  # only what changed (time_ms always does)
                    self._last_gpu = report
                next_gpu = now + t.gpu_sample_s
            if now >= next_res:
                if self.keeper.running:
                    self._send_control(pb.AgentMessage(resources=self.keeper.resources()))
                next_res = now + t.resources_s
            await asyncio.sleep(max(0.0, min(next_hb, next_gpu, next_res) - time.monotonic()))

    def _ack_commands(self) -> None:
        """A bare CommandAck, unless one rode on another message meanwhile."""
        self._cmd_ack_timer = None
        if self._cmd_applied > self._cmd_acked:
            self._cmd_acked = self._cmd_applied
            self._send_control(pb.AgentMessage(command_ack=pb.CommandAck(cmd_seq=self._cmd_acked)))

    def _with_command_ack(self, msg: pb.AgentMessage | bytes) -> pb.AgentMessage | bytes:
        """`msg` carrying the command ack still owed (field 9, `command_acked`, appended to a
        serialized frame), if the manager reads it there."""
        if not self._ride_acks or self._cmd_applied <= self._cmd_acked:
            return msg
        self._cmd_acked = self._cmd_applied
        if isinstance(msg, bytes):
            return msg + b"\x48" + _varint(self._cmd_acked)
        msg.command_acked = self._cmd_acked
        return msg

    def _send_control(self, msg: pb.AgentMessage) -> None:
        self._control.put_nowait(msg)
        self._wake.set()

    # ------------------------------------------------------------------ stopping

    async def _stop(self, reason: str, drain_timeout: float | None, state: int, cause: int,
                    offline_too: bool = False) -> None:
        await self.keeper.shutdown(reason, state, cause)
        if self.connected.is_set() or drain_timeout is None or offline_too:  # let the final records reach the manager
            try:
                await wait_for(self.outbox.wait_drained(), timeout=drain_timeout)
            except asyncio.TimeoutError:
                log.warning("stopping with %d records unacknowledged", self.outbox.last_seq - self.outbox.acked_seq)
        self._done.set()

    async def _sleep_or_done(self, seconds: float) -> None:
        try:
            await wait_for(self._done.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass


@contextlib.contextmanager
def _relay_not_bypassed(active: bool) -> Iterator[None]:
    """gRPC skips its proxy (here: the relay's CONNECT) for a target `no_grpc_proxy`/`no_proxy`
    names (a cluster's `NO_PROXY=10.0.0.0/8,.svc` does), and reads them when the channel is made:
    for that moment only, `no_grpc_proxy` (which wins over `no_proxy`) names nothing. Trials, which
    inherit this process's environment, never see the change (no await runs in between)."""
    if not active:
        yield
        return
    saved = os.environ.get("no_grpc_proxy")
    os.environ["no_grpc_proxy"] = "nni-agent.invalid"  # not dialed
    try:
        yield
    finally:
        if saved is None:
            del os.environ["no_grpc_proxy"]
        else:
            os.environ["no_grpc_proxy"] = saved


def _brief(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


def _replace_secret(path: Path, value: str) -> None:
    """Write `value` to `path` (mode 0600) atomically; a failure is logged, not fatal (the
    session token stays in memory)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot store the session token in %s: %s", path, e.strerror)
