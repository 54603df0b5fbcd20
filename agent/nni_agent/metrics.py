"""NNI's metric formats (nni-training-service.md §1.4-1.6) and their routing.

Metric JSON is passed on verbatim: it is what NNI's dispatcher expects. Only
REQUEST_PARAMETER records are intercepted and turned into parameter requests.
"""

from __future__ import annotations

import json
import logging
from typing import Protocol

log = logging.getLogger(__name__)

RECORD_MAGIC = b"ME"
HEADER_SIZE = 8  # b"ME" + 6 decimal digits
METRIC_SIZE_LIMIT = 1_000_000
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
            out.append(payload.decode("utf-8", errors="replace").rstrip("\r\n"))
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
    return line[start:end].decode("utf-8", errors="replace")


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


def route_metric(sink: MetricSink, trial_id: str, data: str) -> None:
    """Send one metric JSON to the sink, turning REQUEST_PARAMETER into a parameter request."""
    try:
        parsed = _parse(data)
    except ValueError:
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
