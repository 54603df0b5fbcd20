"""The gRPC hub every agent dials: one bidirectional stream per agent.

The hub owns the transport half of the protocol: token check, protocol-version check,
record dedup by (boot_id, seq) and cumulative acks, the per-agent command queue that is
re-sent after a reconnect until acknowledged, trial log chunks written at their offsets,
bundle serving, and the reconnect window. What records *mean* is the handler's business
(the TrainingService).
"""
from __future__ import annotations

import asyncio
import errno
import hashlib
import hmac
import logging
import re
import secrets
import socket
import sqlite3
import time
from collections.abc import Callable
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from nni_agent.v1 import PROTOCOL_MAJOR, PROTOCOL_MINOR
from nni_agent.v1 import agent_pb2 as pb
from nni_agent.v1 import agent_pb2_grpc as pb_grpc
from nni_manager import bundle, notices
from nni_manager.errors import AgentUnavailableError
from nni_manager.hub.address import advertised
from nni_manager.hub.files import FILES_MINOR, FileFetches, too_old
from nni_manager.hub.logfiles import LogFiles, LogWrite
from nni_manager.hub.study import StudyHandlers, StudyService
from nni_manager.hub.tls import TlsMaterial
from nni_manager.store import Store
from nni_manager.version import __version__

log = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,255}")  # one file name
_MAX_UNIX_PATH = 107
# The store or a log file cannot be written (a full disk, a lost mount): nothing is acknowledged.
STORAGE_ERRORS = (sqlite3.Error, OSError)
_FLEET_RATE = 250.0  # heartbeats (and GPU reports) per second from all agents together, at most
_STORAGE_PAUSE = 2.0  # before ending a stream whose records cannot be stored: no tight replay loop
# how long a record batch's Ack waits for a command to ride on (agents of protocol >= 1.4): the
# next trial's StartTrial usually goes out within it, and a later Ack only widens the replay
_ACK_DELAY = 0.05
_MAX_MESSAGE = 64 * 1024 * 1024  # gRPC's limit for any one message (a record batch is about 1 MiB)


class HubHandler(Protocol):
    """What the hub reports to the manager core (all calls on the asyncio thread)."""

    def agent_hello(self, agent_id: str, hello: pb.Hello, restarted: bool) -> None:
        """A stream opened; `restarted`: the agent process is not the one seen before."""
        ...

    def apply_records(self, agent_id: str, boot_id: str, last_seq: int, records: list[pb.Record]) -> None:
        """Apply fresh records and store (boot_id, last_seq) in the same transaction."""
        ...

    def telemetry(self, agent_id: str, report: pb.GpuReport | pb.ResourceReport) -> None: ...

    def agent_lost(self, agent_id: str, since: float) -> None: ...

    def agent_back(self, agent_id: str) -> None: ...

    def agent_expired(self, agent_id: str) -> None: ...

    def enrolment_open(self, agent_id: str) -> bool | None:
        """Whether the platform says this agent's job runs (None: it cannot tell). A single-use
        credential is accepted only then, so one copied from a queued job's definition is useless."""
        ...

    def agent_revoked(self, agent_id: str, reason: str) -> None:
        """The hub revoked this agent's session (its enrolment credential was used twice)."""
        ...

    def log_file(self, agent_id: str, trial_id: str, stream: int) -> Path | None:
        """Where this agent's log chunks of the trial go (None: drop them)."""
        ...


def safe_id(name: str) -> bool:
    """Whether a trial id from an agent is one path segment: no separators, no newline (`$`
    would allow one), not `.` or `..`."""
    return _SAFE_ID.fullmatch(name) is not None and name.strip(".") != ""


