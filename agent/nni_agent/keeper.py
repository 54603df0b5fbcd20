"""The trial keeper: applies manager commands to trials and turns trial events into records.

Commands are idempotent (keyed by trial id) because the manager re-sends any it has no
acknowledgement for after a reconnect. Every event a trial emits becomes one sequenced
Record in the outbox, which is what makes delivery exactly-once end to end.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path

from typing import TYPE_CHECKING

from nni_agent.bundles import BundleCache, BundleError
from nni_agent.outbox import Outbox
from nni_agent.v1 import agent_pb2 as pb
from nni_agent.wire import metric_record

if TYPE_CHECKING:  # the trial runtime loads with the first trial: an idle agent stays small
    from nni_agent.http_channel import HttpChannelServer
    from nni_agent.study_storage import StudyStorageServer
    from nni_agent.resources import TreeSampler
    from nni_agent.trial import Trial

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Keeper:
    """Owns every trial of this agent; implements the `TrialEvents` sink."""

    def __init__(
        self,
        *,
        outbox: Outbox,
        work_dir: Path,
        bundles: BundleCache,
        agent_key: str,
        request_bundle: Callable[[str], None],
        http_channel: HttpChannelServer | None = None,
        study_storage: StudyStorageServer | None = None,
    ) -> None:
        self.outbox = outbox
        self.work_dir = work_dir
        self.bundles = bundles
        self.agent_key = agent_key
        self.request_bundle = request_bundle
        self.http_channel = http_channel
        self.study_storage = study_storage
        self.stream_trial_log = False  # set from the manager's Welcome: it understands LOG_STREAM_TRIAL_LOG
        self.trials: dict[str, Trial] = {}
        self._final: dict[str, pb.TrialStatus] = {}  # trials that ended before they could start
        self._trial_seq: dict[str, int] = {}
        self._samplers: dict[str, TreeSampler] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._first_end: asyncio.Future[pb.TrialStatus] | None = None

    # ------------------------------------------------------------------ events -> records

    def _emit(self, **body: object) -> None:
        seq = self.outbox.next_seq()
        self.outbox.append(seq, pb.Record(seq=seq, **body).SerializeToString())  # type: ignore[arg-type]

    def status(self, status: pb.TrialStatus) -> None:
        self._emit(status=status)
        if status.state != pb.TRIAL_STATE_RUNNING:
            self._samplers.pop(status.trial_id, None)
            first = self._first_end_future()
            if not first.done():
                first.set_result(status)

    def _first_end_future(self) -> asyncio.Future[pb.TrialStatus]:
        if self._first_end is None:
            self._first_end = asyncio.get_running_loop().create_future()
        return self._first_end

    async def first_end(self) -> pb.TrialStatus:
        """The terminal status of the first trial that ends (its record is in the outbox)."""
        return await self._first_end_future()

    def metric(self, trial_id: str, data: str) -> None:
        n = self._trial_seq.get(trial_id, 0) + 1
        self._trial_seq[trial_id] = n
        seq = self.outbox.next_seq()
        self.outbox.append(seq, metric_record(seq, trial_id, n, data, _now_ms()))

    def log(self, trial_id: str, stream: int, offset: int, data: bytes) -> None:
        self._emit(log=pb.LogChunk(trial_id=trial_id, stream=stream, offset=offset, data=data))  # type: ignore[arg-type]

    def parameter_request(self, trial_id: str, index: int) -> None:
        self._emit(parameter_request=pb.ParameterRequest(trial_id=trial_id, parameter_index=index))

    # ------------------------------------------------------------------ commands

    def handle(self, cmd: pb.Command) -> None:
        """Apply one command; never raises (a bad command fails its trial, not the agent)."""
        kind = cmd.WhichOneof("body")
        try:
            if kind == "start_trial":
                self._start(cmd.start_trial)
            elif kind == "send_parameter":
                self._send_parameter(cmd.send_parameter)
            elif kind == "cancel_trial":
                self._cancel(cmd.cancel_trial)
            else:
                log.warning("ignoring command %s from the manager", kind or "with no body")
        except Exception:  # a malformed message must not take the agent down
            log.exception("command %s failed", kind)

    def _start(self, spec: pb.StartTrial) -> None:
        tid = spec.trial_id
        if tid in self.trials or tid in self._final:
            return  # replayed command
        problem = self._invalid(spec)
        if problem:
            self._fail_unstarted(tid, problem)
            return
        self._spawn(self._start_trial(spec))

    @staticmethod
    def _invalid(spec: pb.StartTrial) -> str:
        if not spec.trial_id or "/" in spec.trial_id or spec.trial_id in (".", ".."):
            return f"invalid trial id {spec.trial_id!r}"
        if not spec.command.strip():
            return "the trial command is empty: set trialCommand in the experiment config"
        return ""

    def _fail_unstarted(self, trial_id: str, reason: str, state: int = pb.TRIAL_STATE_FAILED,
                        cause: int = pb.END_CAUSE_START_FAILED) -> None:
        if not trial_id:
            log.error("rejected a StartTrial without a trial id: %s", reason)
            return
        now = _now_ms()
        status = pb.TrialStatus(trial_id=trial_id, state=state, start_time_ms=now, end_time_ms=now,  # type: ignore[arg-type]
                                reason=reason, end_cause=cause)  # type: ignore[arg-type]
        self._final[trial_id] = status
        self.status(status)

    async def _start_trial(self, spec: pb.StartTrial) -> None:
        code_dir: Path | None = None
        if spec.HasField("bundle") and spec.bundle.digest:
            self._final[spec.trial_id] = pb.TrialStatus(trial_id=spec.trial_id)  # placeholder: "known"
            try:
                code_dir = await self.bundles.get(spec.bundle.digest, self.request_bundle)
            except BundleError as exc:
                del self._final[spec.trial_id]
                self._fail_unstarted(spec.trial_id, str(exc))
                return
            placeholder = self._final.pop(spec.trial_id)
            if placeholder.state != pb.TRIAL_STATE_UNSPECIFIED:  # cancelled while downloading
                self._final[spec.trial_id] = placeholder
                return
        elif spec.code_directory:
            code_dir = Path(spec.code_directory)
        from nni_agent.resources import TreeSampler
        from nni_agent.trial import Trial

        trial = Trial(
            spec,
            events=self,
            work_root=self.work_dir,
            code_dir=code_dir,
            http_channel=self.http_channel,
            study_storage=self.study_storage,
            agent_key=self.agent_key,
            stream_trial_log=self.stream_trial_log,
        )
        self.trials[spec.trial_id] = trial
        await trial.start()
        pid = trial.root_pid()
        if pid is not None and not trial.done:
            self._samplers[spec.trial_id] = TreeSampler(pid, f"{self.agent_key}/{spec.trial_id}")

    def _send_parameter(self, cmd: pb.SendParameter) -> None:
        trial = self.trials.get(cmd.trial_id)
        if trial is None:
            log.warning("parameter for unknown trial %s ignored", cmd.trial_id)
            return
        trial.send_parameter(cmd.index, cmd.parameter)

    def _cancel(self, cmd: pb.CancelTrial) -> None:
        trial = self.trials.get(cmd.trial_id)
        state = pb.TRIAL_STATE_EARLY_STOPPED if cmd.early_stopped else pb.TRIAL_STATE_USER_CANCELED
        if trial is not None:
            self._spawn(trial.cancel(cmd.early_stopped, cmd.reason))
            return
        pending = self._final.get(cmd.trial_id)
        if pending is not None and pending.state == pb.TRIAL_STATE_UNSPECIFIED:  # still fetching its code
            del self._final[cmd.trial_id]
            self._fail_unstarted(cmd.trial_id, cmd.reason or "cancelled before it started", state, pb.END_CAUSE_CANCELLED)
        elif pending is None:
            self._fail_unstarted(cmd.trial_id, cmd.reason or "cancelled; it was not running on this agent", state,
                                 pb.END_CAUSE_CANCELLED)

    # ------------------------------------------------------------------ state

    def snapshot(self) -> list[pb.TrialStatus]:
        """Live trials, for Hello: lets a restarted manager re-attach them."""
        return [t.snapshot() for t in self.trials.values() if not t.done]

    def resources(self) -> pb.ResourceReport:
        report = pb.ResourceReport(time_ms=_now_ms())
        for tid, sampler in list(self._samplers.items()):
            try:
                report.trials.append(sampler.sample())
            except Exception:  # the tree vanished between exit and status: skip it
                self._samplers.pop(tid, None)
        return report

    @property
    def running(self) -> int:
        return sum(1 for t in self.trials.values() if not t.done)

    async def shutdown(self, reason: str, state: int = pb.TRIAL_STATE_USER_CANCELED,
                       cause: int = pb.END_CAUSE_CANCELLED) -> None:
        """Stop every trial (ending in `state` for `cause`, with `reason`) and wait for their final records."""
        for trial in list(self.trials.values()):
            if not trial.done:
                self._spawn(trial.stop(state, reason, cause))
        await asyncio.gather(*(t.wait() for t in self.trials.values()), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
