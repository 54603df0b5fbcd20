"""NNI's own dispatcher process, driven over NNI 3's WebSocket tuner command channel.

Started exactly as NNI 3's manager starts it (ts/nni_manager/core/nnimanager.ts `setupTuner`,
common/utils.ts `getMsgDispatcherCommand`): `python -m nni --exp_params <base64 of the
experiment config without searchSpace>`, with `SDK_PROCESS=dispatcher`, `NNI_MODE`,
`NNI_CHECKPOINT_DIRECTORY`, `NNI_LOG_DIRECTORY`, `NNI_LOG_LEVEL`,
`NNI_INCLUDE_INTERMEDIATE_RESULTS` and `NNI_TUNER_COMMAND_CHANNEL=ws://127.0.0.1:<port>/tuner/<secret>`.
The channel (core/tuner_command_channel.ts) is one WebSocket on which every text frame is a
JSON command `{"type": <2 letters>, "content": <string>}`; `_nop_` frames are ignored and
`_bye_` closes. Any of NNI's tuners, assessors and advisors, built in or customised, run
unmodified this way.

Security: any local user can find the port in /proc/net/tcp, and whoever holds the channel
gets the search space and has its NEW_TRIAL and KILL_TRIAL obeyed. So the URL's path carries
an unguessable secret (NNI's client connects to the URL exactly as given), any other path is
refused, and so is every connection after the first. The URL travels in the dispatcher's
environment, never its argv: /proc/<pid>/environ is readable by its own user (and root) only.
NNI's client writes the URL to dispatcher.log at debug level only (`logLevel: debug`).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nni_manager.types import SearchSpace
from nni_manager.dispatcher.base import Dispatcher, DispatcherError, DispatcherEvents
from nni_manager.dispatcher.tuners import ImportedTrial

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0  # NNI waits 10 s; importing nni and a tuner's libraries takes longer on a busy host
INITIALIZE_TIMEOUT_S = 120.0  # handle_initialize may build models (SMAC, GP) from the search space
TERMINATE_WAIT_S = 30.0  # NNI's manager waits up to 30 s for the dispatcher to exit after TERMINATE
UNTOLD_WAIT_S = 5.0  # after SIGTERM, for a dispatcher stopped before it connected
PING_INTERVAL_S = 1.0
# NNI's MsgDispatcher notices a crashed command worker only when the next command arrives;
# a PING (a no-op for every algorithm) is that next command, so a crash is seen within a second.


class NniDispatcher(Dispatcher):
    """`python -m nni` as a child process plus the server end of its command channel."""

    settle_s = 1.0

    def __init__(self, name: str, optimize_mode: str, exp_params: dict[str, Any], *, log_dir: Path,
                 checkpoint_dir: Path, log_level: str = "info", include_intermediate_results: bool = False,
                 resume: bool = False, tuner_gpu_indices: list[int] | None = None, cwd: Path | None = None) -> None:
        super().__init__(name, optimize_mode)
        self.exp_params = exp_params
        self.log_dir = log_dir
        self.checkpoint_dir = checkpoint_dir
        self.log_level = log_level
        self.include_intermediate_results = include_intermediate_results
        self.resume = resume
        self.tuner_gpu_indices = tuner_gpu_indices
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._events: DispatcherEvents | None = None
        self._ws: web.WebSocketResponse | None = None
        self._runner: web.AppRunner | None = None
        self._secret = secrets.token_urlsafe(32)  # the channel's URL path: only our child knows it
        self._claimed = False  # set before the first connection's handshake: a second is refused
        self._connected = asyncio.Event()
        self._initialized = asyncio.Event()
        self._closed = asyncio.Event()
        self._terminating = False
        self._outbox: asyncio.Queue[dict[str, str] | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    # -- commands -------------------------------------------------------------------------

    def request_trials(self, count: int) -> None:
        if count > 0:
            self._send("GE", str(count))

    def report_metric(self, metric_json: str) -> None:
        self._send("ME", metric_json)

    def trial_end(self, trial_id: str, event: str, hyper_params: str) -> None:
        self._send("EN", json.dumps({"trial_job_id": trial_id, "event": event, "hyper_params": hyper_params}))

    def update_search_space(self, search_space: SearchSpace) -> None:
        self._send("SS", json.dumps(search_space))

    def _send(self, kind: str, content: str) -> None:
        if self.error is None and not self._terminating:
            self.touch()
            self._outbox.put_nowait({"type": kind, "content": content})

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, events: DispatcherEvents, search_space: SearchSpace,
                    history: list[ImportedTrial]) -> None:
        from aiohttp import web

        self._events = events
        app = web.Application()
        app.router.add_get("/tuner/{secret}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # loopback only: the dispatcher is our own child process
        port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        self._spawn(f"ws://127.0.0.1:{port}/tuner/{self._secret}")
        self._tasks.append(asyncio.create_task(self._watch_process()))
        await self._wait_for(self._connected, CONNECT_TIMEOUT_S, "connect to the manager")
        self._send("IN", json.dumps(search_space))
        await self._wait_for(self._initialized, INITIALIZE_TIMEOUT_S, "initialize with the search space")
        if history:  # NNI sends IMPORT_DATA right after INITIALIZED (nnimanager.ts onTunerCommand)
            self._send("FD", json.dumps(history))
        self._tasks.append(asyncio.create_task(self._ping()))

    def _spawn(self, url: str) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        params = base64.b64encode(json.dumps(self.exp_params).encode()).decode()
        env = dict(os.environ)
        env.update({
            "SDK_PROCESS": "dispatcher",
            "NNI_MODE": "resume" if self.resume else "start",
            "NNI_CHECKPOINT_DIRECTORY": str(self.checkpoint_dir),
            "NNI_LOG_DIRECTORY": str(self.log_dir),
            "NNI_LOG_LEVEL": self.log_level,
            "NNI_INCLUDE_INTERMEDIATE_RESULTS": "true" if self.include_intermediate_results else "false",
            "NNI_TUNER_COMMAND_CHANNEL": url,
        })
        # the channel is on loopback: never through HTTPS_PROXY (websockets honours it, NO_PROXY too)
        no_proxy = ",".join(filter(None, (env.get("no_proxy") or env.get("NO_PROXY"), "127.0.0.1")))
        env["no_proxy"] = env["NO_PROXY"] = no_proxy
        if self.tuner_gpu_indices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.tuner_gpu_indices))
        with open(self.log_dir / "dispatcher.stdout", "ab") as out, open(self.log_dir / "dispatcher.stderr", "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "nni", "--exp_params", params],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         cwd=str(self.cwd or self.log_dir), env=env, start_new_session=True)
        log.info("started NNI dispatcher (pid %d) for %s", self.proc.pid, self.name)

    async def _wait_for(self, event: asyncio.Event, timeout: float, what: str) -> None:
        waiter = asyncio.ensure_future(event.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait([waiter, closed], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            closed.cancel()
        if self.error is not None:
            raise DispatcherError(self.error)
        if not event.is_set():
            self._fail(f"did not {what} within {timeout:g} s")
            raise DispatcherError(self.error or "")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import WSMsgType, web

        if not hmac.compare_digest(request.match_info["secret"].encode(), self._secret.encode()):
            log.warning("refused a tuner channel connection on a wrong URL (not our dispatcher)")
            return web.Response(status=404, text="Not Found")
        if self._claimed:  # one dispatcher per experiment, as in NNI
            log.warning("refused a second tuner channel connection")
            return web.Response(status=409, text="a dispatcher is already connected")
        self._claimed = True
        ws = web.WebSocketResponse(heartbeat=5.0, max_msg_size=0)
        await ws.prepare(request)
        self._ws = ws
        self._connected.set()
        sender = asyncio.create_task(self._sender(ws))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    if self._receive(msg.data):
                        break
                elif msg.type == WSMsgType.ERROR:
                    break
        finally:
            sender.cancel()
            if not self._terminating:
                self._fail_later("closed its command channel")
            self._closed.set()
        return ws

    async def _sender(self, ws: web.WebSocketResponse) -> None:
        while True:
            command = await self._outbox.get()
            if command is None:
                return
            await ws.send_str(json.dumps(command))

    def _receive(self, text: str) -> bool:
        """Handle one command from the dispatcher; True when the channel is done."""
        try:
            command = json.loads(text)
            kind, content = command["type"], command.get("content") or ""
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable tuner command: %.200s", text)
            return False
        self.touch()
        log.debug("dispatcher -> manager: %s %.500s", kind, content)
        events = self._events
        assert events is not None
        if kind == "_nop_":
            return False
        if kind == "_bye_":
            return True
        if kind == "ID":
            self._initialized.set()
        elif kind == "TR":
            events.new_trial(content)
        elif kind == "NO":
            events.no_more_trials()
        elif kind == "KI":
            events.kill_trial(json.loads(content))
        elif kind == "SP":
            log.warning("ignoring SEND_TRIAL_JOB_PARAMETER: multi-phase parameters come from NEW_TRIAL_JOB here")
        elif kind == "ER":
            self._fail("reported an error:\n" + content.strip())
            return True
        else:
            log.warning("unknown tuner command %r", kind)
        return False

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(PING_INTERVAL_S)
            if not self._terminating and self.error is None:
                self._outbox.put_nowait({"type": "PI", "content": ""})

    async def _watch_process(self) -> None:
        assert self.proc is not None
        while self.proc.poll() is None:
            await asyncio.sleep(0.1)
        if not self._terminating:
            await asyncio.sleep(0.2)  # an ER command in flight says more than the exit code
            self._fail(f"exited with code {self.proc.returncode}")
        self._closed.set()

    def _fail_later(self, what: str) -> None:
        """The channel closed: the process is probably exiting; let its exit (code, log) speak."""
        async def later() -> None:
            await asyncio.sleep(1.0)
            self._fail(what)

        self._tasks.append(asyncio.create_task(later()))

    def _fail(self, what: str) -> None:
        if self.error is not None or self._terminating:
            return
        detail = self._log_tail()
        self.error = (f"the NNI dispatcher for {self.name} {what}" + (f"; its log ends:\n{detail}" if detail else "")
                      + f"\n(logs: {self.log_dir / 'dispatcher.log'}, {self.log_dir / 'dispatcher.stderr'})")
        log.error("%s", self.error)
        self._closed.set()

    def _log_tail(self, lines: int = 15) -> str:
        """The last lines that say what went wrong: stderr (a traceback at start), else the log."""
        for name in ("dispatcher.stderr", "dispatcher.log"):
            try:
                text = (self.log_dir / name).read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                return "\n".join(text.splitlines()[-lines:])
        return ""

    async def stop(self) -> None:
        """TERMINATE, wait for the process (30 s, as NNI), then kill it and close the server. A
        dispatcher that never connected (stopped during start-up: Ctrl-C while NNI imports its
        tuner) cannot be told: it gets SIGTERM at once, not 30 s of waiting for an exit nobody asked for."""
        told = self._ws is not None and not self._ws.closed and self.error is None and not self._terminating
        if told:
            self._outbox.put_nowait({"type": "TE", "content": ""})
        self._terminating = True
        self._outbox.put_nowait(None)
        if self.proc is not None:
            wait = TERMINATE_WAIT_S if told else UNTOLD_WAIT_S if self.error is None else 2.0
            if not told and self.error is None and self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + wait
            while self.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await asyncio.to_thread(self.proc.wait)
        for task in self._tasks:
            task.cancel()
        if self._ws is not None and not self._ws.closed:
            with contextlib.suppress(Exception):
                await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