def credential_digest(token: str) -> str:
    """What the hub keeps of a spent enrolment credential: enough to recognise it, not to use it."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class _Link:
    """Everything the hub keeps about one agent across its streams."""

    agent_id: str
    token: str
    boot_id: str = ""
    applied_seq: int = 0
    next_cmd_seq: int = 1
    pending: dict[int, pb.Command] = field(default_factory=dict)  # unacknowledged, by cmd_seq
    session: _Session | None = None
    lost_since: float | None = None  # wall-clock time contact was lost
    expired: bool = False
    enrol: bool = False  # `token` is a single-use enrolment credential, not used yet
    spent: str = ""  # digest of the enrolment credential this agent used (a second use is refused)
    protocol_minor: int = 0  # of the agent's latest Hello: which optional requests it understands
    agent_version: str = ""


@dataclass
class _Session:
    agent_id: str
    context: grpc.aio.ServicerContext
    queue: asyncio.Queue[pb.ManagerMessage | None] = field(default_factory=asyncio.Queue)  # None: an Ack is due
    replaced: asyncio.Event = field(default_factory=asyncio.Event)  # ended by the hub, see `why`
    why: str = ""
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_seen: float = field(default_factory=time.monotonic)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # bundle transfers
    ride_acks: bool = False  # the agent reads ManagerMessage.acked (protocol >= 1.4)
    acked: int = 0  # the highest record seq this stream told the agent is stored
    owed: int = 0  # the highest record seq stored, to be told (ack_soon)
    ack_timer: asyncio.TimerHandle | None = None

    async def write(self, msg: pb.ManagerMessage) -> None:
        """Write `msg`, carrying the Ack still owed when the agent reads it there (a bare Ack
        then needs no write of its own)."""
        async with self.write_lock:
            if msg.HasField("ack"):
                self.acked = max(self.acked, msg.ack.seq)
            elif self.ride_acks and self.owed > self.acked:
                msg.acked = self.acked = self.owed
            if self.ack_timer is not None and self.acked >= self.owed:  # nothing owed any more
                self.ack_timer.cancel()
                self.ack_timer = None
            await self.context.write(msg)

    def ack_soon(self, applied_seq: int, now: bool = False) -> None:
        """Acknowledge records up to `applied_seq`: at once for an older agent or when `now`, else
        on the next message out or, if none goes within _ACK_DELAY, as a bare Ack."""
        self.owed = max(self.owed, applied_seq)
        if now or not self.ride_acks:
            self.queue.put_nowait(pb.ManagerMessage(ack=pb.Ack(seq=applied_seq)))
        elif self.ack_timer is None and self.owed > self.acked:
            self.ack_timer = asyncio.get_running_loop().call_later(_ACK_DELAY, self._ack_due)

    def _ack_due(self) -> None:
        self.ack_timer = None
        self.queue.put_nowait(None)


def version_mismatch(agent_major: int, agent_minor: int) -> str:
    """Why an agent with another protocol major is refused, and which side to upgrade."""
    ours = f"{PROTOCOL_MAJOR}.x"
    head = f"agent speaks protocol {agent_major}.{agent_minor}, this manager speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"
    series = __version__.split(".")[0] + ".x"
    if agent_major > PROTOCOL_MAJOR:
        return (
            f"{head}: upgrade nni-manager to a version that speaks {agent_major}.x, "
            f"or install nni-agent {series} on the worker (it speaks {ours})"
        )
    return f"{head}: upgrade nni-agent on the worker to {__version__} (it speaks {ours})"


def _peer_host(peer: str) -> str:
    """The address part of a gRPC peer ("ipv4:127.0.0.1:5000" -> "127.0.0.1"; "unix:..." -> "unix")."""
    kind, _, rest = peer.partition(":")
    return rest.rpartition(":")[0] if kind in ("ipv4", "ipv6") else kind


def _budget_key(peer: str) -> str:
    """Whose pre-authentication budget a stream spends: its address, or on loopback (where every
    tunnelled or relayed agent comes from) its own connection ("ipv4:127.0.0.1:5000" whole)."""
    host = _peer_host(peer)
    return peer if host.startswith("127.") or host in ("[::1]", "::1") else host


def _held(host: str, port: str) -> bool:
    """Whether another socket holds host:port (worth waiting for: an ephemeral use ends), as
    opposed to free or an address not on this machine."""
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:
        return e.errno == errno.EADDRINUSE
    except ValueError:
        return False
    return False


def _raw(data: bytes) -> bytes:
    """Messages reach Connect unparsed, so a Hello's size is checked before it is parsed."""
    return data


