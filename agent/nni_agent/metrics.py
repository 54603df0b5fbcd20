"""NNI's metric formats (nni-training-service.md §1.4-1.6) and their routing.

Metric JSON is passed on verbatim: it is what NNI's dispatcher expects. Only
REQUEST_PARAMETER records are intercepted and turned into parameter requests.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Protocol

from nni_agent.metric_check import MetricBudget, metric_problem

log = logging.getLogger(__name__)

RECORD_MAGIC = b"ME"
HEADER_SIZE = 8  # b"ME" + 6 decimal digits
STDOUT_MARKER = b"NNISDK_MEb'"


class MetricSink(Protocol):
    def metric(self, trial_id: str, data: str) -> None: ...
    def parameter_request(self, trial_id: str, index: int) -> None: ...


class MetricFileParser:
    """Incremental parser of `.nni/metrics` (b"ME" + %06d length + payload incl. its newline).

    Reads may end inside a record; the remainder waits for the next feed.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        out: list[str] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= HEADER_SIZE:
            header = bytes(buf[pos:pos + HEADER_SIZE])
            if not (header.startswith(RECORD_MAGIC) and header[2:].isdigit()):
                resync = buf.find(RECORD_MAGIC, pos + 1)
                log.warning("skipping corrupt bytes in the metrics file at record offset %d", pos)
                pos = len(buf) if resync < 0 else resync
                continue
            end = pos + HEADER_SIZE + int(header[2:])
            if end > len(buf):
                break
            payload = bytes(buf[pos + HEADER_SIZE:end])
            pos = end
            # invalid UTF-8 stays visible (as lone surrogates) for the gate to refuse, not silently replaced
            out.append(payload.decode("utf-8", errors="surrogateescape").rstrip("\r\n"))
        del buf[:pos]
        return out


def metric_from_stdout_line(line: bytes) -> str | None:
    """The metric JSON of a `NNISDK_MEb'<json>'` line, or None.

    The JSON ends at the LAST `'` of the line (NNI's lazy regex stops at the first one,
    which breaks on a `'` inside the JSON).
    """
    start = line.find(STDOUT_MARKER)
    if start < 0:
        return None
    start += len(STDOUT_MARKER)
    end = line.rfind(b"'")
    if end < start:
        return None
    return line[start:end].decode("utf-8", errors="surrogateescape")


# The C scanner json.loads ends in, without its Python frames (set in JSONDecoder.__init__; typeshed omits it)
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _parse(data: str) -> object:
    """json.loads(data), 2x faster for what metrics are (an object, no surrounding blanks):
    every metric passes here, and a trial may report tens of thousands a second."""
    if data[:1] == "{" and data[-1:] == "}":
        try:
            obj, end = _scan(data, 0)
        except (StopIteration, ValueError, RecursionError):
            pass
        else:
            if end == len(data):
                return obj
    return json.loads(data)


LOGGED_REFUSALS = 20  # lines in the trial's log; refusals after these are only counted


class MetricGate:
    """One trial's metric check: content (metric_check.metric_problem) and budget. A refusal is
    one line in the trial's stderr (which the agent streams as the trial's log), then counted;
    `summary` goes into the trial's final message."""

    def __init__(self, trial_id: str, log_path: "os.PathLike[str] | str") -> None:
        self.trial_id = trial_id
        self.log_path = log_path
        self.budget = MetricBudget()
        self.refused = 0
        self.first = ""

    def admit(self, data: str) -> bool:
        problem = self.budget.take(len(data)) or metric_problem(data)  # a flood costs no content check
        if not problem:
            return True
        self.refused += 1
        if not self.first:
            self.first = problem
        if self.refused <= LOGGED_REFUSALS:
            more = "; further refusals are counted, not logged" if self.refused == LOGGED_REFUSALS else ""
            self._line(f"nni-agent: metric refused, not stored: {problem}{more}")
        return False

    def summary(self) -> str:
        """"" or what the trial's message says about refused metrics."""
        if not self.refused:
            return ""
        s = "" if self.refused == 1 else "s"
        return f"{self.refused:,} metric{s} refused (first: {self.first}); see the trial's log"

    def _line(self, text: str) -> None:
        log.warning("trial %s: %s", self.trial_id, text)
        try:  # O_APPEND, as the trial's own stderr: whole lines, never over the trial's bytes
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                os.write(fd, (text + "\n").encode("utf-8", errors="replace"))
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("trial %s: cannot write to %s: %s", self.trial_id, self.log_path, e)


def route_metric(sink: MetricSink, trial_id: str, data: str, gate: MetricGate | None = None) -> None:
    """Send one metric JSON to the sink, turning REQUEST_PARAMETER into a parameter request;
    `gate` refuses what must not be taken (checked before parsing: a deep value must not recurse)."""
    if gate is not None and not gate.admit(data):
        return
    try:
        parsed = _parse(data)
    except (ValueError, RecursionError):
        log.warning("trial %s reported a metric that is not JSON, dropped: %.200r", trial_id, data)
        return
    if not isinstance(parsed, dict):
        log.warning("trial %s reported a metric that is not a JSON object, dropped: %.200r", trial_id, data)
        return
    if parsed.get("type") == "REQUEST_PARAMETER":
        index = parsed.get("parameter_index")
        if not isinstance(index, int):
            log.warning("trial %s sent REQUEST_PARAMETER without an integer parameter_index", trial_id)
            return
        sink.parameter_request(trial_id, index)
        return
    sink.metric(trial_id, data)
