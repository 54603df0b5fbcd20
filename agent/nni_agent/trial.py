"""One trial, from spawn to final status.

Lifecycle: make dirs and parameter.cfg, spawn `/bin/sh -c command` with NNI's environment
(nni-training-service.md §1.1), emit RUNNING, tail its files, and when the main process
is gone kill what is left of its tree, drain the tails and only then emit the one terminal
status, so whoever sees the end has seen every metric and log byte before it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import signal
import time
from pathlib import Path
from typing import Protocol

from nni_agent.compat import wait_for, waitstatus_to_exitcode
from nni_agent.http_channel import HttpChannelServer
from nni_agent.logtail import TrialTail
from nni_agent import mounts, trial_path
from nni_agent.metrics import MetricGate, route_metric
from nni_agent.process import MARKER_ENV, child_reaper, kill_tree, spawn_shell
from nni_agent.study_storage import ENV_ENDPOINT, ENV_TOKEN, REQUESTED, StudyStorageServer
from nni_agent.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 5.0
# A trial killed by a termination signal the agent did not send waits this long for the agent's own
# stop: schedulers that signal a job's whole process tree (Slurm's scancel, a systemd stop) reach the
# trial and the agent at once, and the agent's stop (SYS_CANCELED, "agent received SIGTERM") says why.
SIGNAL_SETTLE_S = 0.5
_TREE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
REASON_LIMIT = 300
_STDERR_TAIL_BYTES = 8192
_EXIT_HINTS = {126: "command not executable", 127: "command not found"}


class TrialEvents(Protocol):
    def status(self, status: pb.TrialStatus) -> None: ...
    def metric(self, trial_id: str, data: str) -> None: ...
    def log(self, trial_id: str, stream: int, offset: int, data: bytes) -> None: ...
    def parameter_request(self, trial_id: str, index: int) -> None: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class Trial:
    def __init__(self, spec: pb.StartTrial, *, events: TrialEvents, work_root: Path,
                 code_dir: Path | None, http_channel: HttpChannelServer | None, agent_key: str,
                 stream_trial_log: bool = False, study_storage: StudyStorageServer | None = None) -> None:
        self.spec = spec
        self.work_root = work_root
        self.stream_trial_log = stream_trial_log  # the manager files LOG_STREAM_TRIAL_LOG (protocol >= 1.2)
        self.trial_id = spec.trial_id
        self.marker = f"{agent_key}/{spec.trial_id}"  # value of MARKER_ENV in every trial process
        self.storage, self._storage_error = _shared_storage(spec)
        self.storage_root = self.storage.root(work_root) if self.storage else None
        if self.storage_root is not None and not spec.working_directory:  # NNI's layout on shared storage
            self.sys_dir = mounts.trial_directory(self.storage_root, spec.experiment_id, spec.trial_id)
        else:
            self.sys_dir = (Path(spec.working_directory) if spec.working_directory
                            else work_root / spec.experiment_id / "trials" / spec.trial_id)
        self.output_dir = (Path(spec.output_directory) if spec.output_directory
                           else self.sys_dir / "nnioutput" if self.storage else self.sys_dir)
        self.cwd = code_dir or (Path(spec.code_directory) if spec.code_directory else self.sys_dir)
        self._events = events
        self._http = http_channel
        # an Optuna study's trial: offered the study's storage (study_storage.py)
        self._study = study_storage if spec.env.get(ENV_ENDPOINT) == REQUESTED else None
        self._study_pruned = False
        self._status = pb.TrialStatus(trial_id=spec.trial_id, working_directory=str(self.sys_dir))
        self._done = asyncio.Event()
        self._started = False
        self._pid: int | None = None
        self._exited = False
        self._stop: tuple[int, str, int] | None = None  # (terminal state, reason, EndCause) once a stop was asked for
        self._kill_task: asyncio.Task[None] | None = None
        self._kill_sent = asyncio.Event()  # the stop's first signal went out
        self._task: asyncio.Task[None] | None = None
        self._http_requests = 0  # request_parameter commands seen on the HTTP channel
        self._http_waiting = 0  # of those, still waiting for send_parameter
        self._gate = MetricGate(self.trial_id, self.sys_dir / "trial.stderr")

    # ------------------------------------------------------------------ public API

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def root_pid(self) -> int | None:
        return self._pid

    def snapshot(self) -> pb.TrialStatus:
        status = pb.TrialStatus()
        status.CopyFrom(self._status)
        return status

    async def wait(self) -> None:
        await self._done.wait()

    async def start(self) -> None:
        """Spawn the trial; any setup error becomes a FAILED status, never an exception."""
        if self._started:  # started already, or canceled before it was started
            return
        self._started = True
        try:
            await self._mount_storage()
            if self._stop is not None:  # cancelled while the storage was mounting: never spawn
                self._finish(*self._stop)
                return
            if self._study is not None:
                await self._study.start()
            pid = self._spawn()
        except (_SetupError, OSError) as e:
            if self._http is not None:
                self._http.unregister(self.trial_id)
            if self._study is not None:
                self._study.unregister(self.trial_id)
            self._finish(pb.TRIAL_STATE_FAILED, str(e) if isinstance(e, _SetupError)
                         else f"cannot start the trial command: {e}", pb.END_CAUSE_START_FAILED)
            return
        exit_status = child_reaper().wait_for(pid)  # same loop step as the spawn: no exit is missed
        self._pid = pid
        self._status.state = pb.TRIAL_STATE_RUNNING
        self._status.pid = pid
        self._status.start_time_ms = _now_ms()
        self._events.status(self.snapshot())
        self._task = asyncio.create_task(self._supervise(exit_status), name=f"trial-{self.trial_id}")

    async def cancel(self, early_stopped: bool, reason: str) -> None:
        """Stop the trial for the manager (idempotent); returns once the kill signal has been sent."""
        state = pb.TRIAL_STATE_EARLY_STOPPED if early_stopped else pb.TRIAL_STATE_USER_CANCELED
        await self.stop(state, reason or ("early stopped" if early_stopped else "canceled"), pb.END_CAUSE_CANCELLED)

    async def stop(self, state: int, reason: str, cause: int = pb.END_CAUSE_AGENT_STOPPED) -> None:
        """Stop the trial, ending it in `state` for `cause` (idempotent); returns once the kill
        signal has been sent."""
        self._request_stop(state, reason, cause)
        if self._kill_task is not None:
            await self._kill_sent.wait()

    def send_parameter(self, index: int, parameter: str) -> None:
        """Write parameter_<index>.cfg atomically; answer a waiting HTTP-channel request too."""
        path = self.sys_dir / ("parameter.cfg" if index == 0 else f"parameter_{index}.cfg")
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(parameter, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as e:
            log.warning("trial %s: cannot write %s: %s", self.trial_id, path, e)
        if self._http is not None and self._http_waiting > 0:
            self._http_waiting -= 1
            self._http.send(self.trial_id, {"type": "parameter", "parameter": parameter})

    # ------------------------------------------------------------------ HTTP channel handler

    def study_end_as(self, state: str) -> None:
        """The study's runner says its Optuna trial was pruned: an exit 0 is EARLY_STOPPED."""
        self._study_pruned = state == "EARLY_STOPPED"

    def on_command(self, command: dict[str, object]) -> None:
        """A command the trial PUT on the HTTP channel (runs on the loop)."""
        if self.done:
            return
        kind, metric = command.get("type"), command.get("metric")
        if kind == "metric" and isinstance(metric, str):
            route_metric(self._events, self.trial_id, metric, self._gate)
        elif kind == "request_parameter":
            index = self._http_requests
            self._http_requests += 1
            if index == 0:
                assert self._http is not None
                self._http.send(self.trial_id, {"type": "parameter", "parameter": self.spec.parameter})
            else:
                self._http_waiting += 1
                self._events.parameter_request(self.trial_id, index)
        else:
            log.warning("trial %s sent an unexpected HTTP channel command: %.200r", self.trial_id, command)

    # ------------------------------------------------------------------ internals

    async def _mount_storage(self) -> None:
        """NNI mounts the shared storage before the trial runs: mount it unless it is already."""
        if self._storage_error:
            raise _SetupError(self._storage_error)
        if self.storage is None or self.storage_root is None:
            return
        loop = asyncio.get_running_loop()
        try:  # mount may take seconds (a slow NFS server): off the loop
            await loop.run_in_executor(None, mounts.ensure_mounted, self.storage, self.storage_root)
        except mounts.MountError as e:
            raise _SetupError(str(e)) from None

    def _spawn(self) -> int:
        dirs = [(self.sys_dir, "trial directory"), (self.sys_dir / ".nni", "trial directory")]
        if self.output_dir != self.sys_dir:
            dirs.append((self.output_dir, "output directory"))
        for directory, what in dirs:
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _SetupError(f"cannot create the {what} {directory}: {e.strerror or e}") from e
        try:
            (self.sys_dir / ".nni" / "metrics").unlink(missing_ok=True)  # a fresh trial has no old metrics
            _write_file(self.sys_dir / "parameter.cfg", self.spec.parameter.encode("utf-8"))
        except OSError as e:
            raise _SetupError(f"cannot prepare the trial directory {self.sys_dir}: {e}") from e
        if not self.cwd.is_dir():
            raise _SetupError(f"the trial code directory {self.cwd} does not exist on this worker")
        env = self._environment()
        if self._http is not None:
            self._http.register(self.trial_id, self)
        return spawn_shell(self.spec.command, cwd=self.cwd, env=env,
                           stdout=self.sys_dir / "trial.stdout", stderr=self.sys_dir / "trial.stderr")

    def _environment(self) -> dict[str, str]:
        spec = self.spec
        env = dict(os.environ)
        env.pop("NNI_TRIAL_COMMAND_CHANNEL", None)
        env.update({
            "NNI_PLATFORM": spec.platform or "local",
            "NNI_EXP_ID": spec.experiment_id,
            "NNI_TRIAL_JOB_ID": spec.trial_id,
            "NNI_SYS_DIR": str(self.sys_dir),
            "NNI_OUTPUT_DIR": str(self.output_dir),
            "NNI_TRIAL_SEQ_ID": str(spec.sequence_id),
            "NNI_CODE_DIR": str(self.cwd),
            "MULTI_PHASE": "true",
        })
        if spec.gpus.scheduled:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpus.indices)
        if self._http is not None:
            # a per-trial secret as the env segment: other local users cannot speak for the trial
            # 144 random bits, as secrets.token_urlsafe(18) gives: `secrets` (hmac, hashlib, libcrypto) costs
            # an idle agent about a megabyte
            env["NNI_TRIAL_COMMAND_CHANNEL"] = self._http.url(base64.urlsafe_b64encode(os.urandom(18)).decode(),
                                                              spec.trial_id)
        env.update(spec.env)
        env.pop(mounts.ENV_KEY, None)  # the storage (and its key) is the agent's, not the trial's
        env.pop(ENV_TOKEN, None)
        if self._study is not None:
            env[ENV_ENDPOINT] = self._study.address
            env[ENV_TOKEN] = self._study.register(self.trial_id, self)
        else:
            env.pop(ENV_ENDPOINT, None)
        env[MARKER_ENV] = self.marker
        pythonpath = trial_path.trial_pythonpath(self.work_root, env.get("PYTHONPATH"))
        if pythonpath:  # the worker's own, plus the trial API: never the agent's path (trial_path)
            env["PYTHONPATH"] = pythonpath
        return env

    def _kill_signal(self) -> int:
        return self.spec.limits.kill_signal or signal.SIGINT  # NNI 3's trial keeper: KeyboardInterrupt first

    def _grace_s(self) -> float:
        return self.spec.limits.grace_period_ms / 1000 if self.spec.limits.grace_period_ms > 0 else DEFAULT_GRACE_S

    def _request_stop(self, state: int, reason: str, cause: int) -> None:
        if self.done or self._exited or self._stop is not None:
            return
        self._stop = (state, reason, cause)
        if not self._started:
            self._started = True
            self._finish(state, reason, cause)
        elif self._pid is not None:
            self._kill_task = asyncio.create_task(
                kill_tree(self._pid, self.marker, self._kill_signal(), self._grace_s(), self._kill_sent))

    async def _supervise(self, exit_status: asyncio.Future[int]) -> None:
        assert self._pid is not None
        exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        trial_log = self.output_dir / "trial.log" if self.stream_trial_log else None
        tail_task = asyncio.create_task(TrialTail(self.sys_dir, self.trial_id, self._events, trial_log,
                                                 self._gate).run(exited))
        state: int
        cause: int
        state, reason, cause = pb.TRIAL_STATE_FAILED, "the agent lost track of the trial", pb.END_CAUSE_LOST
        try:
            max_s = self.spec.limits.max_duration_ms / 1000
            try:
                wait_status = await wait_for(asyncio.shield(exit_status), max_s if max_s > 0 else None)
            except asyncio.TimeoutError:
                self._request_stop(pb.TRIAL_STATE_EARLY_STOPPED,
                                   f"exceeded the maximum trial duration of {max_s:g}s", pb.END_CAUSE_TIME_LIMIT)
                wait_status = await exit_status
            code = waitstatus_to_exitcode(wait_status)
            if self._stop is None and (-code in _TREE_SIGNALS or code - 128 in _TREE_SIGNALS):  # a shell says 128+N
                await asyncio.sleep(SIGNAL_SETTLE_S)
            self._exited = True
            self._status.end_time_ms = _now_ms()
            state, reason, cause = self._outcome(wait_status)
            if self._kill_task is not None:
                await self._kill_task
            # a finished trial leaves nothing behind
            await kill_tree(self._pid, self.marker, self._kill_signal(), self._grace_s())
        finally:
            if not exited.done():
                exited.set_result(None)
            try:
                await tail_task
            except Exception:
                log.exception("trial %s: reading its output failed", self.trial_id)
            if self._http is not None:
                self._http.unregister(self.trial_id)
            if self._study is not None:
                self._study.unregister(self.trial_id)
            self._finish(state, reason, cause)

    def _outcome(self, wait_status: int) -> tuple[int, str, int]:
        code = waitstatus_to_exitcode(wait_status)
        if code >= 0:
            self._status.has_exit_code = True
            self._status.exit_code = code
        else:
            self._status.signal = -code
        if self._stop is not None:
            return self._stop
        if code == 0 and self._study_pruned:
            return pb.TRIAL_STATE_EARLY_STOPPED, "pruned by the study's pruner", pb.END_CAUSE_EXITED
        if code == 0:
            return pb.TRIAL_STATE_SUCCEEDED, "", pb.END_CAUSE_EXITED
        if code < 0:
            return pb.TRIAL_STATE_FAILED, f"killed by signal {_signal_name(-code)}", pb.END_CAUSE_EXITED
        hint = f" ({_EXIT_HINTS[code]})" if code in _EXIT_HINTS else ""
        last = self._last_stderr_line()
        return pb.TRIAL_STATE_FAILED, f"exit code {code}{hint}" + (f": {last}" if last else ""), pb.END_CAUSE_EXITED

    def _last_stderr_line(self) -> str:
        try:
            with open(self.sys_dir / "trial.stderr", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - _STDERR_TAIL_BYTES))
                tail = f.read()
        except OSError:
            return ""
        lines = [ln.strip() for ln in tail.decode("utf-8", errors="replace").splitlines() if ln.strip()]
        if not lines:
            return ""
        last = lines[-1]
        return last if len(last) <= REASON_LIMIT else last[:REASON_LIMIT] + "..."

    def _finish(self, state: int, reason: str, cause: int) -> None:
        if self.done:
            return
        self._status.state = state  # type: ignore[assignment]
        refused = self._gate.summary()
        self._status.reason = f"{reason}; {refused}" if reason and refused else reason or refused
        self._status.end_cause = cause  # type: ignore[assignment]
        if not self._status.end_time_ms:
            self._status.end_time_ms = _now_ms()
        self._events.status(self.snapshot())
        self._done.set()


def _shared_storage(spec: pb.StartTrial) -> tuple[mounts.Storage | None, str]:
    """The experiment's sharedStorage the manager sent in StartTrial's env, or why it is unusable."""
    text = spec.env.get(mounts.ENV_KEY)
    if not text:
        return None, ""
    try:
        return mounts.Storage.from_json(text), ""
    except mounts.MountError as e:
        return None, str(e)


def _write_file(path: Path, data: bytes) -> None:
    """Create or truncate `path` and write `data`: what Path.write_bytes does, without a
    buffered file object (one per trial start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


class _SetupError(Exception):
    """The trial could not be started; the message is the FAILED reason."""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