class Hub(pb_grpc.AgentHubServicer):
    # Bounds for streams that have not proven a token yet (a stranger's): their first message
    # must come within `hello_timeout` s and hold at most `max_hello_bytes`; one peer may hold at
    # most `max_unauthenticated_per_peer` such streams at once, and all peers together
    # `max_unauthenticated`, beyond which the peer holding the most gives up its oldest for the
    # newcomer. A peer is an address, but on loopback it is one connection: agents behind a tunnel
    # or relay all arrive from 127.0.0.1, and anyone who reaches the relay must not spend their
    # budget. A real agent says Hello as it opens its one stream: a flood's peers hold more.
    hello_timeout = 10.0
    max_hello_bytes = 4 * 1024 * 1024
    max_unauthenticated_per_peer = 64
    max_unauthenticated = 256

    def __init__(
        self,
        *,
        experiment_id: str,
        experiment_dir: Path,
        store: Store,
        handler: HubHandler | None = None,
        reconnect_window: float = 60.0,
        heartbeat_interval: float = 2.0,
        gpu_sample_interval: float = 1.0,
        tcp: str | None = "127.0.0.1:0",
        tls: TlsMaterial | None = None,
        advertise: str | None = None,
    ) -> None:
        self.experiment_id = experiment_id
        # Besides the Unix socket (always there): a TCP "host:port" to listen on (port 0: any
        # free one), for tunnels (127.0.0.1) or for agents on a network (then with `tls`).
        self.tcp = tcp
        self.tls = tls
        # What agents are told to dial when it differs from where the hub listens: a host (the
        # bound port is added) or host:port (a relay's or a NAT's own port).
        self.advertise = advertise
        self.experiment_dir = experiment_dir
        self.socket_path = experiment_dir / "hub.sock"
        self.reconnect_window = reconnect_window
        self.heartbeat_interval = heartbeat_interval
        self.gpu_sample_interval = gpu_sample_interval
        self._told_heartbeat = heartbeat_interval  # the longest interval any Welcome gave
        self.address = ""  # "<host>:<port>" once started, when listening on TCP
        self._store = store
        self.handler = handler  # set before start() when it is built after the hub
        self._links: dict[str, _Link] = {}
        self._server: grpc.aio.Server | None = None
        self.rebind_wait = 60.0  # how long a taken fixed or remembered port is waited for
        self._monitor: asyncio.Task[None] | None = None
        self.storage_error = ""  # set while the store cannot be written; "" once it can again
        self.study: StudyService | None = None  # an Optuna study's storage, offered to the trials (hub/study.py)
        self.files = FileFetches()
        self.log_files = LogFiles()
        # streams still to prove a token, by peer, oldest first: each one's future, set to drop it
        self._waiting_hello: dict[str, dict[object, asyncio.Future[None]]] = {}
        self._waiting_count = 0

    @property
    def public_address(self) -> str:
        """The "host:port" agents dial: `advertise` (with the bound port when it names none),
        else the bound address."""
        if not self.advertise or not self.address:
            return self.address
        return advertised(self.advertise, self.address.rpartition(":")[2])

    def _handler(self) -> HubHandler:
        assert self.handler is not None, "Hub.handler must be set before start()"
        return self.handler

    # ------------------------------------------------------------------ lifecycle
    def register(self, agent_id: str, token: str, *, boot_id: str = "", applied_seq: int = 0, next_cmd_seq: int = 1,
                 enrol: bool = False, spent: str = "") -> None:
        """Allow `agent_id` to connect. It counts as out of contact until it does. With `enrol`,
        `token` is accepted once: that Hello gets a fresh session token for every later dial."""
        self._links[agent_id] = _Link(
            agent_id, token, boot_id, applied_seq, next_cmd_seq, lost_since=time.time(), enrol=enrol, spent=spent
        )

    async def start(self) -> None:
        if len(str(self.socket_path)) > _MAX_UNIX_PATH:
            raise OSError(
                f"hub socket path {self.socket_path} is longer than {_MAX_UNIX_PATH} bytes, the Unix limit: "
                "use a shorter experimentWorkingDirectory"
            )
        self.socket_path.unlink(missing_ok=True)  # a stale one from a killed manager
        # A fixed or remembered port may be held for a while by another socket that the kernel gave
        # it to as an ephemeral one (a client's outgoing connection): running agents dial only this
        # port, so wait for it rather than give up on them.
        host, _, wanted = (self.tcp or ":0").rpartition(":")
        deadline = time.monotonic() + self.rebind_wait
        if wanted not in ("", "0") and await asyncio.to_thread(_held, host, wanted):  # getaddrinfo may block
            notices.say_once(f"hub-port:{self.tcp}", f"hub port {wanted} is taken; waiting up to "
                             f"{self.rebind_wait:.0f} s for it (the running agents dial it)")
            while await asyncio.to_thread(_held, host, wanted) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
        if (server := self._listen()) is None:
            raise OSError(f"the hub cannot listen on {self.tcp}: the port is taken or the address is not "
                          "on this machine (free the port, or set trainingService.hubPort / nniManagerIp)")
        self._server = server
        await server.start()
        self._monitor = asyncio.create_task(self._watch_contact())

    def _listen(self) -> grpc.aio.Server | None:
        """A server on `tcp` and the Unix socket, not started; None when the TCP port is taken."""
        options = [
            ("grpc.enable_http_proxy", 0),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("nni_agent.v1.AgentHub", {
            "Connect": grpc.stream_stream_rpc_method_handler(
                self.Connect, request_deserializer=_raw, response_serializer=pb.ManagerMessage.SerializeToString),
        }), StudyHandlers(self._study_token, lambda: self.study)))
        if self.tcp:
            host = self.tcp.rpartition(":")[0]
            try:
                if self.tls is not None:
                    credentials = grpc.ssl_server_credentials([(self.tls.private_key, self.tls.certificate)])
                    port = server.add_secure_port(self.tcp, credentials)
                else:
                    port = server.add_insecure_port(self.tcp)
            except RuntimeError:  # grpc's "Failed to bind" (older releases answer 0 instead)
                port = 0
            if port == 0:
                return None
            self.address = f"{host}:{port}"
        server.add_insecure_port(f"unix:{self.socket_path}")
        return server

    async def stop(self, grace: float = 1.0) -> None:
        if self._monitor:
            self._monitor.cancel()
        if self._server:
            await self._server.stop(grace)
        self.log_files.close()
        self.socket_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ to agents
    def _study_token(self, agent_id: str) -> str:
        """The token a study storage call must present: the agent's session token, never an
        unspent enrolment credential (only a Hello may spend it)."""
        link = self._links.get(agent_id)
        return "" if link is None or link.enrol else link.token

    def send(self, agent_id: str, command: pb.Command) -> int:
        """Queue `command` (its cmd_seq is assigned here); re-sent until acknowledged."""
        link = self._links[agent_id]
        command.cmd_seq = link.next_cmd_seq
        link.next_cmd_seq += 1
        self._store.set_next_cmd_seq(agent_id, link.next_cmd_seq)
        link.pending[command.cmd_seq] = command
        if link.session:
            link.session.queue.put_nowait(pb.ManagerMessage(command=command))
        return command.cmd_seq

    def pending_commands(self, agent_id: str) -> list[pb.Command]:
        return list(self._links[agent_id].pending.values())

    def connected(self, agent_id: str) -> bool:
        link = self._links.get(agent_id)
        return bool(link and link.session and link.lost_since is None)

    def fetch_files(self, agent_id: str, request: pb.FileRequest,
                    idle_timeout: float = 30.0) -> AsyncIterator[pb.FileChunk]:
        """The agent's FileChunks answering `request` (an async iterator). AgentUnavailableError
        at once if the agent is not connected or too old to know FileRequest, and as soon as its
        session ends or it stays silent for `idle_timeout` mid-answer."""
        link = self._links.get(agent_id)
        if link is None or link.session is None or link.lost_since is not None:
            raise AgentUnavailableError(f"agent {agent_id} is not connected (its trial's files are out of reach "
                                        "until it reconnects)")
        if link.protocol_minor < FILES_MINOR:
            raise AgentUnavailableError(too_old(agent_id, link.agent_version, link.protocol_minor))
        session = link.session
        return self.files.fetch(agent_id, session, session.queue.put_nowait, request, idle_timeout)

    # ------------------------------------------------------------------ the stream
    # ------------------------------------------------------------------ storage trouble
    def _stored(self, what: str, call: Callable[[], object], *, proof: bool = False) -> bool:
        """Run a handler call that writes the store; on a storage failure say so once (not per
        record or redial) and return False: the caller then acknowledges nothing. Only a call that
        always writes (`proof`: storing records) shows that storing works again."""
        try:
            call()
        except STORAGE_ERRORS as e:
            self._storage_failed(what, e)
            return False
        if self.storage_error and proof:
            log.warning("storing in %s works again", self.experiment_dir)
            self.storage_error = ""
        return True

    def _storage_failed(self, what: str, e: Exception) -> None:
        if not self.storage_error:
            log.error("cannot store %s in %s: %s. Nothing more is acknowledged until it can be: agents keep "
                      "their records and send them again (free space there; the experiment waits)",
                      what, self.experiment_dir, e)
        self.storage_error = str(e)

    async def Connect(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        peer = _budget_key(context.peer())
        mine = self._waiting_hello.get(peer)
        if mine is not None and len(mine) >= self.max_unauthenticated_per_peer:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "too many streams from this address have not said Hello yet; try again later")
        if self._waiting_count >= self.max_unauthenticated:  # the biggest holder's oldest gives way
            biggest = max(self._waiting_hello.values(), key=len)
            biggest.pop(next(iter(biggest))).set_result(None)
            self._waiting_count -= 1
        me, dropped = object(), asyncio.get_running_loop().create_future()
        mine = self._waiting_hello.setdefault(peer, {})
        mine[me] = dropped
        self._waiting_count += 1
        try:
            link, hello, session_token = await self._authenticate(context, dropped)
        finally:
            if mine.pop(me, None) is not None:
                self._waiting_count -= 1
            if not mine and self._waiting_hello.get(peer) is mine:
                del self._waiting_hello[peer]
        await self._serve(link, hello, session_token, context)

    async def _authenticate(self, context: grpc.aio.ServicerContext,
                            dropped: asyncio.Future[None]) -> tuple[_Link, pb.Hello, str]:
        """Read the Hello (bounded in time and size, before any parsing; given up when `dropped`
        is set), check the token, then the protocol version, and only then spend a single-use
        enrolment credential: an agent too old to talk keeps its credential for the upgraded one."""
        read = asyncio.ensure_future(context.read())
        await asyncio.wait((read, dropped), timeout=self.hello_timeout, return_when=asyncio.FIRST_COMPLETED)
        if not read.done():
            read.cancel()
            if dropped.done():
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    "dropped: too many streams to this hub have not said Hello yet; try again")
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no Hello within {self.hello_timeout:g} s of opening the stream")
        first = read.result()
        if first is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
        assert isinstance(first, bytes)
        if len(first) > self.max_hello_bytes:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"a Hello of {len(first)} bytes: at most {self.max_hello_bytes} are accepted")
        try:
            message = pb.AgentMessage.FromString(first)
        except DecodeError:  # garbage from anyone: refused in words, no traceback per bad peer
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed message: not an nni_agent.v1.AgentMessage")
        if not message.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
        hello = message.hello
        link = self._links.get(hello.agent_id)
        if link is not None and link.spent and hmac.compare_digest(link.spent, credential_digest(hello.token)):
            self._revoke(link)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"agent {hello.agent_id}: enrolment credential already used; the session it opened "
                                "is revoked")
        if link is None or not hmac.compare_digest(link.token.encode(), hello.token.encode()):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"agent {hello.agent_id}: invalid token")
        assert link is not None
        if hello.protocol_major != PROTOCOL_MAJOR:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, version_mismatch(hello.protocol_major, hello.protocol_minor)
            )
        session_token = ""
        if link.enrol and self._handler().enrolment_open(link.agent_id) is False:
            await context.abort(grpc.StatusCode.UNAVAILABLE,  # the agent redials: by then the job may run
                                f"agent {link.agent_id}: the platform does not report its job running yet; "
                                "enrolment opens when it does")
        if link.enrol:  # spend the credential; from now on only the session token works
            session_token = secrets.token_urlsafe(32)
            link.spent, link.token, link.enrol = credential_digest(link.token), session_token, False
            self._store.set_agent_token(link.agent_id, session_token, link.spent)
            log.info("agent %s enrolled (its enrolment credential is spent)", link.agent_id)
        return link, hello, session_token

    def _revoke(self, link: _Link) -> None:
        """A spent enrolment credential came back: two parties hold it (the job's definition was
        read), and whoever enrolled first may not be the job's agent. Neither keeps a session: the
        token becomes one nobody has, the stream ends, and the core fails the environment."""
        reason = (f"agent {link.agent_id}: its single-use enrolment credential was presented a second time (someone "
                  "has a copy of the job's definition): its session is revoked and its environment failed")
        log.error("%s", reason)
        link.token = secrets.token_urlsafe(32)  # never given out: no one can dial as this agent again
        link.enrol = False
        self._stored(f"the revocation of agent {link.agent_id}",
                     lambda: self._store.set_agent_token(link.agent_id, link.token, link.spent))
        if link.session is not None:
            link.session.why = "session revoked: the enrolment credential was presented twice"
            link.session.replaced.set()
        self._handler().agent_revoked(link.agent_id, reason)

    async def _serve(self, link: _Link, hello: pb.Hello, session_token: str,
                     context: grpc.aio.ServicerContext) -> None:
        """An authenticated stream, until it ends or a newer one replaces it."""
        restarted = bool(link.boot_id) and hello.boot_id != link.boot_id
        if hello.boot_id != link.boot_id:
            link.boot_id, link.applied_seq = hello.boot_id, 0
            self._store.set_agent_progress(link.agent_id, link.boot_id, 0)
        session = _Session(link.agent_id, context, ride_acks=hello.protocol_minor >= 4,
                           acked=link.applied_seq, owed=link.applied_seq)
        old, link.session = link.session, session
        if old:
            old.why = "replaced by a newer connection"
            old.replaced.set()
        link.lost_since, link.expired = None, False
        link.protocol_minor, link.agent_version = hello.protocol_minor, hello.agent_version
        for command in link.pending.values():  # unacknowledged: sent again, after the Welcome
            session.queue.put_nowait(pb.ManagerMessage(command=command))
        if not self._stored(f"the hello of agent {link.agent_id}", lambda: self._handler().agent_hello(
                link.agent_id, hello, restarted)):
            link.session = None
            self._lost(link, time.time())
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the manager cannot store anything now; try again later")
        heartbeat = self._fleet_interval(self.heartbeat_interval)
        self._told_heartbeat = max(self._told_heartbeat, heartbeat)  # silence is judged by the longest
        await session.write(
            pb.ManagerMessage(
                welcome=pb.Welcome(
                    manager_version=__version__,
                    protocol_major=PROTOCOL_MAJOR,
                    protocol_minor=PROTOCOL_MINOR,
                    acked_seq=link.applied_seq,
                    experiment_id=self.experiment_id,
                    heartbeat_interval_ms=int(heartbeat * 1000),
                    gpu_sample_interval_ms=int(self._fleet_interval(self.gpu_sample_interval) * 1000),
                    session_token=session_token,
                )
            )
        )
        reader = asyncio.create_task(self._read(link, session))
        writer = asyncio.create_task(self._write(session))
        replaced = asyncio.create_task(session.replaced.wait())
        try:
            await asyncio.wait({reader, writer, replaced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, writer, replaced, *session.tasks):
                task.cancel()
            if session.ack_timer is not None:
                session.ack_timer.cancel()
            self.files.session_ended(session, f"its stream ended ({session.why or 'connection lost'})")
            if link.session is session:
                link.session = None
                self._lost(link, time.time())
        if reader.done() and not reader.cancelled() and reader.exception():
            log.warning("agent %s: stream ended: %s", link.agent_id, reader.exception())
        if session.replaced.is_set():
            await context.abort(grpc.StatusCode.ABORTED, f"agent {link.agent_id}: {session.why}")

    @staticmethod
    async def _write(session: _Session) -> None:
        while True:
            msg = await session.queue.get()
            if msg is None:  # an Ack came due: written bare unless one rode on a message meanwhile
                if session.owed <= session.acked:
                    continue
                msg = pb.ManagerMessage(ack=pb.Ack(seq=session.owed))
            await session.write(msg)

    async def _read(self, link: _Link, session: _Session) -> None:
        while True:
            raw = await session.context.read()
            if raw is grpc.aio.EOF:
                return
            msg = pb.AgentMessage.FromString(raw)  # DecodeError: the stream ends (logged once)
            session.last_seen = time.monotonic()
            if msg.command_acked:
                self._commands_applied(link, msg.command_acked)
            if link.lost_since is not None and link.session is session:
                link.lost_since, link.expired = None, False
                self._stored(f"that agent {link.agent_id} is back", lambda: self._handler().agent_back(link.agent_id))
            kind = msg.WhichOneof("body")
            if kind == "records":
                await self._records(link, session, list(msg.records.records))
                if session.replaced.is_set():
                    return
            elif kind == "command_ack":
                self._commands_applied(link, msg.command_ack.cmd_seq)
            elif kind == "heartbeat":  # answered, so the agent knows the manager is alive
                await session.write(pb.ManagerMessage(ack=pb.Ack(seq=link.applied_seq)))
            elif kind == "gpus":
                self._handler().telemetry(link.agent_id, msg.gpus)
            elif kind == "resources":
                self._handler().telemetry(link.agent_id, msg.resources)
            elif kind == "file_chunk":
                self.files.deliver(link.agent_id, msg.file_chunk)
            elif kind == "bundle_request":  # in the background: records keep flowing meanwhile
                task = asyncio.create_task(self._serve_bundle(session, msg.bundle_request.digest))
                session.tasks.add(task)
                task.add_done_callback(session.tasks.discard)

    async def _records(self, link: _Link, session: _Session, records: list[pb.Record]) -> None:
        fresh = [r for r in records if r.seq > link.applied_seq]
        if fresh:
            what = f"records of agent {link.agent_id}"
            stored = True
            logs = self._log_writes(link.agent_id, fresh)
            if logs:  # on a worker thread; the loop answers other agents meanwhile
                try:
                    await asyncio.to_thread(self.log_files.write, logs)
                except STORAGE_ERRORS as e:
                    self._storage_failed(what, e)
                    stored = False
                if link.session is not session:  # replaced meanwhile: the new stream replays these
                    return
                fresh = [r for r in fresh if r.seq > link.applied_seq]
            if fresh:
                last = max(r.seq for r in fresh)
                stored = stored and self._stored(what, lambda: self._handler().apply_records(
                    link.agent_id, link.boot_id, last, fresh), proof=True)
                if not stored:
                    await asyncio.sleep(_STORAGE_PAUSE)  # unacknowledged: the agent sends them again after a redial
                    session.why = f"the manager cannot store records now ({self.storage_error})"
                    session.replaced.set()
                    return
                link.applied_seq = last
        # a trial's end is acknowledged at once: a one-trial agent (a job platform's) exits once it is,
        # and the job's state follows
        session.ack_soon(link.applied_seq, now=any(r.status.state > pb.TRIAL_STATE_RUNNING for r in fresh))

    @staticmethod
    def _commands_applied(link: _Link, cmd_seq: int) -> None:
        """The agent applied every command up to `cmd_seq`: none of them is sent again."""
        for seq in [s for s in link.pending if s <= cmd_seq]:
            del link.pending[seq]

    def _log_writes(self, agent_id: str, records: list[pb.Record]) -> list[LogWrite]:
        writes = []
        for r in records:
            if not r.HasField("log"):
                continue
            chunk = r.log
            if not safe_id(chunk.trial_id):
                log.warning("log chunk for a bad trial id %r dropped", chunk.trial_id)
                continue
            path = self._handler().log_file(agent_id, chunk.trial_id, chunk.stream)
            if path is not None:
                writes.append((path, chunk.offset, chunk.data))
        return writes

    async def _serve_bundle(self, session: _Session, digest: str) -> None:
        path = bundle.cached(self.experiment_dir / "bundles", digest)
        if path is None:
            await session.write(
                pb.ManagerMessage(
                    bundle_chunk=pb.BundleChunk(digest=digest, last=True, error=f"this manager has no bundle {digest}")
                )
            )
            return
        pieces = bundle.chunks(path)
        while (piece := await asyncio.to_thread(next, pieces, None)) is not None:  # reads off the loop
            offset, data, last = piece
            await session.write(
                pb.ManagerMessage(bundle_chunk=pb.BundleChunk(digest=digest, offset=offset, data=data, last=last))
            )

    # ------------------------------------------------------------------ contact
    def _fleet_interval(self, base: float) -> float:
        """A periodic report's interval for the agents' Welcome: `base`, stretched as the fleet
        grows so that all agents together send at most _FLEET_RATE of that report per second (a
        heartbeat and its answer cost the loop about as much as a record batch: 1,000 agents
        every 2 s were a quarter of a core). Contact loss is noticed later in a big fleet."""
        return max(base, len(self._links) / _FLEET_RATE)

    def _lost(self, link: _Link, since: float) -> None:
        if link.lost_since is None:
            link.lost_since = since
            self._stored(f"that agent {link.agent_id} is lost", lambda: self._handler().agent_lost(link.agent_id, since))

    async def _watch_contact(self) -> None:
        """Silent streams count as lost; lost agents expire after the reconnect window."""
        while True:
            await asyncio.sleep(0.2)
            silence = 3 * self._told_heartbeat + 2.0
            now = time.time()
            for link in list(self._links.values()):
                s = link.session
                if s and link.lost_since is None and time.monotonic() - s.last_seen > silence:
                    self._lost(link, now - (time.monotonic() - s.last_seen))
                if link.lost_since is not None and not link.expired and now - link.lost_since > self.reconnect_window:
                    link.expired = True
                    if link.session:  # end the silent stream
                        link.session.why = f"silent for longer than the reconnect window ({self.reconnect_window:g} s)"
                        link.session.replaced.set()
                        link.session = None
                    self._stored(f"the end of agent {link.agent_id}'s trials",
                                 lambda: self._handler().agent_expired(link.agent_id))  # noqa: B023 (called at once)
