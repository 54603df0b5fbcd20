"""Tail a trial's output files by polling: trial.stdout, trial.stderr and .nni/metrics.

The trial writes straight into files, so a slow or absent manager never blocks it; the
agent catches up from byte offsets. Polling (adaptive: fast while data flows, slow when
idle) needs no inotify watches, which NNI ran out of on long experiments.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from nni_agent.metrics import MetricFileParser, MetricGate, metric_from_stdout_line, route_metric
from nni_agent.v1 import agent_pb2 as pb

CHUNK_SIZE = 64 * 1024
MAX_READ_PER_POLL = 4 * 1024 * 1024  # per file, so one chatty trial cannot starve the loop
LINE_LIMIT = 1_100_000  # longest partial line kept for marker scanning (NNI metric limit 1,000,000)
FAST_POLL_S = 0.01
SLOW_POLL_S = 0.2
_LINE_END = re.compile(rb"[\r\n]")


class TailEvents(Protocol):
    def metric(self, trial_id: str, data: str) -> None: ...
    def log(self, trial_id: str, stream: int, offset: int, data: bytes) -> None: ...
    def parameter_request(self, trial_id: str, index: int) -> None: ...


class FileTail:
    """Reads whatever was appended to one file since the last poll; the file may appear late."""

    def __init__(self, path: Path, on_data: Callable[[int, bytes], None]) -> None:
        self.path = path
        self.offset = 0
        self._on_data = on_data
        self._file: BinaryIO | None = None

    def poll(self) -> int:
        """Deliver new bytes in chunks of at most CHUNK_SIZE; returns how many were read."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except FileNotFoundError:
                return 0
        total = 0
        while total < MAX_READ_PER_POLL:
            data = self._file.read(CHUNK_SIZE)
            if not data:
                break
            self._on_data(self.offset, data)
            self.offset += len(data)
            total += len(data)
        return total

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class MarkerScanner:
    """Finds `NNISDK_MEb'...'` lines in a byte stream split on \\n and \\r, with bounded memory.

    A partial line longer than LINE_LIMIT cannot be a valid metric; it is dropped up to
    its line end instead of being buffered.
    """

    def __init__(self, on_metric: Callable[[str], None]) -> None:
        self._on_metric = on_metric
        self._line = bytearray()
        self._overflow = False

    def feed(self, data: bytes) -> None:
        start = 0
        for match in _LINE_END.finditer(data):
            self._end_line(data[start:match.start()])
            start = match.end()
        rest = data[start:]
        if self._overflow:
            return
        if len(self._line) + len(rest) > LINE_LIMIT:
            self._line.clear()
            self._overflow = True
        else:
            self._line += rest

    def finish(self) -> None:
        """End of stream: the last line may lack its line end."""
        self._end_line(b"")

    def _end_line(self, tail: bytes) -> None:
        if not self._overflow:
            metric = metric_from_stdout_line(bytes(self._line) + tail if self._line else tail)
            if metric is not None:
                self._on_metric(metric)
        self._line.clear()
        self._overflow = False


class TrialTail:
    """All tails of one trial; `run` polls until `exited` is set, then drains to EOF."""

    def __init__(self, sys_dir: Path, trial_id: str, events: TailEvents, trial_log: Path | None = None,
                 gate: MetricGate | None = None) -> None:
        self._trial_id = trial_id
        self._events = events
        self._gate = gate
        self._metric_parser = MetricFileParser()
        self._scanner = MarkerScanner(self._metric)
        self._tails = [
            FileTail(sys_dir / "trial.stdout", self._stdout),
            FileTail(sys_dir / "trial.stderr", self._stderr),
            FileTail(sys_dir / ".nni" / "metrics", self._metric_file),
        ]
        if trial_log is not None:  # NNI's SDK log: streamed like stdout, for `nni-manager logs` anywhere
            self._tails.append(FileTail(trial_log, self._trial_log))

    async def run(self, exited: asyncio.Future[None]) -> None:
        """Poll until `exited` is done, then drain to EOF.

        Between polls it waits on one future that either a timer or `exited` resolves: no
        task per poll and no cancellation at each timeout (asyncio.wait_for), which at 64
        trials was a good part of the agent's loop."""
        loop = asyncio.get_running_loop()
        sleeper: list[asyncio.Future[None]] = []

        def wake(_: object = None) -> None:
            if sleeper and not sleeper[0].done():
                sleeper[0].set_result(None)

        exited.add_done_callback(wake)
        interval = FAST_POLL_S
        try:
            while not exited.done():
                if self._poll_all():
                    interval = FAST_POLL_S
                else:
                    interval = min(interval * 2, SLOW_POLL_S)
                sleeper[:] = [loop.create_future()]
                timer = loop.call_later(interval, wake)
                try:
                    await sleeper[0]
                finally:
                    timer.cancel()
            while self._poll_all():
                await asyncio.sleep(0)
            self._scanner.finish()
        finally:
            exited.remove_done_callback(wake)
            for tail in self._tails:
                tail.close()

    def _poll_all(self) -> bool:
        return sum(tail.poll() for tail in self._tails) > 0

    def _metric(self, data: str) -> None:
        route_metric(self._events, self._trial_id, data, self._gate)

    def _stdout(self, offset: int, data: bytes) -> None:
        self._events.log(self._trial_id, pb.LOG_STREAM_STDOUT, offset, data)
        self._scanner.feed(data)

    def _stderr(self, offset: int, data: bytes) -> None:
        self._events.log(self._trial_id, pb.LOG_STREAM_STDERR, offset, data)

    def _trial_log(self, offset: int, data: bytes) -> None:
        self._events.log(self._trial_id, pb.LOG_STREAM_TRIAL_LOG, offset, data)

    def _metric_file(self, offset: int, data: bytes) -> None:
        for metric in self._metric_parser.feed(data):
            self._metric(metric)
